package cuda

import (
	"fmt"

	"context"
	"encoding/binary"
	"github.com/loom-ml/loom/cubind"
	"slices"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

func TestSizeClass(t *testing.T) {
	for _, tc := range [][2]uint64{{0, 512}, {1, 512}, {512, 512}, {513, 1024}, {1 << 20, 1 << 20}, {1<<20 + 1, 1<<20 + 1<<18}, {3 << 20, 3 << 20}, {(3 << 20) + 1, 7 << 19}} {
		if got := sizeClass(tc[0]); got != tc[1] {
			t.Errorf("sizeClass(%d) = %d, want %d", tc[0], got, tc[1])
		}
	}
	for n := uint64(1); n < 1<<26; n = n*3 + 7 {
		if c := sizeClass(n); c < n || (n > minClass && float64(c) > 2*float64(n)) || sizeClass(c) != c {
			t.Errorf("sizeClass(%d) = %d", n, c)
		}
	}
}

func stridedFields(b []byte) (dims, ss, ds []int64, n, so, do int64, rank int) {
	get := func(i int) int64 { return int64(binary.LittleEndian.Uint64(b[8*i:])) }
	rank = int(binary.LittleEndian.Uint32(b[8*(3*maxRank+3):]))
	for i := range rank {
		dims = append(dims, get(i))
		ss = append(ss, get(maxRank+i))
		ds = append(ds, get(2*maxRank+i))
	}
	return dims, ss, ds, get(3 * maxRank), get(3*maxRank + 1), get(3*maxRank + 2), rank
}

func TestNewStridedCollapses(t *testing.T) {
	// A contiguous copy collapses to one dimension.
	b, err := newStrided([]int{2, 3, 4}, []int64{12, 4, 1}, []int64{12, 4, 1}, 5, 7)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 176 {
		t.Errorf("struct is %d bytes, want 176", len(b))
	}
	dims, ss, ds, n, so, do, rank := stridedFields(b)
	if rank != 1 || dims[0] != 24 || ss[0] != 1 || ds[0] != 1 || n != 24 || so != 5 || do != 7 {
		t.Errorf("contiguous copy: dims %v ss %v ds %v n %d off %d %d", dims, ss, ds, n, so, do)
	}
	// A transpose [0,2,1,3] of [2,3,4,5] keeps three dimensions (the last two merge).
	shape, st, err := permuted([]int{2, 3, 4, 5}, []int{0, 2, 1, 3})
	if err != nil {
		t.Fatal(err)
	}
	b, _ = newStrided(shape, st, rowStrides(shape), 0, 0)
	dims, ss, ds, _, _, _, rank = stridedFields(b)
	if rank != 4 {
		t.Errorf("transpose: rank %d", rank)
	}
	if !slices.Equal(dims, []int64{2, 4, 3, 5}) || !slices.Equal(ss, []int64{60, 5, 20, 1}) || !slices.Equal(ds, []int64{60, 15, 5, 1}) {
		t.Errorf("transpose: dims %v ss %v ds %v", dims, ss, ds)
	}
	if _, err := newStrided([]int{2, 2, 2, 2, 2, 2, 2}, []int64{1, 2, 4, 8, 16, 32, 64}, []int64{64, 32, 16, 8, 4, 2, 1}, 0, 0); err == nil {
		t.Error("a 7-dimensional walk was accepted")
	}
}

func TestBroadcastStrides(t *testing.T) {
	shape, sa, sb, err := broadcastStrides([]int{3, 1, 5}, []int{4, 1})
	if err != nil || !slices.Equal(shape, []int{3, 4, 5}) || !slices.Equal(sa, []int64{5, 0, 1}) || !slices.Equal(sb, []int64{0, 1, 0}) {
		t.Errorf("got %v %v %v %v", shape, sa, sb, err)
	}
	if _, _, _, err := broadcastStrides([]int{3}, []int{4}); err == nil {
		t.Error("[3] and [4] broadcast")
	}
}

// The memory plan never gives two values alive at the same step overlapping bytes, and a
// view shares its input's bytes.
func TestMemoryPlan(t *testing.T) {
	B, S := graph.Sym("B"), graph.Sym("S")
	b := graph.NewBuilder("plan")
	x := b.Input("x", tensor.F32, graph.Shape{B, S, graph.D(64)})
	w := b.Input("w", tensor.BF16, graph.Dims(64))
	wq := b.Input("wq", tensor.BF16, graph.Dims(128, 64))
	r := b.Apply("add_rmsnorm", graph.Attrs{"eps": 1e-5}, x, x, w)
	h := b.Linear(r[0], wq)
	v := b.Reshape(h, B, S, graph.D(2), graph.D(64))
	tr := b.Transpose(v, 0, 2, 1, 3)
	g1 := b.Linear(r[1], wq)
	sw := b.Op("swiglu", nil, g1, g1)
	sum := b.Add(b.Reshape(tr, B, graph.D(2), S, graph.D(64)), b.Reshape(b.Transpose(b.Reshape(sw, B, S, graph.D(2), graph.D(64)), 0, 2, 1, 3), B, graph.D(2), S, graph.D(64)))
	b.Output(sum, r[1])
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	p, slot := newProgram(nil, g)
	for _, n := range g.Nodes {
		if err := p.compileNode(context.Background(), n, slot, nil); err != nil {
			t.Fatal(err)
		}
	}
	pl, err := p.plan(map[string]int{"B": 3, "S": 7})
	if err != nil {
		t.Fatal(err)
	}
	if p.root[slot[v]] != p.root[slot[h]] || pl.offsets[p.root[slot[v]]] < 0 {
		t.Errorf("reshape output does not share its input's memory")
	}
	// Lifetimes, recomputed here: [first step, last step] per root; inputs from -1, outputs to the end.
	type life struct{ first, last int }
	lives := map[int]*life{}
	touch := func(v *graph.Value, i int) {
		r := p.root[slot[v]]
		if l, ok := lives[r]; ok {
			l.first, l.last = min(l.first, i), max(l.last, i)
		} else {
			lives[r] = &life{i, i}
		}
	}
	for _, in := range g.Inputs {
		touch(in, -1)
	}
	for i, st := range p.steps {
		for _, in := range st.node.Inputs {
			touch(in, i)
		}
		for _, o := range st.node.Outputs {
			touch(o, i)
		}
	}
	for _, o := range g.Outputs {
		touch(o, len(p.steps))
	}
	size := func(r int) int64 {
		return int64(tensor.Numel(pl.shapes[r]) * p.values[r].Type.DType.Size())
	}
	for r1, l1 := range lives {
		for r2, l2 := range lives {
			if r1 >= r2 || l1.last < l2.first || l2.last < l1.first {
				continue
			}
			o1, o2 := pl.offsets[r1], pl.offsets[r2]
			if o1 < o2+size(r2) && o2 < o1+size(r1) {
				t.Errorf("%s [%d,%d) and %s [%d,%d) overlap while both alive", p.values[r1], o1, o1+size(r1), p.values[r2], o2, o2+size(r2))
			}
		}
		if pl.offsets[r1]%align != 0 || pl.offsets[r1]+size(r1) > pl.size {
			t.Errorf("%s at %d (size %d) is misaligned or outside the arena of %d", p.values[r1], pl.offsets[r1], size(r1), pl.size)
		}
	}
	total := int64(0)
	for r := range lives {
		total += size(r)
	}
	t.Logf("arena %d bytes for %d values of %d bytes in all", pl.size, len(lives), total)
	if pl.size >= total {
		t.Errorf("the plan reuses no memory: arena %d, values %d", pl.size, total)
	}
}

// Every kernel file compiles with NVRTC for sm_90 (NVRTC needs no GPU; the test skips when
// the library is missing).
func TestKernelsCompile(t *testing.T) {
	if testDev != nil {
		t.Skip("a GPU is present: the kernel tests compile every kernel for it")
	}
	ma, mi, err := cubind.NVRTCVersion()
	if err != nil {
		t.Skip("no NVRTC: " + err.Error())
	}
	c := compiler{arch: "sm_90", nvrtc: fmt.Sprintf("%d.%d", ma, mi), dir: ""}
	files := KernelFiles()
	extras := make([]string, len(files))
	for _, x := range []string{"F32, f32", "BF16, bf16"} {
		for _, dl := range []int{1, 2, 3, 4, 8} {
			files = append(files, "attention.cu")
			extras = append(extras, fmt.Sprintf("SDPA(%s, %d)", x, dl))
		}
	}
	for i, f := range files {
		_, st, err := c.cubin(f, extras[i])
		if err != nil {
			t.Error(err)
			continue
		}
		t.Logf("NVRTC %d.%d: %s -> %d-byte cubin in %v", ma, mi, st.File, st.CubinLen, st.Elapsed)
	}
}
