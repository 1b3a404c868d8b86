package cuda

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/loom-ml/loom/cubind"
)

// Kernel sources: CUDA C, compiled at run time by NVRTC for the device's architecture.
//
//go:embed kernels/*.cu kernels/*.cuh
var kernelFS embed.FS

// CacheDirEnv names the environment variable that moves the compiled-kernel cache: cubins
// go to $LOOM_CACHE_DIR/cubin instead of os.UserCacheDir()/loom/cubin.
const CacheDirEnv = "LOOM_CACHE_DIR"

// kernelOptions are the NVRTC options per kernel file besides the architecture. Every file
// but attention.cu is compiled without fused multiply-add contraction so that its float
// arithmetic rounds exactly as the CPU reference kernels' does.
func kernelOptions(file string) []string {
	opts := []string{"-default-device", "--std=c++17"}
	if file != "attention.cu" {
		opts = append(opts, "--fmad=false")
	}
	return opts
}

// kernelSource returns the full source NVRTC compiles for a kernel file: common.cuh, the
// file, then extra (instantiations of the file's templates, for files that hold only
// templates).
func kernelSource(file, extra string) (string, error) {
	common, err := kernelFS.ReadFile("kernels/common.cuh")
	if err != nil {
		return "", fmt.Errorf("cuda: kernel sources: %w", err)
	}
	body, err := kernelFS.ReadFile("kernels/" + file)
	if err != nil {
		return "", fmt.Errorf("cuda: kernel sources: %w", err)
	}
	src := string(common) + "\n#line 1 \"" + file + "\"\n" + string(body)
	if extra != "" {
		src += "\n#line 1 \"" + strings.TrimSuffix(file, ".cu") + "_instances.cu\"\n" + extra + "\n"
	}
	return src, nil
}

// KernelFiles lists the embedded kernel files (*.cu).
func KernelFiles() []string {
	ents, _ := kernelFS.ReadDir("kernels")
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".cu") {
			out = append(out, e.Name())
		}
	}
	return out
}

// CacheDir returns the folder of the compiled-kernel cache: $LOOM_CACHE_DIR/cubin, else
// os.UserCacheDir()/loom/cubin; "" when neither is known (then nothing is cached on disk).
func CacheDir() string {
	if d := os.Getenv(CacheDirEnv); d != "" {
		return filepath.Join(d, "cubin")
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "loom", "cubin")
	}
	return ""
}

// compiler turns kernel files into cubins for one architecture, through a disk cache keyed
// by the source's hash, the architecture, the options and NVRTC's version.
type compiler struct {
	arch  string // "sm_90"
	nvrtc string // "13.0"
	dir   string // cache folder; "" for none
}

// CompileStats says how a kernel file was obtained.
type CompileStats struct {
	File     string
	Cached   bool          // read from the disk cache
	Elapsed  time.Duration // compile or read time
	CubinLen int
}

// cubin returns the cubin of one kernel file with extra source appended (see kernelSource),
// from the disk cache when it is there.
func (c *compiler) cubin(file, extra string) ([]byte, CompileStats, error) {
	st := CompileStats{File: file}
	if extra != "" {
		st.File += " + " + strings.TrimSpace(extra)
	}
	start := time.Now()
	src, err := kernelSource(file, extra)
	if err != nil {
		return nil, st, err
	}
	opts := append([]string{"--gpu-architecture=" + c.arch}, kernelOptions(file)...)
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00nvrtc %s\x00%s", src, c.arch, c.nvrtc, strings.Join(opts, "\x00"))
	key := hex.EncodeToString(h.Sum(nil))[:32]
	path := ""
	if c.dir != "" {
		path = filepath.Join(c.dir, fmt.Sprintf("%s-%s-%s.cubin", strings.TrimSuffix(file, ".cu"), c.arch, key))
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			st.Cached, st.Elapsed, st.CubinLen = true, time.Since(start), len(b)
			return b, st, nil
		}
	}
	cubin, log, err := cubind.CompileCUBIN(src, file, opts)
	if err != nil {
		return nil, st, fmt.Errorf("cuda: compile kernels %s for %s: %w", file, c.arch, err)
	}
	if log = strings.TrimSpace(log); log != "" {
		slog.Debug("cuda: nvrtc log", "file", file, "log", log)
	}
	st.Elapsed, st.CubinLen = time.Since(start), len(cubin)
	if path != "" {
		if err := writeAtomic(path, cubin); err != nil {
			slog.Warn("cuda: cannot cache compiled kernels", "file", file, "err", err)
		}
	}
	return cubin, st, nil
}

// writeAtomic writes b to path through a temporary file and a rename, so that concurrent
// processes never read a partial cubin.
func writeAtomic(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*.cubin")
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}
