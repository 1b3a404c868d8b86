//go:build linux

package model

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model/safetensors"
	"github.com/loom-ml/loom/tensor"
)

// mappingRSS returns the resident bytes of the mapping of this process that holds addr, from
// /proc/self/smaps, and whether there is one.
func mappingRSS(t *testing.T, addr uintptr) (int64, bool) {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		var lo, hi uintptr
		if n, _ := fmt.Sscanf(line, "%x-%x ", &lo, &hi); n == 2 && strings.Contains(line, " ") && !strings.HasSuffix(strings.Fields(line)[0], ":") {
			in = lo <= addr && addr < hi
			continue
		}
		var kb int64
		if in && strings.HasPrefix(line, "Rss:") {
			if _, err := fmt.Sscanf(line, "Rss: %d kB", &kb); err != nil {
				t.Fatalf("smaps line %q: %v", line, err)
			}
			return kb << 10, true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return 0, false
}

// TestMappedResident: a tensor Mapped weights return as a view is the checkpoint's mapping,
// resident once it is loaded; a tensor read with LoadInto (a fused weight's part) leaves its
// pages of the mapping untouched, so the weights count once in the process's memory; Close
// unmaps the file.
func TestMappedResident(t *testing.T) {
	const rows, cols = 1024, 2048 // 4 MiB of bf16 each
	a, b := tensor.New(tensor.BF16, rows, cols), tensor.New(tensor.BF16, rows, cols)
	for i := range a.Half {
		a.Half[i], b.Half[i] = uint16(i), uint16(3*i+1)
	}
	dir := t.TempDir()
	if err := safetensors.Write(filepath.Join(dir, SingleFile), map[string]*tensor.Tensor{"a": a, "b": b}); err != nil {
		t.Fatal(err)
	}
	ck, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	mw := ck.Mapped()
	va, err := mw.Load(ctx, whole("a", tensor.BF16, rows, cols))
	if err != nil {
		t.Fatal(err)
	}
	vb := tensor.New(tensor.BF16, rows, cols)
	if err := mw.LoadInto(ctx, whole("b", tensor.BF16, rows, cols), vb); err != nil {
		t.Fatal(err)
	}
	if !tensorsEqual(va, a) || !tensorsEqual(vb, b) {
		t.Fatal("the loaded tensors differ from the written ones")
	}
	addr := uintptr(unsafe.Pointer(&va.Half[0]))
	rss, ok := mappingRSS(t, addr)
	if !ok {
		t.Fatal("the view of \"a\" is in no mapping of the process")
	}
	const size, page = rows * cols * 2, 4096
	// "a" is resident, and the pages around the header that reading it faulted in (the
	// kernel maps up to 16 pages around a faulting one); "b" (read with pread) is not: 4 MiB.
	if rss < size || rss > size+32*page {
		t.Errorf("the mapping has %d bytes resident, want those of \"a\" (%d) and at most 32 pages more", rss, size)
	}
	if err := ck.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := mappingRSS(t, addr); ok {
		t.Error("the file is still mapped after Close")
	}
	// What LoadInto read is the caller's and outlives Close.
	if !tensorsEqual(vb, b) {
		t.Error("the tensor read with LoadInto changed after Close")
	}
	var _ graph.WeightsInto = mw
}
