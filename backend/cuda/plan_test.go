package cuda

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/internal/gputest"
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
	gputest.Missing(t, "NVRTC", err)
	c := compiler{arch: "sm_90", nvrtc: fmt.Sprintf("%d.%d", ma, mi), dir: ""}
	files := KernelFiles()
	extras := make([]string, len(files))
	for _, x := range []string{"F32, f32", "BF16, bf16"} {
		for _, dl := range []int{1, 2, 3, 4, 8} {
			files = append(files, "attention.cu")
			extras = append(extras, fmt.Sprintf("SDPA(%s, %d)", x, dl))
		}
	}
	// The register forms of the norms: every dtype combination in one file, vectors of 8,
	// 4 and 1 elements.
	var norms []string
	for _, v := range [][2]int{{8, 1}, {8, 4}, {4, 8}, {1, 32}} {
		for _, x := range []string{"F32, f32", "BF16, bf16"} {
			for _, w := range []string{"F32, f32", "BF16, bf16"} {
				norms = append(norms, fmt.Sprintf("RMSNORM_VEC(%s, %s, %d, %d)", x, w, v[0], v[1]))
				for _, r := range []string{"F32, f32", "BF16, bf16"} {
					norms = append(norms, fmt.Sprintf("ADD_RMSNORM_VEC(%s, %s, %s, %d, %d)", x, r, w, v[0], v[1]))
				}
			}
		}
	}
	files = append(files, "norm.cu")
	extras = append(extras, strings.Join(norms, "\n"))
	for i, f := range files {
		_, st, err := c.cubin(f, extras[i])
		if err != nil {
			t.Error(err)
			continue
		}
		t.Logf("NVRTC %d.%d: %s -> %d-byte cubin in %v", ma, mi, st.File, st.CubinLen, st.Elapsed)
	}
}

// fastDiv's multiply and shift divide exactly every i < 2^31 by every divisor below 2^31,
// without overflowing 32 bits (as fast_div in common.cuh computes).
func TestFastDiv(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 9))
	var divs []uint32
	for d := uint32(1); d <= 3000; d++ {
		divs = append(divs, d)
	}
	for k := 2; k < 31; k++ {
		divs = append(divs, 1<<k-1, 1<<k, 1<<k+1)
	}
	for range 2000 {
		divs = append(divs, uint32(rng.Int64N(1<<31-1))+1)
	}
	divs = append(divs, 1<<31-1)
	for _, d := range divs {
		mul, shr := fastDiv(d)
		xs := []uint32{0, 1, d - 1, d, d + 1, 2*d - 1, 1<<31 - 1, 1<<31 - 2, (1<<31 - 1) / d * d, (1<<31-1)/d*d - 1}
		for range 200 {
			xs = append(xs, uint32(rng.Int64N(1<<31)))
		}
		for _, x := range xs {
			if x >= 1<<31 {
				continue
			}
			hi := (uint64(x) * uint64(mul)) >> 32
			sum := hi + uint64(x)
			if sum >= 1<<32 {
				t.Fatalf("d=%d x=%d: umulhi + i = %d overflows 32 bits", d, x, sum)
			}
			if q := uint32(sum) >> shr; q != x/d {
				t.Fatalf("d=%d (mul %d, shr %d) x=%d: got %d, want %d", d, mul, shr, x, q, x/d)
			}
		}
	}
}

// planCopy moves the widest vectors that the walk and both addresses allow, falls back to
// narrower ones (down to single elements) for odd lengths, offsets and addresses, takes
// the 32-bit kernels when the walk fits and the general ones otherwise.
func TestPlanCopy(t *testing.T) {
	walk := func(dims []int, ss, ds []int64, so, do int64) stridedWalk {
		t.Helper()
		w, err := collapseWalk(dims, ss, ds, so, do)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	transpose := func(shape, perm []int) stridedWalk {
		t.Helper()
		sh, st, err := permuted(shape, perm)
		if err != nil {
			t.Fatal(err)
		}
		return walk(sh, st, rowStrides(sh), 0, 0)
	}
	const base = 1 << 20 // a 256-byte aligned device address
	for _, tc := range []struct {
		name           string
		w              stridedWalk
		ssize, dsize   int
		sptr, dptr     uint64
		cast           string
		want           string
		dims, ss, ds   []int64
		srcOff, dstOff int64
	}{
		{name: "bf16 transpose [1,1024,32,128] -> [1,32,1024,128]", w: transpose([]int{1, 1024, 32, 128}, []int{0, 2, 1, 3}),
			ssize: 2, dsize: 2, sptr: base, dptr: base, want: "copy32_b16",
			dims: []int64{32, 1024, 16}, ss: []int64{16, 512, 1}, ds: []int64{16384, 16, 1}},
		{name: "source 2 bytes off 16-byte alignment", w: transpose([]int{1, 1024, 32, 128}, []int{0, 2, 1, 3}),
			ssize: 2, dsize: 2, sptr: base + 2, dptr: base, want: "copy32_b2",
			dims: []int64{32, 1024, 128}, ss: []int64{128, 4096, 1}, ds: []int64{131072, 128, 1}},
		{name: "destination 8 bytes off", w: transpose([]int{1, 1024, 32, 128}, []int{0, 2, 1, 3}),
			ssize: 2, dsize: 2, sptr: base, dptr: base + 8, want: "copy32_b8",
			dims: []int64{32, 1024, 32}, ss: []int64{32, 1024, 1}, ds: []int64{32768, 32, 1}},
		{name: "rows of 7", w: transpose([]int{5, 3, 7}, []int{1, 0, 2}), ssize: 2, dsize: 2, sptr: base, dptr: base,
			want: "copy32_b2", dims: []int64{3, 5, 7}, ss: []int64{7, 21, 1}, ds: []int64{35, 7, 1}},
		{name: "slice [1:9] of rows of 16", w: walk([]int{4, 8}, []int64{16, 1}, []int64{8, 1}, 1, 0), ssize: 2, dsize: 2,
			sptr: base, dptr: base, want: "copy32_b2", dims: []int64{4, 8}, ss: []int64{16, 1}, ds: []int64{8, 1}, srcOff: 1},
		{name: "slice [4:12] of rows of 16", w: walk([]int{4, 8}, []int64{16, 1}, []int64{8, 1}, 4, 0), ssize: 2, dsize: 2,
			sptr: base, dptr: base, want: "copy32_b8", dims: []int64{4, 2}, ss: []int64{4, 1}, ds: []int64{2, 1}, srcOff: 1},
		{name: "concat part at column 5 of rows of 16", w: walk([]int{3, 11}, []int64{11, 1}, []int64{16, 1}, 0, 5),
			ssize: 2, dsize: 2, sptr: base, dptr: base, want: "copy32_b2",
			dims: []int64{3, 11}, ss: []int64{11, 1}, ds: []int64{16, 1}, dstOff: 5},
		{name: "weight concat along rows", w: walk([]int{1024, 4096}, []int64{4096, 1}, []int64{4096, 1}, 0, 4096*4096),
			ssize: 2, dsize: 2, sptr: base, dptr: base, want: "copy32_b16",
			dims: []int64{1024 * 512}, ss: []int64{1}, ds: []int64{1}, dstOff: 512 * 4096},
		{name: "expand of the innermost axis", w: walk([]int{2, 4, 3, 5}, []int64{3, 0, 1, 0}, rowStrides([]int{2, 4, 3, 5}), 0, 0),
			ssize: 2, dsize: 2, sptr: base, dptr: base, want: "copy32_b2",
			dims: []int64{2, 4, 3, 5}, ss: []int64{3, 0, 1, 0}, ds: []int64{60, 15, 5, 1}},
		{name: "f32 contiguous", w: walk([]int{1000}, []int64{1}, []int64{1}, 0, 0), ssize: 4, dsize: 4, sptr: base, dptr: base,
			want: "copy32_b16", dims: []int64{250}, ss: []int64{1}, ds: []int64{1}},
		{name: "bytes", w: walk([]int{64}, []int64{1}, []int64{1}, 0, 0), ssize: 1, dsize: 1, sptr: base, dptr: base,
			want: "copy32_b16", dims: []int64{4}, ss: []int64{1}, ds: []int64{1}},
		{name: "2^33 bf16 elements: 2^30 vectors fit 32 bits", w: walk([]int{1 << 33}, []int64{1}, []int64{1}, 0, 0),
			ssize: 2, dsize: 2, sptr: base, dptr: base, want: "copy32_b16", dims: []int64{1 << 30}, ss: []int64{1}, ds: []int64{1}},
		{name: "2^34 bf16 elements: 64-bit vectors", w: walk([]int{1 << 34}, []int64{1}, []int64{1}, 0, 0),
			ssize: 2, dsize: 2, sptr: base, dptr: base, want: "copy_b16", dims: []int64{1 << 31}, ss: []int64{1}, ds: []int64{1}},
		{name: "cast bf16 -> f32 [64,128256]", w: walk([]int{64 * 128256}, []int64{1}, []int64{1}, 0, 0),
			ssize: 2, dsize: 4, sptr: base, dptr: base, cast: "bf16_f32", want: "cast32_bf16_f32_v4",
			dims: []int64{64 * 128256 / 4}, ss: []int64{1}, ds: []int64{1}},
		{name: "cast f32 -> bf16 of rows of 6", w: transpose([]int{2, 3, 6}, []int{1, 0, 2}), ssize: 4, dsize: 2,
			sptr: base, dptr: base, cast: "f32_bf16", want: "cast32_f32_bf16_v2",
			dims: []int64{3, 2, 3}, ss: []int64{3, 9, 1}, ds: []int64{6, 3, 1}},
		{name: "cast of rows of 7", w: transpose([]int{2, 3, 7}, []int{1, 0, 2}), ssize: 4, dsize: 2,
			sptr: base, dptr: base, cast: "f32_bf16", want: "cast32_f32_bf16_v1",
			dims: []int64{3, 2, 7}, ss: []int64{7, 21, 1}, ds: []int64{14, 7, 1}},
		{name: "cast past 32 bits", w: walk([]int{1 << 34}, []int64{1}, []int64{1}, 0, 0), ssize: 2, dsize: 4,
			sptr: base, dptr: base, cast: "bf16_f32", want: "cast_bf16_f32", dims: []int64{1 << 34}, ss: []int64{1}, ds: []int64{1}},
	} {
		p := planCopy(tc.w, tc.ssize, tc.dsize, tc.sptr, tc.dptr, tc.cast)
		if p.name != tc.want || !slices.Equal(p.w.dims, tc.dims) || !slices.Equal(p.w.ss, tc.ss) || !slices.Equal(p.w.ds, tc.ds) ||
			p.w.srcOff != tc.srcOff || p.w.dstOff != tc.dstOff {
			t.Errorf("%s: %s over %+v, want %s over dims %v ss %v ds %v offsets %d %d", tc.name, p.name, p.w, tc.want, tc.dims, tc.ss, tc.ds, tc.srcOff, tc.dstOff)
		}
		if p.is32 != strings.Contains(p.name, "32_") {
			t.Errorf("%s: %s with is32 %v", tc.name, p.name, p.is32)
		}
		if p.is32 && len(p.args()) != 4*(5*maxRank+4) {
			t.Errorf("%s: Strided32 of %d bytes", tc.name, len(p.args()))
		}
	}
	// The general path on request, as before the fast paths.
	forceGeneralCopy = true
	defer func() { forceGeneralCopy = false }()
	w := transpose([]int{1, 1024, 32, 128}, []int{0, 2, 1, 3})
	if p := planCopy(w, 2, 2, base, base, ""); p.name != "copy_b2" || p.is32 || !slices.Equal(p.w.dims, w.dims) {
		t.Errorf("forced general copy: %s over %+v", p.name, p.w)
	}
}

// planNorm uses 16-byte vectors of the widest dtype where D and the addresses allow,
// enough threads for the row, and leaves rows too long for registers to the loop kernels.
func TestPlanNorm(t *testing.T) {
	const base = cubind.DevicePtr(1 << 20)
	bf, f32 := tensor.BF16, tensor.F32
	for _, tc := range []struct {
		D        int
		ops      []operand
		vec, nv  int
		threads  int
		ok       bool
		describe string
	}{
		{4096, []operand{{base, bf}, {base, bf}, {base, bf}}, 8, 1, 512, true, "bf16 D=4096: D/8 threads"},
		{4096, []operand{{base, f32}, {base, bf}, {base, f32}}, 4, 1, 1024, true, "f32 x: vectors of 4"},
		{8192, []operand{{base, bf}, {base, bf}}, 8, 1, 1024, true, "bf16 D=8192"},
		{32768, []operand{{base, bf}, {base, bf}}, 8, 4, 1024, true, "bf16 D=32768: 4 vectors a thread"},
		{65536, []operand{{base, bf}, {base, bf}}, 0, 0, 0, false, "bf16 D=65536: loop kernel"},
		{7, []operand{{base, bf}, {base, bf}}, 1, 1, 32, true, "odd D"},
		{1000, []operand{{base, bf}, {base, bf}}, 8, 1, 128, true, "D=1000"},
		{4096, []operand{{base + 2, bf}, {base, bf}}, 1, 4, 1024, true, "misaligned x: single elements"},
		{4096, []operand{{base + 8, bf}, {base, bf}}, 4, 1, 1024, true, "x aligned to 8 bytes"},
	} {
		p, ok := planNorm(tc.D, tc.ops...)
		if ok != tc.ok || (ok && (p.vec != tc.vec || p.nv != tc.nv || p.threads != tc.threads)) {
			t.Errorf("%s: %+v %v, want vec %d nv %d threads %d %v", tc.describe, p, ok, tc.vec, tc.nv, tc.threads, tc.ok)
		}
	}
	forceLoopNorm = true
	defer func() { forceLoopNorm = false }()
	if _, ok := planNorm(4096, operand{base, bf}); ok {
		t.Error("forceLoopNorm: the register form was planned")
	}
}

// planDecode keeps a lane's query and accumulator elements within 32, picks 4 to 16 warps
// and splits from the shapes (splits only with 4 or 8 warps, within decodeSplitWarps and
// a step of the context bound per warp), never more shared memory than a block may have, and a workspace
// that PagedAttentionWorkspace covers for either cache dtype. The kernel's instantiation
// depends on the heads, the head size and the cache dtype only.
func TestPlanDecode(t *testing.T) {
	for _, tc := range []struct {
		H, KV, S, D, M, BS int
		warps, splits      int
	}{
		{32, 8, 64, 128, 16, 16, 4, 1},  // 64 sequences of ~140 tokens: one block each, no split
		{32, 8, 1, 128, 16, 16, 8, 4},   // one sequence of ~140 tokens: a step per warp, 4 splits
		{16, 4, 1, 128, 16, 16, 8, 4},   // the same at tp=2
		{32, 8, 1, 128, 512, 16, 8, 16}, // one sequence of up to 8192 tokens: 1024 warps
		{32, 8, 64, 128, 64, 16, 4, 1},  // 64 sequences of ~1024 tokens fill the GPU
		{32, 8, 4, 128, 64, 16, 8, 4},   // 4 sequences of ~1024 tokens split
		{32, 8, 256, 128, 64, 16, 4, 1}, // a full batch
		{32, 8, 16, 128, 16, 16, 8, 1},  // 16 short sequences: 128 blocks of 8 warps
		{32, 8, 16, 128, 64, 16, 16, 1}, // 16 sequences of ~1024 tokens: 16 warps
		{32, 8, 32, 128, 16, 16, 8, 1},  // 32 short sequences: 8 warps
		{12, 2, 3, 40, 34, 1, 4, 1},     // block size 1
		{64, 8, 1, 128, 16, 16, 8, 4},   // 8 query heads per KV head
		{8, 2, 1, 256, 44, 16, 8, 8},    // at least two steps of each warp per split
	} {
		p := planDecode(tc.H, tc.KV, tc.S, tc.D, tc.M, tc.BS, 2)
		if p.warps != tc.warps || p.splits != tc.splits {
			t.Errorf("%+v: %d warps, %d splits, want %d, %d", tc, p.warps, p.splits, tc.warps, tc.splits)
		}
	}
	rng := rand.New(rand.NewPCG(4, 4))
	for range 3000 {
		G := []int{1, 2, 4, 6, 8, 16}[rng.IntN(6)]
		KV := 1 + rng.IntN(8)
		D := []int{32, 40, 64, 80, 96, 128, 256}[rng.IntN(7)]
		S, M, BS := 1+rng.IntN(300), 1+rng.IntN(1024), []int{1, 8, 16, 32}[rng.IntN(4)]
		shapes := [][]int{{1, G * KV, S, D}, {1, KV, S, D}, {1, KV, S, D}, {1, S}, {64, BS, KV, D}, {64, BS, KV, D}, {S}, {S}, {S, M}}
		ws := PagedAttentionWorkspace(shapes)
		ref := planDecode(G*KV, KV, 1, D, 1, 1, 2)
		for _, es := range []int{2, 4} {
			p := planDecode(G*KV, KV, S, D, M, BS, es)
			name := fmt.Sprintf("G%d KV%d S%d D%d M%d BS%d esize %d: %+v", G, KV, S, D, M, BS, es, p)
			if p.gp*p.vec*p.cpl > 32 && p.gp > 1 || D%p.vec != 0 || p.lpr*p.vec*p.cpl < D || p.lpr > 32 {
				t.Fatalf("%s: lanes do not fit the row", name)
			}
			if p.warps != 4 && p.warps != 8 && p.warps != 16 || p.splits < 1 || p.splits > maxDecodeSplits || p.splits > 1 && p.warps > 8 {
				t.Fatalf("%s: warps or splits out of range", name)
			}
			if p.maxb*p.splits < M || p.warps > 4 && p.shared > decodeMaxShared || p.shared != p.sharedFor(p.warps, D, p.maxb) {
				t.Fatalf("%s: table entries or shared memory", name)
			}
			if p.workspace(G*KV, S, D) > ws {
				t.Fatalf("%s: workspace %d above PagedAttentionWorkspace %d", name, p.workspace(G*KV, S, D), ws)
			}
			if es == 2 {
				a, _ := decodeKernel("bf16", "bf16", p)
				b, _ := decodeKernel("bf16", "bf16", ref)
				if a != b {
					t.Fatalf("%s: instantiation %s depends on S, M or BS (%s)", name, a, b)
				}
			}
		}
	}
}
