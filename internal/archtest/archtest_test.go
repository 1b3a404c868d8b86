package archtest

import (
	"bytes"
	"encoding/json"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/loom-ml/loom"

// pkg is what go list says of a package (test files left out).
type pkg struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
	Deps       []string
}

// list runs go list on patterns from the module's root.
func list(t *testing.T, patterns ...string) []pkg {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json=ImportPath,Dir,GoFiles,Imports,Deps"}, patterns...)...)
	cmd.Dir = filepath.Join("..", "..")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v\n%s", patterns, err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatalf("go list %v: no packages", patterns)
	}
	return pkgs
}

// gpuPackages are the packages of one device: the CUDA bindings, the CUDA backend and NCCL.
// Only the backend registry's users that pick a device (cmd/loom, by blank imports) and the
// backends themselves reach them.
var gpuPackages = []string{module + "/cubind", module + "/backend/cuda", module + "/dist/nccl"}

func within(path string, roots ...string) bool {
	for _, r := range roots {
		if path == r || strings.HasPrefix(path, r+"/") {
			return true
		}
	}
	return false
}

// The engine and the server run models through package backend's seam: neither they nor
// anything they import is tied to a GPU library.
func TestEngineAndServerImportNoGPUPackage(t *testing.T) {
	for _, p := range list(t, "./engine/...", "./server/...") {
		for _, d := range p.Deps {
			if within(d, gpuPackages...) {
				t.Errorf("%s depends on %s (through %s): the engine and the server reach devices through package backend's registry", p.ImportPath, d, importer(t, p, d))
			}
		}
	}
}

// importer names the direct import of p through which p depends on dep.
func importer(t *testing.T, p pkg, dep string) string {
	if slices.Contains(p.Imports, dep) {
		return "a direct import"
	}
	for _, q := range list(t, p.Imports...) {
		if q.ImportPath == dep || slices.Contains(q.Deps, dep) {
			return q.ImportPath
		}
	}
	return "?"
}

// cmd/loom picks backends by name; it imports GPU packages only for their registration (a
// blank import), never to call them.
func TestCommandImportsGPUPackagesBlank(t *testing.T) {
	for _, p := range list(t, "./cmd/...") {
		fset := token.NewFileSet()
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				path := strings.Trim(imp.Path.Value, `"`)
				if within(path, gpuPackages...) && (imp.Name == nil || imp.Name.Name != "_") {
					t.Errorf("%s imports %s: cmd/loom reaches backends through package backend's registry (a blank import registers one)", fset.Position(imp.Pos()), path)
				}
			}
		}
	}
}

// Models are written without knowing the backends that run them: package model and its
// frontends import no backend.
func TestModelImportsNoBackend(t *testing.T) {
	for _, p := range list(t, "./model/...") {
		for _, d := range p.Deps {
			if within(d, module+"/backend") || within(d, gpuPackages...) {
				t.Errorf("%s depends on %s: a model does not know the backends", p.ImportPath, d)
			}
		}
	}
}
