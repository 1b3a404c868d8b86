package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// setInt sets element i of an i32 or i64 tensor.
func setInt(t *tensor.Tensor, i, v int) {
	if t.DType == tensor.I64 {
		t.I64[i] = int64(v)
	} else {
		t.I32[i] = int32(v)
	}
}

// pagedLayout is the index inputs of one paged_attention step: sequence i has ctx[i]
// positions cached and nw[i] new tokens, its blocks scattered through a cache of NB blocks.
type pagedLayout struct {
	S, N, M, NB              int
	pos, slots, seqs, tables *tensor.Tensor
}

// newPagedLayout lays out the step: tokens of each sequence in order (interleaved round
// robin when interleave is set), unused table entries pad (-1 for ragged padding), and
// spare extra blocks in the cache.
func newPagedLayout(rng *rand.Rand, idt tensor.DType, ctx, nw []int, bs, spare, pad int, interleave bool) pagedLayout {
	var l pagedLayout
	l.N = len(ctx)
	need := 0
	for i := range ctx {
		l.S += nw[i]
		nb := (ctx[i] + nw[i] + bs - 1) / bs
		l.M = max(l.M, nb)
		need += nb
	}
	l.M = max(l.M, 1)
	l.NB = need + spare
	perm := rng.Perm(l.NB)
	l.tables = tensor.New(idt, l.N, l.M)
	for i := range l.tables.Numel() {
		setInt(l.tables, i, pad)
	}
	first := make([]int, l.N) // the sequence's first block in perm
	next := 0
	for i := range ctx {
		first[i] = next
		for b := range (ctx[i] + nw[i] + bs - 1) / bs {
			setInt(l.tables, i*l.M+b, perm[next])
			next++
		}
	}
	l.pos, l.slots, l.seqs = tensor.New(idt, 1, l.S), tensor.New(idt, l.S), tensor.New(idt, l.S)
	tok := 0
	add := func(i, j int) {
		p := ctx[i] + j
		setInt(l.pos, tok, p)
		setInt(l.seqs, tok, i)
		setInt(l.slots, tok, perm[first[i]+p/bs]*bs+p%bs)
		tok++
	}
	if interleave {
		for j := 0; tok < l.S; j++ {
			for i := range ctx {
				if j < nw[i] {
					add(i, j)
				}
			}
		}
	} else {
		for i := range ctx {
			for j := range nw[i] {
				add(i, j)
			}
		}
	}
	return l
}

// pagedCase is one paged_attention comparison with the CPU.
type pagedCase struct {
	name      string
	ctx, nw   []int
	bs, KV, G int
	D, window int
	dt, cdt   tensor.DType // activations, caches
	idt       tensor.DType
	pad       int // unused table entries
	inter     bool
	// tokenMajor asks for the output [1,S,H,D] (paged_attention's token_major).
	tokenMajor bool
}

// pagedKernels lists the kernel instantiations a case uses, for precompile.
func (c pagedCase) kernels() []string {
	xn, cn := dtypeName(c.dt), dtypeName(c.cdt)
	X, C := strings.ToUpper(xn), strings.ToUpper(cn)
	S, N, M := 0, len(c.ctx), 0
	for i := range c.ctx {
		S += c.nw[i]
		M = max(M, (c.ctx[i]+c.nw[i]+c.bs-1)/c.bs)
	}
	out := []string{fmt.Sprintf("PAGED_WRITE(%s, %s, %s, %s)", X, xn, C, cn)}
	if S <= N {
		p := planDecode(c.KV*c.G, c.KV, S, c.D, M, c.bs, c.cdt.Size())
		inst, _ := decodeKernel(xn, cn, p)
		out = append(out, inst)
		if p.splits > 1 {
			out = append(out, fmt.Sprintf("PAGED_COMBINE(%s, %s)", X, xn))
		}
	} else {
		inst, _, _ := prefillKernel(xn, cn, c.D, c.cdt.Size())
		out = append(out, inst)
	}
	return out
}

// precompile compiles the paged.cu instantiations into the kernel cache in parallel, so
// that the tests that load them one at a time find them there.
func precompile(t *testing.T, d *Device, file string, extras []string) {
	t.Helper()
	seen := map[string]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, len(extras))
	start := time.Now()
	for _, e := range extras {
		if seen[e] {
			continue
		}
		seen[e] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := d.comp.cubin(file, e); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("compiled %d instantiations of %s in %v", len(seen), file, time.Since(start).Round(time.Millisecond))
}

// pagedWorkspace allocates the workspace PagedAttention needs for inputs in (nil for none).
func pagedWorkspace(t *testing.T, d *Device, in []*Tensor) *Tensor {
	t.Helper()
	shapes := make([][]int, len(in))
	for i, x := range in {
		shapes[i] = x.Shape
	}
	n := PagedAttentionWorkspace(shapes)
	if n == 0 {
		return nil
	}
	return like(t, d, tensor.New(tensor.Bool, int(n)))[0]
}

// run compares one case with the CPU reference: the output and both caches.
func (c pagedCase) run(t *testing.T, d *Device, rng *rand.Rand) {
	t.Helper()
	l := newPagedLayout(rng, c.idt, c.ctx, c.nw, c.bs, 3, c.pad, c.inter)
	H := c.KV * c.G
	q := randTensor(rng, c.dt, []int{1, H, l.S, c.D}, -2, 2)
	k := randTensor(rng, c.dt, []int{1, c.KV, l.S, c.D}, -2, 2)
	v := randTensor(rng, c.dt, []int{1, c.KV, l.S, c.D}, -1, 1)
	kc := randTensor(rng, c.cdt, []int{l.NB, c.bs, c.KV, c.D}, -2, 2)
	vc := randTensor(rng, c.cdt, []int{l.NB, c.bs, c.KV, c.D}, -1, 1)
	in := up(t, d, q, k, v, l.pos, kc, vc, l.slots, l.seqs, l.tables) // before the CPU updates the caches
	scale := 1 / math.Sqrt(float64(c.D))
	attrs := graph.Attrs{"scale": scale, "window": c.window}
	if c.tokenMajor {
		attrs["token_major"] = 1
	}
	want := cpuOp(t, "paged_attention", attrs, q, k, v, l.pos, kc, vc, l.slots, l.seqs, l.tables)[0]
	out := like(t, d, want)
	if err := PagedAttention(d, out[0], in, pagedWorkspace(t, d, in), float32(scale), c.window, c.tokenMajor); err != nil {
		t.Fatal(err)
	}
	tl := tol{atol: 2e-5, rtol: 1e-4}
	if c.dt == tensor.BF16 || c.cdt == tensor.BF16 {
		tl = tol{atol: 1.0 / 64, rtol: 1.0 / 64}
	}
	compare(t, "paged_attention", c.name, down(t, d, out[0]), want, tl)
	compare(t, "paged_kcache", c.name, down(t, d, in[4]), kc, tol{})
	compare(t, "paged_vcache", c.name, down(t, d, in[5]), vc, tol{})
}

func runPagedCases(t *testing.T, seed uint64, cases []pagedCase) {
	d := gpu(t)
	var extras []string
	for _, c := range cases {
		extras = append(extras, c.kernels()...)
	}
	precompile(t, d, "paged.cu", extras)
	rng := rand.New(rand.NewPCG(seed, 11))
	for _, c := range cases {
		c.run(t, d, rng)
	}
}

// paged_attention on the GPU matches the CPU reference kernel: output and both caches, for
// several sequences whose blocks are scattered through the cache, decoding (one new token
// after a cached context) or prefilling (a whole prompt), with block sizes 1 and 16, GQA
// 1, 2 and 4, windows 0 and 3, and an odd head size (40).
func TestPagedAttentionMatchesCPU(t *testing.T) {
	var cases []pagedCase
	for _, bs := range []int{1, 16} {
		for _, group := range []int{1, 2, 4} {
			for _, window := range []int{0, 3} {
				for _, mode := range []string{"decode", "prefill"} {
					for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
						idt := tensor.I32
						if group == 2 {
							idt = tensor.I64
						}
						ctx, nw := []int{5, 17, 33}, []int{1, 1, 1}
						if mode == "prefill" {
							ctx, nw = []int{0, 0, 3}, []int{7, 20, 9}
						}
						cases = append(cases, pagedCase{
							name: fmt.Sprintf("%s %s BS%d G%d window %d", dt, mode, bs, group, window),
							ctx:  ctx, nw: nw, bs: bs, KV: 2, G: group, D: 40, window: window,
							dt: dt, cdt: dt, idt: idt, pad: -1,
						})
					}
				}
			}
		}
	}
	runPagedCases(t, 7, cases)
}

// The decode kernel (one new token per sequence) matches the CPU for 1, 3 and 64 sequences
// of contexts 1..700 with ragged -1 padding in block_tables, GQA 1, 4 and 6, head sizes 64
// and 128, with and without a window, f32 and bf16 (and f32 activations over a bf16 cache).
func TestPagedDecodeMatchesCPU(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 9))
	var cases []pagedCase
	i := 0
	for _, N := range []int{1, 3, 64} {
		for _, G := range []int{1, 4, 6} {
			for _, D := range []int{64, 128} {
				for _, dt := range [][2]tensor.DType{{tensor.F32, tensor.F32}, {tensor.BF16, tensor.BF16}, {tensor.F32, tensor.BF16}} {
					if dt[0] != dt[1] && (G != 4 || D != 128) {
						continue
					}
					ctx, nw := make([]int, N), make([]int, N)
					for s := range N {
						ctx[s], nw[s] = rng.IntN(700), 1
					}
					if N == 1 {
						ctx[0] = []int{0, 699, 250}[i%3]
					}
					window := []int{0, 37}[i%2]
					i++
					cases = append(cases, pagedCase{
						name: fmt.Sprintf("decode N%d G%d D%d %s/%s window %d", N, G, D, dt[0], dt[1], window),
						ctx:  ctx, nw: nw, bs: 16, KV: 2, G: G, D: D, window: window,
						dt: dt[0], cdt: dt[1], idt: tensor.I32, pad: -1,
					})
				}
			}
		}
	}
	runPagedCases(t, 13, cases)
}

// The prefill kernel matches the CPU for chunks of several tokens of several sequences
// continuing cached contexts (one of them a single decode token in the same step), tokens
// of sequences in order or interleaved, GQA 1, 4 and 6, head sizes 64 and 128, windows 0
// and 20, f32 and bf16.
func TestPagedPrefillMatchesCPU(t *testing.T) {
	var cases []pagedCase
	i := 0
	for _, G := range []int{1, 4, 6} {
		for _, D := range []int{64, 128} {
			for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
				inter := i%3 == 2
				window := []int{0, 20}[i%2]
				i++
				cases = append(cases, pagedCase{
					name: fmt.Sprintf("prefill G%d D%d %s window %d interleaved %v", G, D, dt, window, inter),
					ctx:  []int{0, 5, 100, 33, 250}, nw: []int{17, 1, 40, 3, 70}, bs: 16, KV: 2, G: G, D: D,
					window: window, dt: dt, cdt: dt, idt: tensor.I64, pad: -1, inter: inter,
				})
			}
		}
	}
	runPagedCases(t, 17, cases)
}

// A slot_mapping entry outside the cache and a block_tables entry outside the cache's
// blocks are reported by the next Sync with the bad value (decode and prefill kernels);
// the Sync after that is clean.
func TestPagedAttentionBadIndices(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(21, 23))
	for _, tc := range []struct {
		name    string
		nw      []int
		corrupt func(l *pagedLayout)
		want    string
	}{
		{"decode bad slot", []int{1, 1}, func(l *pagedLayout) { setInt(l.slots, 1, 999) }, "slot_mapping entry 999 (token 1) outside the cache's"},
		{"decode bad block", []int{1, 1}, func(l *pagedLayout) { setInt(l.tables, l.M+1, 123) }, "block table entry 123 (sequence 1) outside the cache's"},
		{"prefill bad block", []int{3, 5}, func(l *pagedLayout) { setInt(l.tables, 0, 123) }, "block table entry 123 (sequence 0) outside the cache's"},
		{"prefill negative block", []int{3, 5}, func(l *pagedLayout) { setInt(l.tables, l.M, -1) }, "block table entry -1 (sequence 1) outside the cache's"},
		{"prefill bad sequence", []int{3, 5}, func(l *pagedLayout) { setInt(l.seqs, 2, 7) }, "token_seq entry 7 (token 2) outside block_tables' 2 rows"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newPagedLayout(rng, tensor.I32, []int{20, 40}, tc.nw, 16, 2, -1, false)
			tc.corrupt(&l)
			const KV, G, D = 2, 2, 64
			q := randTensor(rng, tensor.BF16, []int{1, KV * G, l.S, D}, -1, 1)
			k := randTensor(rng, tensor.BF16, []int{1, KV, l.S, D}, -1, 1)
			kc := randTensor(rng, tensor.BF16, []int{l.NB, 16, KV, D}, -1, 1)
			in := up(t, d, q, k, k, l.pos, kc, kc.Clone(), l.slots, l.seqs, l.tables)
			out := like(t, d, q)
			if err := PagedAttention(d, out[0], in, pagedWorkspace(t, d, in), 0.125, 0, false); err != nil {
				t.Fatal(err)
			}
			err := d.Sync()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Sync: %v, want an error containing %q", err, tc.want)
			}
			want := fmt.Sprintf("outside the cache's %d blocks", l.NB)
			if strings.Contains(tc.want, "block table") && err != nil && !strings.Contains(err.Error(), want) {
				t.Errorf("Sync: %v, want it to name the cache's %d blocks", err, l.NB)
			}
			if err := d.Sync(); err != nil {
				t.Errorf("second Sync: %v", err)
			}
		})
	}
}

// The workspace is 0 for prefill steps whose row blocks fill the GPU and for decode steps
// with one split, and covers the splits' partials otherwise.
func TestPagedAttentionWorkspace(t *testing.T) {
	shapes := func(H, KV, S, D, N, M int) [][]int {
		return [][]int{{1, H, S, D}, {1, KV, S, D}, {1, KV, S, D}, {1, S}, {64, 16, KV, D}, {64, 16, KV, D}, {S}, {S}, {N, M}}
	}
	for _, tc := range []struct {
		H, KV, S, D, N, M int
		splits            int
	}{
		{32, 8, 1, 128, 1, 512, 16},   // long context, one sequence: 16 splits of 8 warps
		{32, 8, 1, 128, 1, 8, 4},      // short context: 4 splits of 8 warps (the f32 cache's plan)
		{32, 8, 16, 128, 16, 8, 1},    // 16 short contexts: no split
		{32, 8, 256, 128, 256, 64, 1}, // a full batch: no split
		{32, 8, 100, 128, 4, 64, 0},   // prefill of short contexts: no workspace
		{32, 8, 32, 128, 1, 256, 4},   // 32 tokens after 4,000 cached: 4 splits of 1,024 positions
		{32, 8, 4096, 128, 1, 512, 0}, // a long chunk: its blocks fill the GPU
	} {
		got := PagedAttentionWorkspace(shapes(tc.H, tc.KV, tc.S, tc.D, tc.N, tc.M))
		want := int64(0)
		if tc.splits > 1 {
			want = int64(tc.S*tc.H*tc.splits*(tc.D+2)) * 4
		}
		if got != want {
			t.Errorf("%+v: workspace %d, want %d", tc, got, want)
		}
	}
}

// The paged kernels compile with NVRTC for every configuration the tests use; this needs
// NVRTC only, not a GPU.
func TestPagedKernelsCompile(t *testing.T) {
	arch := nvrtcArch(t)
	cases := []pagedCase{
		{ctx: []int{5}, nw: []int{1}, bs: 16, KV: 8, G: 4, D: 128, dt: tensor.BF16, cdt: tensor.BF16},
		{ctx: []int{5}, nw: []int{1}, bs: 16, KV: 2, G: 6, D: 256, dt: tensor.F32, cdt: tensor.F32},
		{ctx: []int{5}, nw: []int{9}, bs: 16, KV: 2, G: 1, D: 40, dt: tensor.F32, cdt: tensor.BF16},
	}
	for _, c := range cases {
		for _, e := range c.kernels() {
			compileOnly(t, "paged.cu", e, arch)
		}
	}
}

// gather on the GPU matches the CPU along the first, middle and last axes.
func TestGatherMatchesCPU(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(3, 5))
	for _, tc := range []struct {
		shape []int
		axis  int
		idx   []int
		dt    tensor.DType
	}{
		{[]int{1, 9, 33}, 1, []int{8, 0, 3}, tensor.F32},
		{[]int{4, 5}, 0, []int{2, 2, 1, 3}, tensor.BF16},
		{[]int{2, 3, 7}, 2, []int{6}, tensor.F32},
	} {
		x := randTensor(rng, tc.dt, tc.shape, -1, 1)
		idx := tensor.New(tensor.I32, len(tc.idx))
		for i, v := range tc.idx {
			idx.I32[i] = int32(v)
		}
		want := cpuOp(t, "gather", graph.Attrs{"axis": tc.axis}, x, idx)[0]
		in := up(t, d, x, idx)
		out := like(t, d, want)
		if err := Gather(d, out[0], in[0], in[1], tc.axis); err != nil {
			t.Fatal(err)
		}
		compare(t, "gather", fmt.Sprintf("%s%v axis %d", tc.dt, tc.shape, tc.axis), down(t, d, out[0]), want, tol{})
	}
}

// TestPagedTimings times paged_attention (cache write, attention and, with splits, the
// merge) on Llama-3.1-8B shapes (H 32, KV 8, D 128, bf16 cache of blocks of 16) when
// LOOM_CUDA_TIMINGS=1, logging µs per call and the bandwidth of the cached K and V it reads.
func TestPagedTimings(t *testing.T) {
	d := gpu(t)
	if os.Getenv("LOOM_CUDA_TIMINGS") != "1" {
		t.Skip("set LOOM_CUDA_TIMINGS=1 to time the kernels")
	}
	const H, KV, D, BS = 32, 8, 128, 16
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct{ N, ctx, nw int }{
		{1, 128, 1}, {1, 1024, 1}, {1, 8192, 1}, {64, 256, 1}, {64, 1024, 1}, {1, 0, 2048}, {4, 1024, 512},
	} {
		ctx, nw := make([]int, tc.N), make([]int, tc.N)
		for i := range ctx {
			ctx[i], nw[i] = tc.ctx, tc.nw
		}
		l := newPagedLayout(rng, tensor.I32, ctx, nw, BS, 0, -1, false)
		zeros := func(dt tensor.DType, shape ...int) *Tensor { return zeroed(t, d, dt, shape...) }
		q, k, v := zeros(tensor.BF16, 1, H, l.S, D), zeros(tensor.BF16, 1, KV, l.S, D), zeros(tensor.BF16, 1, KV, l.S, D)
		kc, vc := zeros(tensor.BF16, l.NB, BS, KV, D), zeros(tensor.BF16, l.NB, BS, KV, D)
		idx := up(t, d, l.pos, l.slots, l.seqs, l.tables)
		in := []*Tensor{q, k, v, idx[0], kc, vc, idx[1], idx[2], idx[3]}
		out := zeros(tensor.BF16, 1, H, l.S, D)
		ws := pagedWorkspace(t, d, in)
		per, err := wallTime(d, 3, 20, func() error { return PagedAttention(d, out, in, ws, 0.088, 0, false) })
		if err != nil {
			t.Fatal(err)
		}
		el := per.Seconds()
		// Cached K and V read: every token reads its context (the prefill's tokens, their
		// causal share of it).
		keys, pairs := 0.0, 0.0
		for range tc.N {
			for j := range tc.nw {
				keys += float64(tc.ctx + j + 1)
			}
			pairs += float64(tc.nw) * float64(tc.ctx+tc.nw) // an upper bound for flops
		}
		msg := ""
		if tc.nw == 1 {
			msg = fmt.Sprintf("%.0f GB/s of K/V", keys*KV*D*2*2/el/1e9)
		} else {
			msg = fmt.Sprintf("%.1f TFLOP/s (causal)", (pairs-float64(tc.N*tc.nw*tc.nw)/2)*4*D*H/el/1e12)
		}
		t.Logf("paged_attention bf16 H32 KV8 D128 N%-3d ctx %-5d new %-5d %9.1f µs  %s", tc.N, tc.ctx, tc.nw, el*1e6, msg)
	}
}

// flashCases are bf16 prefill steps the tensor-core kernel serves: five sequences, one a
// 300-token prompt (several query and key tiles), others continuing cached contexts with
// chunks or a single decode token, tokens in order or interleaved, GQA 1, 4 and 6, head
// sizes 64 and 128, windows 0 and 20, blocks of 16 and 1 positions, i32 and i64 indices.
func flashCases() []pagedCase {
	var cases []pagedCase
	i := 0
	for _, G := range []int{1, 4, 6} {
		for _, D := range []int{64, 128} {
			for range 2 {
				window, bs, inter := []int{0, 20}[i%2], []int{16, 1}[(i/2)%2], i%3 == 2
				idt := []tensor.DType{tensor.I32, tensor.I64}[(i/4)%2]
				i++
				cases = append(cases, pagedCase{
					name: fmt.Sprintf("flash G%d D%d BS%d window %d interleaved %v %s", G, D, bs, window, inter, idt),
					ctx:  []int{0, 37, 300, 5, 130}, nw: []int{300, 20, 64, 1, 45}, bs: bs, KV: 2, G: G, D: D,
					window: window, dt: tensor.BF16, cdt: tensor.BF16, idt: idt, pad: -1, inter: inter,
				})
			}
		}
	}
	return cases
}

// The tensor-core prefill (flash.cu) matches the CPU reference with the bf16 tolerance of
// pagedCase.run, with P split into two bf16 terms (the default) and rounded once.
func TestFlashPrefillMatchesCPU(t *testing.T) {
	d := gpu(t)
	if !flashPrefillEnabled {
		t.Skip("the tensor-core prefill is disabled")
	}
	cases := flashCases()
	var paged, flash []string
	for _, c := range cases {
		H, S, M := c.KV*c.G, 0, 0
		for i := range c.ctx {
			S += c.nw[i]
			M = max(M, (c.ctx[i]+c.nw[i]+c.bs-1)/c.bs)
		}
		if !flashApplies(c.dt, c.cdt, H, c.KV, S, c.D, c.bs, M, d.info.Major, d.info.SharedOptin) {
			t.Fatalf("%s: the tensor-core prefill does not apply", c.name)
		}
		paged = append(paged, c.kernels()[0]) // the cache write
	}
	variants := [][3]int{{2, 4, 1}, {1, 4, 1}, {1, 8, 1}, {2, 8, 1}, {1, 4, 2}, {2, 4, 2}, {1, 8, 2}} // PS, W, MT
	defer func(ps, w, mt int) { flashPSplit, flashWarps, flashMT = ps, w, mt }(flashPSplit, flashWarps, flashMT)
	for _, v := range variants {
		flashWarps, flashMT = v[1], v[2]
		for _, c := range cases {
			inst, _ := flashKernel(c.D, v[0])
			flash = append(flash, inst)
		}
	}
	precompile(t, d, "paged.cu", paged)
	precompile(t, d, "flash.cu", flash)
	for _, v := range variants {
		flashPSplit, flashWarps, flashMT = v[0], v[1], v[2]
		rng := rand.New(rand.NewPCG(29, 31))
		for _, c := range cases {
			c.name += fmt.Sprintf(" PS%d W%d MT%d", v[0], v[1], v[2])
			c.run(t, d, rng)
		}
	}
}

// Few tokens over long contexts split each context (flashSplits) and merge the splits'
// partials with paged_combine: the result matches the CPU as the whole kernel does, for
// both block shapes, with windows, GQA 1 to 8, blocks of 1 and 16, i32 and i64 indices and
// sequences interleaved in token order.
func TestFlashSplitMatchesCPU(t *testing.T) {
	d := gpu(t)
	cases := []pagedCase{
		{name: "split G4 D128", ctx: []int{3000, 5000}, nw: []int{16, 9}, bs: 16, KV: 2, G: 4, D: 128},
		{name: "split G1 D64 window 700", ctx: []int{4100}, nw: []int{33}, bs: 16, KV: 2, G: 1, D: 64, window: 700},
		{name: "split G6 D128 interleaved i64", ctx: []int{2500, 6000, 1200}, nw: []int{5, 7, 20}, bs: 16, KV: 2, G: 6, D: 128, inter: true, idt: tensor.I64},
		{name: "split G4 D64 block size 1", ctx: []int{3000}, nw: []int{8}, bs: 1, KV: 1, G: 4, D: 64},
		{name: "split G8 D128 window 2000, one token a sequence", ctx: []int{4000, 3000}, nw: []int{2, 1}, bs: 16, KV: 1, G: 8, D: 128, window: 2000},
	}
	defer func(ps, w, mt int) { flashPSplit, flashWarps, flashMT = ps, w, mt }(flashPSplit, flashWarps, flashMT)
	blocks := [][2]int{{8, 1}, {4, 2}} // W, MT
	var paged, flash []string
	for i := range cases {
		c := &cases[i]
		c.dt, c.cdt, c.pad = tensor.BF16, tensor.BF16, -1
		if c.idt == tensor.Invalid {
			c.idt = tensor.I32
		}
		S, M := 0, 0
		for j := range c.ctx {
			S += c.nw[j]
			M = max(M, (c.ctx[j]+c.nw[j]+c.bs-1)/c.bs)
		}
		if sp := flashSplits(c.KV*c.G, c.KV, S, c.D, M, c.bs); sp < 2 {
			t.Fatalf("%s: %d splits, want several", c.name, sp)
		}
		paged = append(paged, c.kernels()[0])
		for _, b := range blocks {
			flashWarps, flashMT = b[0], b[1]
			inst, _ := flashKernel(c.D, 1)
			flash = append(flash, inst)
		}
	}
	precompile(t, d, "paged.cu", append(paged, "PAGED_COMBINE(BF16, bf16)"))
	precompile(t, d, "flash.cu", flash)
	flashPSplit = 1
	for _, b := range blocks {
		flashWarps, flashMT = b[0], b[1]
		rng := rand.New(rand.NewPCG(37, 41))
		for _, c := range cases {
			c.name += fmt.Sprintf(" W%d MT%d", b[0], b[1])
			c.run(t, d, rng)
		}
	}
}

// The tensor-core prefill compiles with NVRTC for head sizes 64, 80, 128 and 256, both
// splits of P and both block sizes; this needs NVRTC only, not a GPU.
func TestFlashKernelsCompile(t *testing.T) {
	arch := nvrtcArch(t)
	defer func(w, mt int) { flashWarps, flashMT = w, mt }(flashWarps, flashMT)
	var wg sync.WaitGroup
	for _, D := range []int{64, 80, 128, 256} {
		for _, v := range [][3]int{{1, 8, 1}, {2, 4, 1}, {1, 4, 2}} { // PS, W, MT
			flashWarps, flashMT = v[1], v[2]
			inst, name := flashKernel(D, v[0])
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				cubin := compileOnly(t, "flash.cu", inst, arch)
				if cubin == nil {
					return
				}
				if !strings.Contains(string(cubin), name) {
					t.Errorf("%s: the cubin has no kernel %s", inst, name)
				}
				t.Logf("%s for %s: %d bytes in %v", inst, arch, len(cubin), time.Since(start).Round(time.Millisecond))
			}()
		}
	}
	wg.Wait()
}

// The tensor-core kernel's instantiations the backend picks (P rounded once, blocks of 8
// warps of one row tile or 4 warps of two, every head size) keep their state in registers:
// ptxas reports no stack frame and no spills. This needs NVRTC only, not a GPU.
func TestFlashKernelsNoSpills(t *testing.T) {
	arch := nvrtcArch(t)
	defer func(w, mt int) { flashWarps, flashMT = w, mt }(flashWarps, flashMT)
	var extra strings.Builder
	for _, D := range []int{64, 80, 128, 256} {
		for _, b := range [][2]int{{8, 1}, {4, 2}} {
			flashWarps, flashMT = b[0], b[1]
			inst, _ := flashKernel(D, 1)
			extra.WriteString(inst + "\n")
		}
	}
	checkNoSpills(t, ptxasUsage(t, "flash.cu", extra.String(), arch))
}

// TestFlashPrefillTimings times the prefill of paged_attention on Llama-3.1-8B shapes (H 32,
// KV 8, D 128, bf16 cache of blocks of 16) when LOOM_CUDA_TIMINGS=1: the tensor-core kernel
// with P split (PS2) and rounded once (PS1), with blocks of 4 and 8 warps of one or two row
// tiles, with and without splitting the context, and paged_prefill, in µs per call (cache
// write and merge included).
func TestFlashPrefillTimings(t *testing.T) {
	d := gpu(t)
	if os.Getenv("LOOM_CUDA_TIMINGS") != "1" {
		t.Skip("set LOOM_CUDA_TIMINGS=1 to time the kernels")
	}
	const H, KV, D, BS = 32, 8, 128, 16
	rng := rand.New(rand.NewPCG(3, 4))
	defer func(ps, w, mt int, on, split bool) {
		flashPSplit, flashWarps, flashMT, flashPrefillEnabled, flashSplitEnabled = ps, w, mt, on, split
	}(flashPSplit, flashWarps, flashMT, flashPrefillEnabled, flashSplitEnabled)
	// Whole prompts, 512- and 8192-token chunks of a long prompt late in its prefill, and 32
	// tokens after 4,000 (a prompt extending a cached prefix: split, and not).
	for _, tc := range []struct{ N, ctx, nw int }{{1, 0, 1024}, {1, 0, 2048}, {4, 1024, 512}, {1, 0, 8192}, {1, 0, 32768},
		{1, 15872, 512}, {1, 31744, 512}, {1, 24576, 8192}, {1, 4000, 32}} {
		if !timingCase(tc.N, tc.ctx) {
			continue
		}
		ctx, nw := make([]int, tc.N), make([]int, tc.N)
		for i := range ctx {
			ctx[i], nw[i] = tc.ctx, tc.nw
		}
		l := newPagedLayout(rng, tensor.I32, ctx, nw, BS, 0, -1, false)
		q := randTensor(rng, tensor.BF16, []int{1, H, l.S, D}, -1, 1)
		k := randTensor(rng, tensor.BF16, []int{1, KV, l.S, D}, -1, 1)
		kc := randTensor(rng, tensor.BF16, []int{l.NB, BS, KV, D}, -1, 1)
		in := up(t, d, q, k, k, l.pos, kc, kc.Clone(), l.slots, l.seqs, l.tables)
		out := like(t, d, q)[0]
		flops := 0.0
		for range tc.N {
			flops += float64(tc.nw)*float64(tc.ctx) + float64(tc.nw)*float64(tc.nw+1)/2
		}
		flops *= 4 * D * H
		for _, v := range []struct {
			name      string
			on, split bool
			ps, w, mt int
		}{{"flash PS2 W4", true, true, 2, 4, 1}, {"flash PS1 W4", true, true, 1, 4, 1}, {"flash PS1 W8", true, true, 1, 8, 1},
			{"flash PS1 W4 MT2", true, true, 1, 4, 2}, {"flash PS1 W8 MT2", true, true, 1, 8, 2},
			{"flash PS1 W8 unsplit", true, false, 1, 8, 1}, {"paged_prefill", false, true, 2, 4, 1}} {
			if !v.on && tc.ctx+tc.nw > 8192 {
				continue // minutes at these lengths
			}
			flashPrefillEnabled, flashPSplit, flashWarps, flashMT, flashSplitEnabled = v.on, v.ps, v.w, v.mt, v.split
			ws := pagedWorkspace(t, d, in)
			per, err := wallTime(d, 3, 20, func() error { return PagedAttention(d, out, in, ws, 0.088, 0, false) })
			if err != nil {
				t.Fatal(err)
			}
			el := per.Seconds()
			t.Logf("prefill N%d ctx %-5d new %-5d %-13s %9.1f µs  %6.1f TFLOP/s (causal)", tc.N, tc.ctx, tc.nw, v.name, el*1e6, flops/el/1e12)
		}
	}
}

// The decode kernel matches the CPU in every shape of launch the plan picks: 64 and 16
// sequences of short contexts (blocks of 4 and 16 warps, no split), 32 (8 warps), one
// short and one long context (16 warps; splits), one past 32k positions (16 warps and
// splits), block tables padded to a power of two as
// the engine pads them, 8 query heads per KV head (vectors narrowed to 32 lanes a row),
// D = 256 in f32 with 8 query heads per KV head (two head groups), a bf16 cache under f32
// activations and the other way round, block sizes 1 and 32, windows.
func TestPagedDecodePlansMatchCPU(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 43))
	ctxs := func(n, lo, hi int) []int {
		c := make([]int, n)
		for i := range c {
			c[i] = lo + rng.IntN(hi-lo+1)
		}
		return c
	}
	ones := func(n int) []int {
		o := make([]int, n)
		for i := range o {
			o[i] = 1
		}
		return o
	}
	bf, f32 := tensor.BF16, tensor.F32
	var cases []pagedCase
	add := func(name string, ctx []int, bs, KV, G, D, window int, dt, cdt tensor.DType) {
		cases = append(cases, pagedCase{name: name, ctx: ctx, nw: ones(len(ctx)), bs: bs, KV: KV, G: G, D: D, window: window,
			dt: dt, cdt: cdt, idt: tensor.I32, pad: -1})
	}
	add("64 short contexts", ctxs(64, 100, 150), 16, 8, 4, 128, 0, bf, bf)
	add("16 short contexts", ctxs(16, 100, 150), 16, 8, 4, 128, 0, bf, bf)
	add("32 short contexts", ctxs(32, 1, 150), 16, 8, 4, 128, 30, bf, bf)
	add("1 short context", []int{140}, 16, 8, 4, 128, 0, bf, bf)
	add("1 long context", []int{2000}, 16, 8, 4, 128, 0, bf, bf)
	add("1 context past 32k positions (16 warps, 16 splits)", []int{33000}, 16, 8, 4, 128, 0, bf, bf)
	add("4 long contexts, window", ctxs(4, 900, 1100), 16, 8, 4, 128, 200, bf, bf)
	add("G8", ctxs(3, 100, 300), 16, 2, 8, 128, 0, bf, bf)
	add("G8 f32 D256", ctxs(2, 50, 200), 16, 2, 8, 256, 0, f32, f32)
	add("G8 f32 cache", ctxs(5, 50, 200), 16, 2, 8, 64, 0, f32, f32)
	add("bf16 over f32 cache", ctxs(3, 10, 90), 16, 2, 4, 128, 0, bf, f32)
	add("f32 over bf16 cache, G6", ctxs(7, 10, 90), 16, 2, 6, 64, 0, f32, bf)
	add("block size 1", ctxs(3, 5, 60), 1, 2, 4, 64, 0, bf, bf)
	add("block size 32, window 1", ctxs(9, 1, 300), 32, 2, 2, 128, 1, bf, bf)
	var extras []string
	for _, c := range cases {
		extras = append(extras, c.kernels()...)
	}
	d := gpu(t)
	precompile(t, d, "paged.cu", extras)
	for _, c := range cases {
		c.run(t, d, rng)
	}
	// Tables padded to a power of two entries (-1), as engine steps pad them.
	l := newPagedLayout(rng, tensor.I32, ctxs(8, 100, 150), ones(8), 16, 3, -1, false)
	l = padTables(l, 16)
	const KV, G, D = 2, 4, 128
	q := randTensor(rng, bf, []int{1, KV * G, l.S, D}, -2, 2)
	k := randTensor(rng, bf, []int{1, KV, l.S, D}, -2, 2)
	v := randTensor(rng, bf, []int{1, KV, l.S, D}, -1, 1)
	kc := randTensor(rng, bf, []int{l.NB, 16, KV, D}, -2, 2)
	vc := randTensor(rng, bf, []int{l.NB, 16, KV, D}, -1, 1)
	in := up(t, d, q, k, v, l.pos, kc, vc, l.slots, l.seqs, l.tables)
	want := cpuOp(t, "paged_attention", graph.Attrs{"scale": 0.088, "window": 0}, q, k, v, l.pos, kc, vc, l.slots, l.seqs, l.tables)[0]
	out := poisoned(t, d, want)
	if err := PagedAttention(d, out[0], in, pagedWorkspace(t, d, in), 0.088, 0, false); err != nil {
		t.Fatal(err)
	}
	compare(t, "paged_attention", "tables padded to 16 entries", down(t, d, out[0]), want, tol{atol: 1.0 / 64, rtol: 1.0 / 64})
}

// padTables widens the layout's block tables to m entries, padding with -1.
func padTables(l pagedLayout, m int) pagedLayout {
	if m <= l.M {
		return l
	}
	t := tensor.New(l.tables.DType, l.N, m)
	for i := range t.Numel() {
		setInt(t, i, -1)
	}
	for s := range l.N {
		for b := range l.M {
			setInt(t, s*m+b, int(l.tables.At(s*l.M+b)))
		}
	}
	l.tables, l.M = t, m
	return l
}

// TestPagedDecodeTimings times, when LOOM_CUDA_TIMINGS=1, a decode step of paged_attention
// (cache write, attention and, with splits, the merge) on Llama-3.1-8B shapes (H 32, KV 8,
// D 128, bf16, blocks of 16, tables padded to a power of two as the engine pads them) with
// random data, through a CUDA graph, and logs the plan and the bandwidth of the K and V it
// reads.
func TestPagedDecodeTimings(t *testing.T) {
	d := gpu(t)
	if os.Getenv("LOOM_CUDA_TIMINGS") != "1" {
		t.Skip("set LOOM_CUDA_TIMINGS=1 to time the kernels")
	}
	const D, BS = 128, 16
	rng := rand.New(rand.NewPCG(5, 6))
	var cases []struct{ H, KV, N, ctx int }
	for _, hk := range [][2]int{{32, 8}, {16, 4}} { // Llama-3.1-8B on one GPU and per GPU at tp=2
		for _, nc := range [][2]int{{64, 140}, {1, 140}, {4, 140}, {16, 140}, {64, 1024}, {16, 1024}, {4, 1024}, {1, 1024}, {1, 2048}, {1, 8192},
			{1, 32768}, {64, 1280}, {256, 140}} {
			if !timingCase(nc[0], nc[1]) {
				continue
			}
			cases = append(cases, struct{ H, KV, N, ctx int }{hk[0], hk[1], nc[0], nc[1]})
		}
	}
	for _, tc := range cases {
		H, KV := tc.H, tc.KV
		ctx, nw := make([]int, tc.N), make([]int, tc.N)
		for i := range ctx {
			ctx[i], nw[i] = tc.ctx, 1
		}
		l := newPagedLayout(rng, tensor.I32, ctx, nw, BS, 0, -1, false)
		l = padTables(l, nextPow2(l.M))
		bf := tensor.BF16
		q := randTensor(rng, bf, []int{1, H, l.S, D}, -2, 2)
		k := randTensor(rng, bf, []int{1, KV, l.S, D}, -2, 2)
		kc := randTensor(rng, bf, []int{l.NB, BS, KV, D}, -2, 2)
		in := up(t, d, q, k, k, l.pos, kc, kc, l.slots, l.seqs, l.tables)
		out := like(t, d, q)[0]
		kv := float64(tc.N) * float64(tc.ctx+1) * float64(KV) * D * 2 * 2
		time1 := func(what string) float64 {
			ws := pagedWorkspace(t, d, in)
			p := planDecode(H, KV, l.S, D, l.M, BS, 2)
			el := graphTime(t, d, 20, func() error { return pagedAttention(d, out, in, ws, 0.088, 0, false) })
			t.Logf("paged decode H%d KV%d N%-3d ctx %-5d M%-4d %2d warps %2d splits %s %-9s: %7.1f µs, %5.0f GB/s of K/V", H, KV, tc.N, tc.ctx, l.M, p.warps, p.splits,
				mergeNames[p.merge], what, float64(el.Nanoseconds())/1e3, kv/el.Seconds()/1e9)
			return el.Seconds()
		}
		// The plan, and the plan with its splits merged each way.
		time1("")
		for _, mg := range []int{mergeCombine, mergeTicket, mergeCluster} {
			if decodeMerge = mg; planDecode(H, KV, l.S, D, l.M, BS, 2).splits > 1 {
				time1("forced")
			}
		}
		decodeMerge = -1
		decodeFusedWrite = false
		time1("unfused")
		decodeFusedWrite = true
		if os.Getenv("LOOM_PAGED_SWEEP") == "1" || os.Getenv("LOOM_PAGED_SWEEP") == "small" && tc.N <= 4 {
			merges := []int{mergeCombine, mergeTicket, mergeCluster}
			if os.Getenv("LOOM_PAGED_SWEEP") == "small" {
				merges = []int{mergeCombine, mergeCluster}
			}
			us := []int{0}
			if os.Getenv("LOOM_PAGED_SWEEP") == "small" {
				us = []int{4, 2}
			}
			for _, mg := range merges {
				for _, u := range us {
					best, bw, bs := math.Inf(1), 0, 0
					decodeMerge, decodeForce.u = mg, u
					for _, w := range []int{1, 2, 4, 8, 16} {
						for _, sp := range []int{1, 2, 4, 8, 16, 32, 64} {
							if sp > l.M || sp > 1 && sp/2 >= l.M || mg == mergeCluster && sp > decodeClusterMax {
								continue
							}
							decodeForce.warps, decodeForce.splits = w, sp
							if planDecode(H, KV, l.S, D, l.M, BS, 2).shared > decodeMaxShared {
								continue
							}
							if el := time1(fmt.Sprintf("sweep u%d", u)); el < best {
								best, bw, bs = el, w, sp
							}
						}
					}
					decodeForce.warps, decodeForce.splits, decodeForce.u = 0, 0, 0
					decodeMerge = -1
					t.Logf("paged decode H%d KV%d N%-3d ctx %-5d best %s u%d: %2d warps %2d splits %7.1f µs", H, KV, tc.N, tc.ctx, mergeNames[mg], u, bw, bs, best*1e6)
				}
			}
		}
	}
}

// timingCase reports whether the timing tests time n sequences of ctx positions:
// LOOM_CUDA_TIMING_CASES, when set, lists the cases to time as N:ctx,N:ctx...
func timingCase(n, ctx int) bool {
	only := os.Getenv("LOOM_CUDA_TIMING_CASES")
	return only == "" || slices.Contains(strings.Split(only, ","), fmt.Sprintf("%d:%d", n, ctx))
}

var mergeNames = map[int]string{mergeCombine: "combine", mergeTicket: "ticket ", mergeCluster: "cluster"}

// A decode step (S <= N) may hold several tokens of one sequence: each sees the keys and
// values the others of its sequence write in the same step (the fused write takes them
// from k and v), with and without the fused write, with splits, windows and block size 1.
func TestPagedDecodeSharedSequences(t *testing.T) {
	var cases []pagedCase
	for _, fused := range []bool{true, false} {
		for i, tc := range []struct {
			ctx, nw    []int
			bs, window int
			inter      bool
		}{
			{[]int{30, 50, 7, 100}, []int{2, 0, 1, 0}, 16, 0, false},
			{[]int{600, 3, 0, 40, 9, 9}, []int{3, 1, 0, 0, 1, 0}, 16, 0, true},
			{[]int{20, 1, 5, 5}, []int{3, 0, 0, 0}, 1, 2, false},
			{[]int{900, 64, 0, 0, 0}, []int{2, 2, 0, 0, 0}, 16, 300, true},
		} {
			cases = append(cases, pagedCase{
				name: fmt.Sprintf("shared sequences %d fused %v", i, fused), ctx: tc.ctx, nw: tc.nw, bs: tc.bs, KV: 2, G: 4, D: 128,
				window: tc.window, dt: tensor.BF16, cdt: tensor.BF16, idt: tensor.I32, pad: -1, inter: tc.inter,
			})
		}
	}
	d := gpu(t)
	var extras []string
	for _, c := range cases {
		extras = append(extras, c.kernels()...)
	}
	precompile(t, d, "paged.cu", extras)
	defer func() { decodeFusedWrite = true }()
	rng := rand.New(rand.NewPCG(51, 53))
	for _, c := range cases {
		decodeFusedWrite = strings.HasSuffix(c.name, "true")
		c.run(t, d, rng)
	}
}

// The decode kernel is correct under any launch geometry (warps 1 to 16, 1 to 64 splits, two
// or four keys per lane group and step),
// which depends on the shapes only, and with each way of merging the splits (paged_combine,
// the last block by tickets, a cluster through distributed shared memory): the cases run
// with every plan forced.
func TestPagedDecodeForcedPlansMatchCPU(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 67))
	cases := []pagedCase{
		{name: "N1 long", ctx: []int{1500}, nw: []int{1}, bs: 16, KV: 8, G: 4, D: 128, dt: tensor.BF16, cdt: tensor.BF16, idt: tensor.I32, pad: -1},
		{name: "N5 mixed, window", ctx: []int{0, 17, 300, 64, 129}, nw: []int{1, 1, 1, 1, 1}, bs: 16, KV: 4, G: 4, D: 128, window: 70, dt: tensor.BF16, cdt: tensor.BF16, idt: tensor.I32, pad: -1},
		{name: "N3 G8 f32 D64", ctx: []int{40, 200, 90}, nw: []int{1, 1, 1}, bs: 16, KV: 2, G: 8, D: 64, dt: tensor.F32, cdt: tensor.F32, idt: tensor.I64, pad: -1},
		{name: "N2 shared sequence", ctx: []int{100, 0, 7}, nw: []int{2, 0, 1}, bs: 8, KV: 2, G: 2, D: 128, dt: tensor.BF16, cdt: tensor.BF16, idt: tensor.I32, pad: -1},
	}
	d := gpu(t)
	var extras []string
	for _, c := range cases {
		extras = append(extras, c.kernels()...)
	}
	precompile(t, d, "paged.cu", extras)
	defer func() { decodeForce.warps, decodeForce.splits, decodeForce.u, decodeMerge = 0, 0, 0, -1 }()
	for _, mg := range []int{mergeCombine, mergeTicket, mergeCluster} {
		decodeMerge = mg
		for _, w := range []int{1, 2, 4, 8, 16} {
			for _, sp := range []int{1, 2, 3, 8, 16, 64} {
				if mg == mergeCluster && sp > decodeClusterMax {
					continue
				}
				decodeForce.warps, decodeForce.splits = w, sp
				for _, c := range cases {
					c.name = fmt.Sprintf("%s, %d warps %d splits merge %s", c.name, w, sp, mergeNames[mg])
					c.run(t, d, rng)
				}
			}
		}
	}
	// Two keys per lane group and step (U=2) where the plan takes four.
	decodeForce.u = 2
	for _, mg := range []int{mergeTicket, mergeCluster} {
		decodeMerge = mg
		for _, w := range []int{2, 8} {
			for _, sp := range []int{1, 4} {
				decodeForce.warps, decodeForce.splits = w, sp
				for _, c := range cases {
					c.name = fmt.Sprintf("%s, U2 %d warps %d splits merge %s", c.name, w, sp, mergeNames[mg])
					c.run(t, d, rng)
				}
			}
		}
	}
}

// With token_major every kernel writes the output [1,S,H,D] (the CPU reference's, which
// is the head-major output transposed): decode with one split and with several (and the
// combine kernel), the CUDA-core prefill (f32) and the tensor-core prefill (bf16).
func TestPagedAttentionTokenMajor(t *testing.T) {
	long := make([]int, 3)
	for i := range long {
		long[i] = 600 + 37*i
	}
	short := make([]int, 64)
	for i := range short {
		short[i] = 20 + i
	}
	ones := func(n int) []int {
		o := make([]int, n)
		for i := range o {
			o[i] = 1
		}
		return o
	}
	var cases []pagedCase
	for _, tc := range []struct {
		name    string
		ctx, nw []int
		dt      tensor.DType
	}{
		{"decode, splits", long, ones(3), tensor.BF16},
		{"decode, one split", short, ones(64), tensor.BF16},
		{"prefill f32", []int{0, 5, 40}, []int{17, 1, 30}, tensor.F32},
		{"prefill bf16 (flash)", []int{0, 5, 40}, []int{70, 1, 30}, tensor.BF16},
	} {
		cases = append(cases, pagedCase{name: "token-major " + tc.name, ctx: tc.ctx, nw: tc.nw, bs: 16, KV: 2, G: 4, D: 128,
			dt: tc.dt, cdt: tc.dt, idt: tensor.I32, pad: -1, tokenMajor: true})
	}
	runPagedCases(t, 23, cases)
	// The splits merged each way.
	defer func() { decodeMerge = -1 }()
	for _, mg := range []int{mergeCombine, mergeTicket, mergeCluster} {
		decodeMerge = mg
		c := cases[0]
		c.name += " merge " + mergeNames[mg]
		runPagedCases(t, 29, []pagedCase{c})
	}
}
