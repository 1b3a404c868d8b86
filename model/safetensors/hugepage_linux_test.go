//go:build linux

package safetensors

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/loom-ml/loom/tensor"
)

// mappingFlags returns the VmFlags line of the mapping of this process that contains addr, as
// /proc/self/smaps gives it, and whether path is mapped at all.
func mappingFlags(t *testing.T, addr uintptr, path string) (flags string, pathMapped bool) {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		line := sc.Text()
		var lo, hi uintptr
		if n, _ := fmt.Sscanf(line, "%x-%x ", &lo, &hi); n == 2 && !strings.Contains(line, ":  ") {
			in = addr >= lo && addr < hi
			pathMapped = pathMapped || strings.HasSuffix(line, " "+path)
			continue
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			flags = line
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return flags, pathMapped
}

// TestMappingAdvisedHuge: Open advises the whole mapping of a file of 2 MiB and more to be
// backed by huge pages (VmFlags "hg"), a smaller one not, and Close unmaps the file.
func TestMappingAdvisedHuge(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil {
		t.Skipf("this kernel has no transparent huge pages (%v): it refuses the advice", err)
	}
	for _, c := range []struct {
		name  string
		elems int
		huge  bool
	}{
		{"3 MiB", 3 << 18, true},
		{"64 KiB", 16 << 10, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "w.safetensors")
			if err := Write(path, map[string]*tensor.Tensor{"w": tensor.New(tensor.F32, c.elems)}); err != nil {
				t.Fatal(err)
			}
			f, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			if f.fd == nil {
				f.Close()
				t.Skip("the file is not memory-mapped here")
			}
			addr := uintptr(unsafe.Pointer(&f.buf[0]))
			flags, mapped := mappingFlags(t, addr, path)
			if !mapped || flags == "" {
				t.Fatalf("the file is not among this process's mappings (flags %q)", flags)
			}
			if huge := strings.Contains(flags, " hg"); huge != c.huge {
				t.Errorf("%s: advised huge pages %v, want %v", flags, huge, c.huge)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			if _, mapped := mappingFlags(t, addr, path); mapped {
				t.Error("the file is still mapped after Close")
			}
		})
	}
}
