package cuda

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/dist/nccl"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// The context-parallel kernels against the CPU backend's reference kernels, the exchanges
// (ring_shift, all_to_all) on one GPU through a fake communicator and on two through NCCL,
// and a ring of partial attentions merged through a compiled graph.

// cpTol is the tolerance of o and lse of the attention kernels: both sides compute in f32
// from the same (widened) inputs; the GPU's online softmax rounds differently from the
// reference's two passes.
var cpTol = tol{atol: 2e-5, rtol: 1e-4}

// cpPositions returns an integer tensor of shape whose entries are drawn from [lo, hi).
func cpPositions(rng *rand.Rand, dt tensor.DType, shape []int, lo, hi int) *tensor.Tensor {
	t := randInts(rng, dt, shape, hi-lo)
	for i := range t.Numel() {
		setInt(t, i, int(t.At(i))+lo)
	}
	return t
}

type cpPartialCase struct {
	name                            string
	dt, pdt                         tensor.DType
	NQ, B, H, KV, Sq, Sk, NK, D, wn int
	// masked puts the first query of every (block, row) before every key: it sees none.
	masked bool
}

func (c cpPartialCase) inputs(rng *rand.Rand) []*tensor.Tensor {
	q := randTensor(rng, c.dt, []int{c.NQ, c.B, c.H, c.Sq, c.D}, -2, 2)
	k := randTensor(rng, c.dt, []int{c.NK, c.B, c.KV, c.Sk, c.D}, -2, 2)
	v := randTensor(rng, c.dt, []int{c.NK, c.B, c.KV, c.Sk, c.D}, -1, 1)
	span := c.Sq + c.NK*c.Sk
	qp := cpPositions(rng, c.pdt, []int{c.NQ, c.B, c.Sq}, 0, span)
	lo := 0
	if c.masked {
		lo = 1
		for i := 0; i < qp.Numel(); i += c.Sq {
			setInt(qp, i, 0)
		}
	}
	kp := cpPositions(rng, c.pdt, []int{c.NK, c.B, c.Sk}, lo, span)
	return []*tensor.Tensor{q, k, v, qp, kp}
}

// attention_partial on the GPU matches the CPU reference: GQA (1, 2, 3, 8), odd lengths
// and head sizes, several query and key blocks, windows, queries that see no key, one
// query (decode), f32 and bf16, i32 and i64 positions, every head-size class.
func TestAttentionPartialMatchesCPU(t *testing.T) {
	d := gpu(t)
	cases := []cpPartialCase{
		{"f32 gqa2 d64", tensor.F32, tensor.I64, 1, 1, 4, 2, 37, 29, 1, 64, 0, false},
		{"f32 gqa3 d40 blocks window masked i32", tensor.F32, tensor.I32, 2, 2, 6, 2, 5, 41, 3, 40, 9, true},
		{"bf16 gqa8 d128 masked", tensor.BF16, tensor.I64, 1, 1, 8, 1, 70, 33, 2, 128, 0, true},
		{"bf16 mha d256", tensor.BF16, tensor.I32, 1, 1, 2, 2, 17, 65, 1, 256, 0, false},
		{"f32 decode d96 window", tensor.F32, tensor.I64, 1, 1, 4, 4, 1, 100, 2, 96, 30, false},
		{"bf16 d32 blocks masked window", tensor.BF16, tensor.I64, 3, 2, 4, 2, 9, 7, 2, 32, 4, true},
	}
	rng := rand.New(rand.NewPCG(22, 1))
	for _, c := range cases {
		in := c.inputs(rng)
		attrs := graph.Attrs{"scale": 1 / math.Sqrt(float64(c.D)), "window": c.wn}
		want := cpuOp(t, "attention_partial", attrs, in...)
		dev := up(t, d, in...)
		out := like(t, d, want...)
		if err := AttentionPartial(d, out[0], out[1], dev[0], dev[1], dev[2], dev[3], dev[4], float32(attrs.Float("scale")), c.wn); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		o, lse := down(t, d, out[0]), down(t, d, out[1])
		compare(t, "attention_partial", c.name+" o", o, want[0], cpTol)
		compare(t, "attention_partial", c.name+" lse", finiteLSE(lse), finiteLSE(want[1]), cpTol)
		if c.masked {
			checkUnseen(t, c.name, o, lse, want[1])
		}
	}
}

// finiteLSE returns a copy of an f32 lse with -inf (no key seen) as -1e30, so that
// compare measures the rows that saw keys and still fails a row where only one side is
// -inf.
func finiteLSE(x *tensor.Tensor) *tensor.Tensor {
	y := x.Clone()
	for i, v := range y.F32 {
		if math.IsInf(float64(v), -1) {
			y.F32[i] = -1e30
		}
	}
	return y
}

// checkUnseen holds the rows the reference gives lse = -inf (no key seen) to o = 0 and lse
// = -inf exactly, and makes sure the case has such rows.
func checkUnseen(t *testing.T, name string, o, lse, wantLSE *tensor.Tensor) {
	t.Helper()
	D := o.Numel() / max(lse.Numel(), 1)
	unseen := 0
	for r, w := range wantLSE.F32 {
		if !math.IsInf(float64(w), -1) {
			continue
		}
		unseen++
		if !math.IsInf(float64(lse.F32[r]), -1) || slices.ContainsFunc(o.F32[r*D:(r+1)*D], func(x float32) bool { return x != 0 }) {
			t.Errorf("%s: row %d sees no key: lse %v and o %v, want -inf and zeros", name, r, lse.F32[r], o.F32[r*D:(r+1)*D])
		}
	}
	if unseen == 0 {
		t.Errorf("%s: no row that sees no key", name)
	}
}

// attention_merge on the GPU matches the CPU kernel (within an ulp or so of exp and log
// in double), with -inf on either side and both.
func TestAttentionMergeMatchesCPU(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(22, 2))
	for _, shape := range [][]int{{2, 3, 5, 7}, {1, 1, 4, 1, 64}, {9, 1}} {
		rows := shape[:len(shape)-1]
		o1 := randTensor(rng, tensor.F32, shape, -2, 2)
		o2 := randTensor(rng, tensor.F32, shape, -2, 2)
		l1 := randTensor(rng, tensor.F32, rows, -6, 6)
		l2 := randTensor(rng, tensor.F32, rows, -6, 6)
		n := l1.Numel()
		inf := float32(math.Inf(-1))
		l1.F32[0] = inf                     // only the second side saw keys
		l2.F32[n/2] = inf                   // only the first
		l1.F32[n-1], l2.F32[n-1] = inf, inf // neither
		want := cpuOp(t, "attention_merge", nil, o1, l1, o2, l2)
		dev := up(t, d, o1, l1, o2, l2)
		out := like(t, d, want...)
		if err := AttentionMerge(d, out[0], out[1], dev[0], dev[1], dev[2], dev[3]); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprint(shape)
		compare(t, "attention_merge", name+" o", down(t, d, out[0]), want[0], tol{atol: 1e-7, rtol: 1e-6})
		compare(t, "attention_merge", name+" lse", finiteLSE(down(t, d, out[1])), finiteLSE(want[1]), tol{atol: 1e-7, rtol: 1e-6})
	}
}

// cpPagedLayout is one rank's share of a paged cache: N sequences whose entries (some
// holes, positions increasing with gaps, as a cp rank holds every other chunk) live in
// scattered blocks, the step's new tokens written to some sequences' last entries.
type cpPagedLayout struct {
	NB                      int
	tables, kvp, slots      *tensor.Tensor
	qseq, qpos              *tensor.Tensor
	lastPos                 []int
	N, M, L, Sk, NQ, Sq, BS int
}

func newCPPagedLayout(rng *rand.Rand, idt tensor.DType, counts []int, bs, Sk, NQ, Sq int) cpPagedLayout {
	l := cpPagedLayout{N: len(counts), BS: bs, Sk: Sk, NQ: NQ, Sq: Sq}
	for _, c := range counts {
		l.L = max(l.L, c)
	}
	l.L += 2 // entries past every sequence's count: -1
	l.M = (l.L + bs - 1) / bs
	used := 0
	for _, c := range counts {
		used += (c + bs - 1) / bs
	}
	l.NB = used + 3
	perm := rng.Perm(l.NB)
	l.tables = tensor.New(idt, l.N, l.M)
	l.kvp = tensor.New(idt, l.N, l.L)
	l.lastPos = make([]int, l.N)
	next := 0
	for s, c := range counts {
		for m := range l.M {
			id := -1
			if m*bs < c {
				id = perm[next]
				next++
			}
			setInt(l.tables, s*l.M+m, id)
		}
		p := 1 + rng.IntN(3) // a query at position 0 sees no key
		for j := range l.L {
			if j >= c || j%7 == 3 { // past the count, or a hole
				setInt(l.kvp, s*l.L+j, -1)
				continue
			}
			setInt(l.kvp, s*l.L+j, p)
			l.lastPos[s] = p
			p += 1 + rng.IntN(3)
		}
	}
	// The step's tokens: the last entries of sequence 0 (or skipped).
	l.slots = tensor.New(idt, Sk)
	for t := range Sk {
		j := counts[0] - Sk + t
		slot := -1
		if j >= 0 && t%5 != 4 {
			slot = int(l.tables.At(j/bs))*bs + j%bs
		}
		setInt(l.slots, t, slot)
	}
	l.qseq = tensor.New(idt, NQ, Sq)
	l.qpos = tensor.New(idt, NQ, 1, Sq)
	for i := range NQ * Sq {
		s := rng.IntN(l.N)
		if rng.IntN(6) == 0 {
			s = -1 // no query
		}
		p := 0
		if s >= 0 {
			p = rng.IntN(l.lastPos[s] + 3) // some before every key, some past the last
		}
		switch {
		case i == 0: // a row of no sequence
			s = -1
		case i == 1 && NQ*Sq > 2: // a row before every key of its sequence
			s, p = 0, 0
		}
		setInt(l.qseq, i, s)
		setInt(l.qpos, i, p)
	}
	return l
}

type cpPagedCase struct {
	name                 string
	dt, cdt, idt         tensor.DType
	counts               []int
	bs, H, KV, D, Sk, wn int
	NQ, Sq               int
}

// paged_attention_partial on the GPU matches the CPU reference: o, lse and both caches,
// for sequences scattered through the cache with holes in their entries, queries of no
// sequence (q_seq -1) and queries before every key, block sizes 1 and 16, GQA 1, 4 and 20
// (more query heads than a block serves), windows, an odd head size, f32 and bf16 (also
// mixed: f32 queries over a bf16 cache).
func TestPagedAttentionPartialMatchesCPU(t *testing.T) {
	d := gpu(t)
	cases := []cpPagedCase{
		{"f32 bs16 gqa4 d64", tensor.F32, tensor.F32, tensor.I32, []int{40, 75, 3}, 16, 8, 2, 64, 4, 0, 2, 5},
		{"bf16 bs1 gqa20 d128 window", tensor.BF16, tensor.BF16, tensor.I64, []int{21, 9}, 1, 20, 1, 128, 3, 6, 1, 7},
		{"f32 over bf16 bs16 mha d40", tensor.F32, tensor.BF16, tensor.I64, []int{130, 17, 50, 1}, 16, 3, 3, 40, 6, 0, 3, 4},
		{"bf16 decode bs16 gqa4 d128", tensor.BF16, tensor.BF16, tensor.I32, []int{300, 64}, 16, 8, 2, 128, 1, 0, 2, 1},
	}
	rng := rand.New(rand.NewPCG(22, 3))
	for _, c := range cases {
		l := newCPPagedLayout(rng, c.idt, c.counts, c.bs, c.Sk, c.NQ, c.Sq)
		q := randTensor(rng, c.dt, []int{c.NQ, 1, c.H, c.Sq, c.D}, -2, 2)
		k := randTensor(rng, c.dt, []int{1, c.KV, c.Sk, c.D}, -2, 2)
		v := randTensor(rng, c.dt, []int{1, c.KV, c.Sk, c.D}, -1, 1)
		kc := randTensor(rng, c.cdt, []int{l.NB, c.bs, c.KV, c.D}, -2, 2)
		vc := randTensor(rng, c.cdt, []int{l.NB, c.bs, c.KV, c.D}, -1, 1)
		in := []*tensor.Tensor{q, k, v, l.qpos, kc, vc, l.slots, l.qseq, l.tables, l.kvp}
		dev := up(t, d, in...) // before the CPU writes the caches
		attrs := graph.Attrs{"scale": 1 / math.Sqrt(float64(c.D)), "window": c.wn}
		want := cpuOp(t, "paged_attention_partial", attrs, in...)
		out := like(t, d, want...)
		if err := PagedAttentionPartial(d, out[0], out[1], dev, float32(attrs.Float("scale")), c.wn); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		o, lse := down(t, d, out[0]), down(t, d, out[1])
		compare(t, "paged_attention_partial", c.name+" o", o, want[0], cpTol)
		compare(t, "paged_attention_partial", c.name+" lse", finiteLSE(lse), finiteLSE(want[1]), cpTol)
		checkUnseen(t, c.name, o, lse, want[1])
		compare(t, "paged_attention_partial", c.name+" k_cache", down(t, d, dev[4]), kc, exact)
		compare(t, "paged_attention_partial", c.name+" v_cache", down(t, d, dev[5]), vc, exact)
	}
}

// A bad slot, q_seq entry or block_tables entry is reported by the next Sync, naming it.
func TestPagedAttentionPartialBadIndices(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(22, 4))
	for _, tc := range []struct {
		name, want string
		spoil      func(l *cpPagedLayout)
	}{
		{"slot", "slot_mapping entry 1000", func(l *cpPagedLayout) { setInt(l.slots, 0, 1000) }},
		{"q_seq", "token_seq entry 7", func(l *cpPagedLayout) { setInt(l.qseq, 0, 7) }},
		{"table", "block table entry 99", func(l *cpPagedLayout) { setInt(l.tables, 0, 99); setInt(l.qseq, 1, 0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newCPPagedLayout(rng, tensor.I64, []int{20, 5}, 4, 2, 1, 3)
			tc.spoil(&l)
			q := randTensor(rng, tensor.F32, []int{1, 1, 2, 3, 32}, -1, 1)
			k := randTensor(rng, tensor.F32, []int{1, 1, 2, 32}, -1, 1)
			kc := randTensor(rng, tensor.F32, []int{l.NB, 4, 1, 32}, -1, 1)
			dev := up(t, d, q, k, k, l.qpos, kc, kc.Clone(), l.slots, l.qseq, l.tables, l.kvp)
			out := like(t, d, tensor.New(tensor.F32, 1, 1, 2, 3, 32), tensor.New(tensor.F32, 1, 1, 2, 3))
			if err := PagedAttentionPartial(d, out[0], out[1], dev, 0.2, 0); err != nil {
				t.Fatal(err)
			}
			err := d.Sync()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Sync = %v, want an error saying %q", err, tc.want)
			}
			if err := d.Sync(); err != nil {
				t.Fatalf("the error word was not cleared: %v", err)
			}
		})
	}
}

// The cp kernels compile for the device's architecture (or sm_90 without one) in every
// class the launchers instantiate; NVRTC only, no GPU needed.
func TestCPKernelsCompile(t *testing.T) {
	arch := nvrtcArch(t)
	var extra string
	for _, x := range []string{"F32, f32", "BF16, bf16"} {
		for _, dl := range []int{1, 2, 3, 4, 8} {
			extra += fmt.Sprintf("CP_PARTIAL(%s, %d)\n", x, dl)
		}
		for _, c := range []string{"F32, f32", "BF16, bf16"} {
			extra += fmt.Sprintf("CP_WRITE(%s, %s)\nCP_PAGED(%s, %s, 4)\n", x, c, x, c)
		}
	}
	if compileOnly(t, "cp.cu", extra, arch) == nil {
		t.Fatal("cp.cu does not compile")
	}
}

// fakeExchanges is the communicator of rank 0 of a group whose every rank holds the same
// tensors, on one GPU: the ring brings back this rank's own x, and all_to_all's piece j
// from every rank is this rank's piece.
type fakeExchanges struct{ calls map[string]int }

func (f fakeExchanges) AllReduce(dist.Group, cubind.DevicePtr, cubind.DevicePtr, int, tensor.DType, dist.ReduceOp, cubind.Stream) error {
	return fmt.Errorf("fake: no all_reduce")
}

func (f fakeExchanges) AllGather(dist.Group, cubind.DevicePtr, cubind.DevicePtr, int, tensor.DType, cubind.Stream) error {
	return fmt.Errorf("fake: no all_gather")
}

func (f fakeExchanges) ReduceScatter(dist.Group, cubind.DevicePtr, cubind.DevicePtr, int, tensor.DType, dist.ReduceOp, cubind.Stream) error {
	return fmt.Errorf("fake: no reduce_scatter")
}

func (f fakeExchanges) Wait(_ context.Context, done cubind.Event) error { return done.Synchronize() }

func (f fakeExchanges) SendRecv(g dist.Group, send, recv cubind.DevicePtr, count int, dt tensor.DType, to, from int, s cubind.Stream) error {
	f.calls["send_recv"]++
	if to != (g.Index+1)%g.Size() || from != (g.Index+g.Size()-1)%g.Size() {
		return fmt.Errorf("fake: send_recv to %d from %d at index %d of %d", to, from, g.Index, g.Size())
	}
	return cubind.MemcpyDtoDAsync(recv, send, uint64(count*dt.Size()), s)
}

func (f fakeExchanges) AllToAll(g dist.Group, send, recv cubind.DevicePtr, per int, dt tensor.DType, s cubind.Stream) error {
	f.calls["all_to_all"]++
	b := cubind.DevicePtr(per * dt.Size())
	for j := range g.Size() {
		if err := cubind.MemcpyDtoDAsync(recv+cubind.DevicePtr(j)*b, send+cubind.DevicePtr(g.Index)*b, uint64(b), s); err != nil {
			return err
		}
	}
	return nil
}

// hostAllToAll is all_to_all's result on the rank at index idx of a group of G ranks whose
// inputs are xs[j]: piece idx (along sa) of every rank's x, concatenated along ca.
func hostAllToAll(xs []*tensor.Tensor, idx, sa, ca int) *tensor.Tensor {
	G := len(xs)
	x := xs[0]
	piece := slices.Clone(x.Shape)
	piece[sa] /= G
	shape := slices.Clone(piece)
	shape[ca] *= G
	y := tensor.New(x.DType, shape...)
	coord := make([]int, len(shape))
	for i := range y.Numel() {
		r := i
		for a := len(shape) - 1; a >= 0; a-- {
			coord[a], r = r%shape[a], r/shape[a]
		}
		j := coord[ca] / piece[ca]
		src := slices.Clone(coord)
		src[ca] %= piece[ca]
		src[sa] += idx * piece[sa]
		off := 0
		for a := range src {
			off = off*x.Shape[a] + src[a]
		}
		switch x.DType {
		case tensor.F32:
			y.F32[i] = xs[j].F32[off]
		case tensor.BF16:
			y.Half[i] = xs[j].Half[off]
		case tensor.I64:
			y.I64[i] = xs[j].I64[off]
		}
	}
	return y
}

// exchangeGraph is ring_shift(x) and all_to_all(x) over cp of size G for each (split,
// concat) pair of axes.
func exchangeGraph(t *testing.T, dt tensor.DType, shape []int, G int, axes [][2]int) *graph.Graph {
	t.Helper()
	b := graph.NewBuilder("exchanges")
	x := b.Input("x", dt, graph.Dims(shape...))
	grp := graph.Attrs{"group": "cp", "group_size": G}
	outs := []*graph.Value{b.Op("ring_shift", grp, x)}
	for _, a := range axes {
		outs = append(outs, b.Op("all_to_all", graph.Attrs{"group": "cp", "group_size": G, "split_axis": a[0], "concat_axis": a[1]}, x))
	}
	b.Output(outs...)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// cpAxes are all_to_all's (split, concat) pairs of the tests: no layout copy, a copy
// before, after, and both; the last is how rewrite_cp_attention exchanges heads.
var cpAxes = [][2]int{{0, 0}, {1, 0}, {0, 2}, {2, 1}, {1, 2}}

// ring_shift and all_to_all compiled into a program on one GPU: with a group of one rank
// (a copy, no communicator call) and, through a fake communicator that plays every rank
// holding the same x, with a group of two (every layout copy of all_to_all).
func TestCPExchangesOneGPU(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(22, 5))
	for _, G := range []int{1, 2} {
		for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.I64} {
			t.Run(fmt.Sprintf("cp=%d/%s", G, dt), func(t *testing.T) {
				shape := []int{4, 6, 2}
				x := randInts(rng, tensor.I64, shape, 1000)
				if dt != tensor.I64 {
					x = randTensor(rng, tensor.F32, shape, -3, 3).Cast(dt)
				}
				mesh, err := dist.ParseMesh(fmt.Sprintf("cp=%d", G))
				if err != nil {
					t.Fatal(err)
				}
				fake := fakeExchanges{calls: map[string]int{}}
				p, err := Compile(context.Background(), d, exchangeGraph(t, dt, shape, G, cpAxes), nil, &Options{Comm: fake, Mesh: mesh})
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
				out, err := p.Run(context.Background(), map[string]*tensor.Tensor{"x": x})
				if err != nil {
					t.Fatal(err)
				}
				xs := slices.Repeat([]*tensor.Tensor{x}, G)
				compare(t, "ring_shift", fmt.Sprintf("cp=%d %s", G, dt), out[0], x, exact)
				for i, a := range cpAxes {
					compare(t, "all_to_all", fmt.Sprintf("cp=%d %s axes %v", G, dt, a), out[1+i], hostAllToAll(xs, 0, a[0], a[1]), exact)
				}
				wantCalls := map[string]int{}
				if G > 1 {
					wantCalls = map[string]int{"send_recv": 1, "all_to_all": len(cpAxes)}
				}
				if fmt.Sprint(fake.calls) != fmt.Sprint(wantCalls) {
					t.Errorf("communicator calls %v, want %v", fake.calls, wantCalls)
				}
			})
		}
	}
}

// ringGraph is one step of ring attention on a rank: the partial attention of q over the
// rank's own keys, the keys passed one step around the cp ring (ring_shift), the partial
// attention over the keys received, and the two merged by log-sum-exp.
func ringGraph(t *testing.T, G int, q, k, v, qp, kp *tensor.Tensor, scale float64, window int) *graph.Graph {
	t.Helper()
	b := graph.NewBuilder("ring")
	in := func(name string, x *tensor.Tensor) *graph.Value {
		return b.Input(name, x.DType, graph.Dims(x.Shape...))
	}
	qv, kv, vv, qpv, kpv := in("q", q), in("k", k), in("v", v), in("q_pos", qp), in("k_pos", kp)
	attrs := graph.Attrs{"scale": scale, "window": window}
	own := b.Apply("attention_partial", attrs, qv, kv, vv, qpv, kpv)
	grp := graph.Attrs{"group": "cp", "group_size": G}
	kr, vr, pr := b.Op("ring_shift", grp, kv), b.Op("ring_shift", grp, vv), b.Op("ring_shift", grp, kpv)
	other := b.Apply("attention_partial", attrs, qv, kr, vr, qpv, pr)
	b.Output(b.Apply("attention_merge", nil, own[0], own[1], other[0], other[1])...)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// cpKeysOf stacks the ranks' key blocks along dimension 0 ([NK,...] each).
func cpKeysOf(xs ...*tensor.Tensor) *tensor.Tensor {
	shape := slices.Clone(xs[0].Shape)
	shape[0] = 0
	for _, x := range xs {
		shape[0] += x.Shape[0]
	}
	y := tensor.New(xs[0].DType, shape...)
	y.F32, y.Half, y.I32, y.I64 = y.F32[:0], y.Half[:0], y.I32[:0], y.I64[:0]
	for _, x := range xs {
		y.F32, y.Half, y.I32, y.I64 = append(y.F32, x.F32...), append(y.Half, x.Half...), append(y.I32, x.I32...), append(y.I64, x.I64...)
	}
	return y
}

// One step of ring attention through a compiled program on one GPU (cp=1: the ring brings
// the rank's keys back, so the merge of the two halves is attention over the keys twice,
// which the CPU's attention_partial over both copies gives), eagerly and through CUDA graph
// replays.
func TestCPRingGraphOneGPU(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(22, 6))
	c := cpPartialCase{"ring", tensor.BF16, tensor.I64, 1, 1, 8, 2, 24, 24, 1, 64, 0, true}
	in := c.inputs(rng)
	scale := 1 / math.Sqrt(float64(c.D))
	want := cpuOp(t, "attention_partial", graph.Attrs{"scale": scale, "window": 0},
		in[0], cpKeysOf(in[1], in[1]), cpKeysOf(in[2], in[2]), in[3], cpKeysOf(in[4], in[4]))
	mesh, err := dist.ParseMesh("cp=1")
	if err != nil {
		t.Fatal(err)
	}
	p, err := Compile(context.Background(), d, ringGraph(t, 1, in[0], in[1], in[2], in[3], in[4], scale, 0), nil,
		&Options{Comm: fakeExchanges{calls: map[string]int{}}, Mesh: mesh, Graphs: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	feeds := map[string]*tensor.Tensor{"q": in[0], "k": in[1], "v": in[2], "q_pos": in[3], "k_pos": in[4]}
	for run := range 4 {
		out, err := p.Run(context.Background(), feeds)
		if err != nil {
			t.Fatal(err)
		}
		compare(t, "cp_ring_graph", fmt.Sprintf("run %d o", run), out[0], want[0], cpTol)
		compare(t, "cp_ring_graph", fmt.Sprintf("run %d lse", run), finiteLSE(out[1]), finiteLSE(want[1]), cpTol)
	}
}

// Two GPUs, two ranks of cp=2 through NCCL: ring_shift and all_to_all of different inputs
// per rank, and one step of ring attention (each rank's queries over its own keys and the
// other rank's, merged) against the CPU's attention_partial over both ranks' keys.
// Skips with fewer than two GPUs (issue 23 runs it).
func TestCPTwoGPUs(t *testing.T) {
	devs := peerDevs(t)
	mesh, err := dist.ParseMesh("cp=2")
	if err != nil {
		t.Fatal(err)
	}
	ws, err := nccl.InitAll([]int{0, 1}, mesh)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, w := range ws {
			if err := w.Close(); err != nil {
				t.Error(err)
			}
		}
	}()
	rng := rand.New(rand.NewPCG(22, 7))
	shape := []int{4, 6, 2}
	xs := []*tensor.Tensor{randTensor(rng, tensor.BF16, shape, -3, 3), randTensor(rng, tensor.BF16, shape, -3, 3)}
	c := cpPartialCase{"ring2", tensor.F32, tensor.I64, 1, 1, 4, 2, 19, 19, 1, 64, 0, true}
	ins := [][]*tensor.Tensor{c.inputs(rng), c.inputs(rng)}
	scale := 1 / math.Sqrt(float64(c.D))
	progs := make([][2]*Program, 2)
	for r, d := range devs {
		opts := &Options{Comm: ncclRank{ws[r]}, Mesh: mesh, Rank: r}
		ex, err := Compile(context.Background(), d, exchangeGraph(t, tensor.BF16, shape, 2, cpAxes), nil, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer ex.Close()
		in := ins[r]
		ring, err := Compile(context.Background(), d, ringGraph(t, 2, in[0], in[1], in[2], in[3], in[4], scale, 0), nil, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer ring.Close()
		progs[r] = [2]*Program{ex, ring}
	}
	outs := make([][][]*tensor.Tensor, 2)
	err = onRanks(2, func(r int) error {
		a, err := progs[r][0].Run(context.Background(), map[string]*tensor.Tensor{"x": xs[r]})
		if err != nil {
			return err
		}
		in := ins[r]
		b, err := progs[r][1].Run(context.Background(), map[string]*tensor.Tensor{"q": in[0], "k": in[1], "v": in[2], "q_pos": in[3], "k_pos": in[4]})
		outs[r] = [][]*tensor.Tensor{a, b}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for r := range 2 {
		compare(t, "ring_shift", fmt.Sprintf("cp=2 rank %d", r), outs[r][0][0], xs[1-r], exact)
		for i, a := range cpAxes {
			compare(t, "all_to_all", fmt.Sprintf("cp=2 rank %d axes %v", r, a), outs[r][0][1+i], hostAllToAll(xs, r, a[0], a[1]), exact)
		}
		in, other := ins[r], ins[1-r]
		want := cpuOp(t, "attention_partial", graph.Attrs{"scale": scale, "window": 0},
			in[0], cpKeysOf(in[1], other[1]), cpKeysOf(in[2], other[2]), in[3], cpKeysOf(in[4], other[4]))
		compare(t, "cp_ring_graph", fmt.Sprintf("cp=2 rank %d o", r), outs[r][1][0], want[0], cpTol)
		compare(t, "cp_ring_graph", fmt.Sprintf("cp=2 rank %d lse", r), finiteLSE(outs[r][1][1]), finiteLSE(want[1]), cpTol)
	}
}

// TestCPTimings times the cp kernels with LOOM_CUDA_TIMINGS=1 (bf16, H32 KV8 D128): a ring
// step's attention_partial over a block of keys every query sees (the off-diagonal blocks
// of ring attention) against sdpa's causal attention of the same length, decode over a
// rank's paged share with paged_attention_partial, and attention_merge.
func TestCPTimings(t *testing.T) {
	d := gpu(t)
	if os.Getenv("LOOM_CUDA_TIMINGS") != "1" {
		t.Skip("set LOOM_CUDA_TIMINGS=1 to time the kernels")
	}
	const H, KV, D = 32, 8, 128
	zeros := func(dt tensor.DType, shape ...int) *Tensor { return zeroed(t, d, dt, shape...) }
	for _, S := range []int{512, 2048, 8192} {
		q, k, v := zeros(tensor.BF16, 1, 1, H, S, D), zeros(tensor.BF16, 1, 1, KV, S, D), zeros(tensor.BF16, 1, 1, KV, S, D)
		qp, kp := tensor.New(tensor.I64, 1, 1, S), tensor.New(tensor.I64, 1, 1, S)
		for i := range S {
			qp.I64[i], kp.I64[i] = int64(S+i), int64(i)
		}
		pos := up(t, d, qp, kp)
		o, lse := zeros(tensor.F32, 1, 1, H, S, D), zeros(tensor.F32, 1, 1, H, S)
		per, err := wallTime(d, 2, 10, func() error { return AttentionPartial(d, o, lse, q, k, v, pos[0], pos[1], 0.088, 0) })
		if err != nil {
			t.Fatal(err)
		}
		flops := 4.0 * D * H * float64(S) * float64(S)
		q4, _ := q.View(1, H, S, D)
		k4, _ := k.View(1, KV, S, D)
		v4, _ := v.View(1, KV, S, D)
		p2, _ := pos[1].View(1, S)
		out := zeros(tensor.BF16, 1, H, S, D)
		ref, err := wallTime(d, 2, 10, func() error { return SDPA(d, out, q4, k4, v4, p2, 0.088, 0) })
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("attention_partial bf16 H32 KV8 D128 Sq=Sk=%-5d %9.1f µs  %.1f TFLOP/s; sdpa causal S=%d %9.1f µs  %.1f TFLOP/s",
			S, per.Seconds()*1e6, flops/per.Seconds()/1e12, S, ref.Seconds()*1e6, flops/2/ref.Seconds()/1e12)
	}
	rng := rand.New(rand.NewPCG(22, 8))
	for _, tc := range []struct{ N, ctx int }{{1, 4096}, {8, 4096}, {64, 1024}} {
		counts := slices.Repeat([]int{tc.ctx}, tc.N)
		l := newCPPagedLayout(rng, tensor.I32, counts, 16, 1, 2, tc.N)
		for i := range 2 * tc.N { // every query reads all of its sequence's keys
			setInt(l.qseq, i, i%tc.N)
			setInt(l.qpos, i, 1<<30)
		}
		idx := up(t, d, l.qpos, l.slots, l.qseq, l.tables, l.kvp)
		in := []*Tensor{zeros(tensor.BF16, 2, 1, H, tc.N, D), zeros(tensor.BF16, 1, KV, 1, D), zeros(tensor.BF16, 1, KV, 1, D), idx[0],
			zeros(tensor.BF16, l.NB, 16, KV, D), zeros(tensor.BF16, l.NB, 16, KV, D), idx[1], idx[2], idx[3], idx[4]}
		o, lse := zeros(tensor.F32, 2, 1, H, tc.N, D), zeros(tensor.F32, 2, 1, H, tc.N)
		per, err := wallTime(d, 2, 10, func() error { return PagedAttentionPartial(d, o, lse, in, 0.088, 0) })
		if err != nil {
			t.Fatal(err)
		}
		bytes := 2.0 * float64(tc.N) * float64(tc.ctx) * KV * D * 2 * 2 // 2 query blocks, K and V, bf16
		t.Logf("paged_attention_partial decode bf16 H32 KV8 D128 2x%d queries ctx %-5d %9.1f µs  %.0f GB/s of K/V read",
			tc.N, tc.ctx, per.Seconds()*1e6, bytes/per.Seconds()/1e9)
	}
	rows := H * 8192
	a, b := zeros(tensor.F32, rows, D), zeros(tensor.F32, rows, D)
	la, lb := zeros(tensor.F32, rows), zeros(tensor.F32, rows)
	o, lse := zeros(tensor.F32, rows, D), zeros(tensor.F32, rows)
	per, err := wallTime(d, 2, 10, func() error { return AttentionMerge(d, o, lse, a, la, b, lb) })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("attention_merge f32 %d rows of %d %9.1f µs  %.0f GB/s", rows, D, per.Seconds()*1e6, float64(rows)*(3*D+3)*4/per.Seconds()/1e9)
}
