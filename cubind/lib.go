package cubind

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/ebitengine/purego"
)

// LibDirEnv names the environment variable whose folders (colon-separated) are searched
// first for every library.
const LibDirEnv = "LOOM_CUDA_LIB_DIR"

// Library is an opened shared library.
type Library struct {
	Name   string // what was asked for, such as "libnvrtc"
	Path   string // what was opened: a full path, or a bare file name the system loader found
	handle uintptr
}

// LoadError says that a library could not be opened; Tried lists each path attempted with
// the reason it failed.
type LoadError struct {
	Library string
	Tried   []string
}

func (e *LoadError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cubind: cannot load %s (set %s to the folder that holds it); tried:", e.Library, LibDirEnv)
	for _, t := range e.Tried {
		b.WriteString("\n  ")
		b.WriteString(t)
	}
	return b.String()
}

// targetDir is the CUDA toolkit's per-architecture library folder name.
func targetDir() string {
	if runtime.GOARCH == "arm64" {
		return "sbsa-linux"
	}
	return "x86_64-linux"
}

// envDirs returns the folders of LOOM_CUDA_LIB_DIR.
func envDirs() []string {
	var dirs []string
	for _, d := range filepath.SplitList(os.Getenv(LibDirEnv)) {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// systemLibDirs are the distribution's library folders.
func systemLibDirs() []string {
	multi := "/usr/lib/x86_64-linux-gnu"
	if runtime.GOARCH == "arm64" {
		multi = "/usr/lib/aarch64-linux-gnu"
	}
	return []string{multi, "/usr/lib64", "/usr/lib"}
}

// toolkitDirs are the places a CUDA toolkit (NVRTC, cuBLAS) usually lives, newest first.
func toolkitDirs() []string {
	var dirs []string
	for _, env := range []string{"CUDA_HOME", "CUDA_PATH"} {
		if root := os.Getenv(env); root != "" {
			dirs = append(dirs, filepath.Join(root, "targets", targetDir(), "lib"), filepath.Join(root, "lib64"))
		}
	}
	dirs = append(dirs, "/usr/local/cuda/targets/"+targetDir()+"/lib", "/usr/local/cuda/lib64")
	versioned, _ := filepath.Glob("/usr/local/cuda-*")
	slices.SortFunc(versioned, func(a, b string) int { return compareVersions(b, a) })
	for _, root := range versioned {
		dirs = append(dirs, filepath.Join(root, "targets", targetDir(), "lib"), filepath.Join(root, "lib64"))
	}
	return append(dirs, systemLibDirs()...)
}

// compareVersions orders paths such as /usr/local/cuda-12.8 and /usr/local/cuda-13.0 by
// their numeric version suffix.
func compareVersions(a, b string) int {
	va, vb := versionParts(a), versionParts(b)
	for i := 0; i < len(va) && i < len(vb); i++ {
		if va[i] != vb[i] {
			return va[i] - vb[i]
		}
	}
	return len(va) - len(vb)
}

func versionParts(p string) []int {
	_, v, _ := strings.Cut(filepath.Base(p), "-")
	var parts []int
	for _, s := range strings.Split(v, ".") {
		n := 0
		for _, c := range s {
			if c < '0' || c > '9' {
				break
			}
			n = n*10 + int(c-'0')
		}
		parts = append(parts, n)
	}
	return parts
}

// openLibrary opens the first of names found in LOOM_CUDA_LIB_DIR, then (when system is
// set) through the system loader's search by bare name, then in dirs.
func openLibrary(what string, names []string, system bool, dirs []string) (*Library, error) {
	var tried []string
	seen := map[string]bool{}
	tryPath := func(path string) *Library {
		if seen[path] {
			return nil
		}
		seen[path] = true
		if filepath.IsAbs(path) {
			if _, err := os.Stat(path); err != nil {
				tried = append(tried, path+": not found")
				return nil
			}
		}
		h, err := dlopen(path)
		if err != nil {
			where := path
			if !filepath.IsAbs(path) {
				where = path + " (system loader search)"
			}
			tried = append(tried, where+": "+err.Error())
			return nil
		}
		return &Library{Name: what, Path: path, handle: h}
	}
	tryDirs := func(dirs []string) *Library {
		for _, d := range dirs {
			for _, n := range names {
				if l := tryPath(filepath.Join(d, n)); l != nil {
					return l
				}
			}
		}
		return nil
	}
	if l := tryDirs(envDirs()); l != nil {
		return l, nil
	}
	if system {
		for _, n := range names {
			if l := tryPath(n); l != nil {
				return l, nil
			}
		}
	}
	if l := tryDirs(dirs); l != nil {
		return l, nil
	}
	return nil, &LoadError{Library: what, Tried: tried}
}

// binder registers Go function variables for a library's symbols, collecting the names of
// missing ones.
type binder struct {
	lib     *Library
	missing []string
}

// bind sets *fptr to call the first of names the library exports (a newer version first,
// then older ones); when it exports none, names[0] is recorded as missing, not fatal.
func (b *binder) bind(fptr any, names ...string) {
	if !b.optional(fptr, names...) {
		b.missing = append(b.missing, names[0])
	}
}

// optional binds the first of names that the library exports and reports whether one was.
func (b *binder) optional(fptr any, names ...string) bool {
	for _, name := range names {
		sym, err := dlsym(b.lib.handle, name)
		if err != nil || sym == 0 {
			continue
		}
		purego.RegisterFunc(fptr, sym)
		return true
	}
	return false
}

// err reports the missing symbols, if any.
func (b *binder) err() error {
	if len(b.missing) == 0 {
		return nil
	}
	return fmt.Errorf("cubind: %s (%s) lacks %s", b.lib.Name, b.lib.Path, strings.Join(b.missing, ", "))
}
