package archtest

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// floorTable reads the table of docs/ARCHITECTURE.md's "Packages, by floor": package path
// (relative to the module) to floor.
func floorTable(t *testing.T) map[string]int {
	t.Helper()
	path := filepath.Join("..", "..", "docs", "ARCHITECTURE.md")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "## Packages, by floor")
	if !ok {
		t.Fatalf("%s: no section \"Packages, by floor\"", path)
	}
	row := regexp.MustCompile(`^\| (\d+) \| (.*?) \|`)
	name := regexp.MustCompile("`([a-z0-9/]+)`")
	floors := map[string]int{}
	for _, line := range strings.Split(rest, "\n") {
		if strings.HasPrefix(line, "## ") {
			break
		}
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		floor, _ := strconv.Atoi(m[1])
		for _, n := range name.FindAllStringSubmatch(m[2], -1) {
			if f, dup := floors[n[1]]; dup {
				t.Errorf("%s: %s is on floors %d and %d", path, n[1], f, floor)
			}
			floors[n[1]] = floor
		}
	}
	if len(floors) == 0 {
		t.Fatalf("%s: the floor table lists no packages", path)
	}
	return floors
}

// TestFloorTable holds docs/ARCHITECTURE.md's floor table to the code: every package of the
// module is in it, nothing else is, and every package imports only packages of lower floors.
func TestFloorTable(t *testing.T) {
	floors := floorTable(t)
	listed := map[string]bool{}
	for _, p := range list(t, "./...") {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		listed[rel] = true
		f, ok := floors[rel]
		if !ok {
			t.Errorf("package %s is not in docs/ARCHITECTURE.md's floor table", rel)
			continue
		}
		for _, imp := range p.Imports {
			if !within(imp, module) {
				continue
			}
			dep := strings.TrimPrefix(imp, module+"/")
			if g, ok := floors[dep]; ok && g >= f {
				t.Errorf("%s (floor %d) imports %s (floor %d): a package imports only from lower floors", rel, f, dep, g)
			}
		}
	}
	for p := range floors {
		if !listed[p] {
			t.Errorf("docs/ARCHITECTURE.md's floor table lists %s, which go list does not know", p)
		}
	}
}
