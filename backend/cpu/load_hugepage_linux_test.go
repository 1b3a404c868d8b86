//go:build linux

package cpu

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"unsafe"

	"github.com/loom-ml/loom/tensor"
)

// TestStorageBytes: the byte view of a tensor's storage is that storage, its whole length, for
// every dtype that has one.
func TestStorageBytes(t *testing.T) {
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16, tensor.I32, tensor.I64, tensor.F8E4M3, tensor.F8E5M2} {
		x := tensor.New(dt, 3, 5)
		b := storageBytes(x)
		if len(b) != 15*dt.Size() {
			t.Errorf("%s: %d bytes, want %d", dt, len(b), 15*dt.Size())
			continue
		}
		b[len(b)-1] = 0x7f // the last byte of the last element, on a little-endian host
		last := tensor.New(dt, 1)
		tensor.CopyRange(last, 0, x, 14, 1)
		if storageBytes(last)[dt.Size()-1] != 0x7f {
			t.Errorf("%s: writing the view's last byte did not change the tensor's last element", dt)
		}
	}
	if b := storageBytes(tensor.New(tensor.Bool, 4)); b != nil {
		t.Errorf("bool: %d bytes, want none", len(b))
	}
	if b := storageBytes(tensor.New(tensor.BF16, 0)); b != nil {
		t.Errorf("empty: %d bytes, want none", len(b))
	}
}

// TestAdviseHugePages: where transparent huge pages are enabled for madvise, a large tensor
// advised before it is touched is backed by huge pages once written (the fused weights' read
// at load); its contents are untouched by the advice. It runs in a fresh process (this test
// binary run again): in this one the heap may hand out memory that earlier tests touched,
// whose small pages the advice does not replace at once.
func TestAdviseHugePages(t *testing.T) {
	mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || strings.Contains(string(mode), "[never]") {
		t.Skipf("transparent huge pages are off here (%q, %v)", strings.TrimSpace(string(mode)), err)
	}
	if os.Getenv("LOOM_TEST_HUGEPAGE_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestAdviseHugePages$", "-test.v")
		cmd.Env = append(os.Environ(), "LOOM_TEST_HUGEPAGE_CHILD=1")
		out, err := cmd.CombinedOutput()
		t.Logf("fresh process:\n%s", out)
		if err != nil {
			t.Errorf("in a fresh process: %v", err)
		}
		return
	}
	x := tensor.New(tensor.BF16, 8<<20) // 16 MiB: 7 or 8 whole huge pages
	adviseHugePages(x)
	for i := range x.Half {
		x.Half[i] = uint16(i)
	}
	for i, v := range x.Half {
		if v != uint16(i) {
			t.Fatalf("element %d = %d after the advice, want %d", i, v, uint16(i))
		}
	}
	huge := anonHugeBytes(t, uintptr(unsafe.Pointer(&x.Half[0])), uintptr(len(x.Half)*2))
	t.Logf("%d MiB of the 16 MiB tensor in huge pages", huge>>20)
	if huge < 4<<20 {
		t.Errorf("%d bytes of the tensor's mappings are huge pages, want most of its 16 MiB", huge)
	}
}

// anonHugeBytes sums AnonHugePages of the mappings (/proc/self/smaps) that overlap
// [addr, addr+n).
func anonHugeBytes(t *testing.T, addr, n uintptr) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	defer f.Close()
	var total int64
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		var lo, hi uintptr
		if fields := strings.Fields(line); len(fields) > 0 && !strings.HasSuffix(fields[0], ":") {
			if k, _ := fmt.Sscanf(fields[0], "%x-%x", &lo, &hi); k == 2 {
				in = lo < addr+n && addr < hi
			}
			continue
		}
		var kb int64
		if in && strings.HasPrefix(line, "AnonHugePages:") {
			if _, err := fmt.Sscanf(line, "AnonHugePages: %d kB", &kb); err != nil {
				t.Fatalf("smaps line %q: %v", line, err)
			}
			total += kb << 10
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return total
}
