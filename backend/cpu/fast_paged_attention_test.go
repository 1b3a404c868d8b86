package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// pagedCase is one paged_attention call: the step's tensors and caches already holding the
// earlier positions of every sequence.
type pagedCase struct {
	in    []*tensor.Tensor // q, k, v, positions, k_cache, v_cache, slot_mapping, token_seq, block_tables
	attrs graph.Attrs
	vmax  float64 // the largest |v| in the step and the caches
}

// newPagedCase builds a step over sequences of the given cached lengths, sequence s adding
// steps[s] tokens at positions cached[s].. (0 leaves it out of the step). Blocks are handed
// out shuffled; the caches hold random values everywhere, including unused slots.
func newPagedCase(rng *rand.Rand, qdt, cdt tensor.DType, bs, H, KV, D, window int, cached, steps []int) pagedCase {
	maxBlocks := 0
	for s := range cached {
		maxBlocks = max(maxBlocks, (cached[s]+steps[s]+bs-1)/bs)
	}
	NB := len(cached)*maxBlocks + 3
	perm := rng.Perm(NB)
	var pos, slots, seqs, table []int
	rows := 0
	for s := range cached {
		if steps[s] == 0 {
			continue
		}
		blocks := perm[s*maxBlocks : (s+1)*maxBlocks]
		table = append(table, blocks...)
		for p := cached[s]; p < cached[s]+steps[s]; p++ {
			pos = append(pos, p)
			slots = append(slots, blocks[p/bs]*bs+p%bs)
			seqs = append(seqs, rows)
		}
		rows++
	}
	S := len(pos)
	c := pagedCase{attrs: graph.Attrs{"scale": 1 / math.Sqrt(float64(D)), "window": window}}
	c.in = []*tensor.Tensor{
		randTensor(rng, qdt, []int{1, H, S, D}, -2, 2),
		randTensor(rng, qdt, []int{1, KV, S, D}, -2, 2),
		randTensor(rng, qdt, []int{1, KV, S, D}, -1, 1),
		paI32([]int{1, S}, pos...),
		randTensor(rng, cdt, []int{NB, bs, KV, D}, -2, 2),
		randTensor(rng, cdt, []int{NB, bs, KV, D}, -1, 1),
		paI32([]int{S}, slots...),
		paI32([]int{S}, seqs...),
		paI32([]int{rows, maxBlocks}, table...),
	}
	for _, t := range []*tensor.Tensor{c.in[2], c.in[5]} {
		for _, x := range values(t) {
			c.vmax = max(c.vmax, math.Abs(x))
		}
	}
	return c
}

// withCaches returns c's inputs with fresh copies of the caches, so that a call can write them.
func (c pagedCase) withCaches() []*tensor.Tensor {
	in := slices.Clone(c.in)
	in[4], in[5] = in[4].Clone(), in[5].Clone()
	return in
}

// pagedTol is the tolerance of the fast sdpa kernel's tests (fast_test.go), in terms of the
// largest |v|: 1e-4·max|v| when the values are f32, 2^-7·max|v| (one bf16 or f16 unit in the
// last place) when the output is a half dtype.
func pagedTol(out tensor.DType, vmax float64) float64 {
	if out == tensor.F32 {
		return 1e-4 * vmax
	}
	return vmax / 128
}

// compareFast runs the reference and the fast kernel on c, each with its own copy of the
// caches, and checks the outputs within pagedTol and the written caches bit for bit. It
// returns the largest absolute difference.
func (c pagedCase) compareFast(t *testing.T) float64 {
	t.Helper()
	n, outs := nodeFor(t, "paged_attention", c.attrs, c.in)
	ref, _ := Reference("paged_attention")
	rin, fin := c.withCaches(), c.withCaches()
	want, err := ref(n, rin, outs)
	if err != nil {
		t.Fatalf("reference: %v", err)
	}
	got, err := fastPagedAttention(n, fin, outs)
	if err != nil {
		t.Fatalf("fast: %v", err)
	}
	if got[0].DType != outs[0].DType || !slices.Equal(got[0].Shape, outs[0].Shape) {
		t.Fatalf("fast output is %s%v, want %s", got[0].DType, got[0].Shape, outs[0])
	}
	tol := pagedTol(outs[0].DType, c.vmax)
	worst, bad := 0.0, 0
	g, r := values(got[0]), values(want[0])
	for i := range r {
		d := math.Abs(g[i] - r[i])
		worst = max(worst, d)
		if !(d <= tol) {
			if bad++; bad <= 5 {
				t.Errorf("element %d (index %v): fast %v, reference %v (tolerance %.3g)", i, unflatten(i, outs[0].Shape), g[i], r[i], tol)
			}
		}
	}
	for i := 4; i <= 5; i++ {
		if !slices.Equal(values(rin[i]), values(fin[i])) {
			t.Errorf("cache %d differs from the reference's after the call", i)
		}
	}
	return worst
}

// TestFastPagedAttention holds the fast kernel to the reference on random inputs: f32 and
// bf16 caches (and f32 queries over a bf16 cache), block sizes 1, 3 and 16, 1, 2 and 4 query
// heads per KV head, no window and a window of 3, decode steps (one token for each of several
// sequences of different cached lengths) and prefill chunks (several tokens per sequence, a
// sequence left out, one starting from position 0).
func TestFastPagedAttention(t *testing.T) {
	const H, D = 8, 16
	cached := []int{0, 7, 33, 18}
	shapes := []struct {
		name  string
		steps []int
	}{
		{"decode", []int{1, 1, 1, 1}},
		{"prefill", []int{9, 5, 0, 12}},
	}
	rng := rand.New(rand.NewPCG(71, 72))
	worst := map[string]float64{}
	for _, dts := range [][2]tensor.DType{{tensor.F32, tensor.F32}, {tensor.BF16, tensor.BF16}, {tensor.F32, tensor.BF16}} {
		for _, bs := range []int{1, 3, 16} {
			for _, rep := range []int{1, 2, 4} {
				for _, window := range []int{0, 3} {
					for _, sh := range shapes {
						name := fmt.Sprintf("q=%s/cache=%s/bs=%d/gqa=%d/window=%d/%s", dts[0], dts[1], bs, rep, window, sh.name)
						t.Run(name, func(t *testing.T) {
							c := newPagedCase(rng, dts[0], dts[1], bs, H, H/rep, D, window, cached, sh.steps)
							key := dts[0].String() + "/" + dts[1].String()
							worst[key] = max(worst[key], c.compareFast(t))
						})
					}
				}
			}
		}
	}
	t.Logf("largest absolute differences: %v", worst)
}

// TestFastPagedAttentionLarge: head_dim 64, long sequences and GQA 7, split over the workers
// in several ways; the results do not depend on GOMAXPROCS.
func TestFastPagedAttentionLarge(t *testing.T) {
	rng := rand.New(rand.NewPCG(73, 74))
	c := newPagedCase(rng, tensor.F32, tensor.BF16, 16, 14, 2, 64, 0, []int{200, 77, 130}, []int{1, 1, 1})
	p := newPagedCase(rng, tensor.BF16, tensor.BF16, 16, 14, 2, 64, 5, []int{40, 0, 3}, []int{17, 30, 0})
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, cs := range []pagedCase{c, p} {
		var first []float64
		for _, procs := range []int{1, 2, 5, 64} {
			runtime.GOMAXPROCS(procs)
			cs.compareFast(t)
			n, outs := nodeFor(t, "paged_attention", cs.attrs, cs.in)
			got, err := fastPagedAttention(n, cs.withCaches(), outs)
			if err != nil {
				t.Fatal(err)
			}
			if first == nil {
				first = values(got[0])
			} else if !slices.Equal(first, values(got[0])) {
				t.Errorf("GOMAXPROCS=%d changes the result", procs)
			}
		}
	}
}

// TestFastPagedAttentionErrors: bad indices and shapes are the reference's errors, never
// panics, and a failed call leaves the caches as they were.
func TestFastPagedAttentionErrors(t *testing.T) {
	rng := rand.New(rand.NewPCG(75, 76))
	const H, KV, D, BS, NB = 2, 1, 4, 2, 3 // slots 0-5
	q, k, v := paRand(rng, tensor.F32, 1, H, 2, D), paRand(rng, tensor.F32, 1, KV, 2, D), paRand(rng, tensor.F32, 1, KV, 2, D)
	kc, vc := paRand(rng, tensor.BF16, NB, BS, KV, D), paRand(rng, tensor.BF16, NB, BS, KV, D)
	kBefore, vBefore := slices.Clone(kc.Half), slices.Clone(vc.Half)
	good := []*tensor.Tensor{q, k, v, paI32([]int{1, 2}, 2, 3), kc, vc, paI32([]int{2}, 4, 5), paI32([]int{2}, 0, 0), paI32([]int{1, 2}, 1, 2)}
	n, outs := nodeFor(t, "paged_attention", graph.Attrs{"scale": 0.5}, good)
	for _, tc := range []struct {
		name  string
		input int
		value *tensor.Tensor
		want  string
	}{
		{"slot too large", 6, paI32([]int{2}, 4, 6), "slot 6 is outside"},
		{"negative slot", 6, paI32([]int{2}, -1, 5), "slot -1 is outside"},
		{"sequence out of range", 7, paI32([]int{2}, 0, 1), "sequence 1 is outside"},
		{"negative sequence", 7, paI32([]int{2}, 0, -1), "sequence -1 is outside"},
		{"block out of range", 8, paI32([]int{1, 2}, 1, 3), "block 1 is 3"},
		{"negative block", 8, paI32([]int{1, 2}, -1, 2), "block 0 is -1"},
		{"position beyond the table", 3, paI32([]int{1, 2}, 2, 4), "needs block 2"},
		{"negative position", 3, paI32([]int{1, 2}, -1, 0), "negative position"},
		{"slot_mapping length", 6, paI32([]int{3}, 4, 5, 0), "slot_mapping and token_seq"},
		{"float positions", 3, paRand(rng, tensor.F32, 1, 2), "integer tensor"},
		{"cache head size", 4, paRand(rng, tensor.BF16, NB, BS, KV, D+1), "caches must be"},
		{"caches of two dtypes", 5, paRand(rng, tensor.F32, NB, BS, KV, D), "caches must be"},
		{"batch of 2", 0, paRand(rng, tensor.F32, 2, H, 2, D), "batch must be 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(good)
			in[tc.input] = tc.value
			ref, _ := Reference("paged_attention")
			_, rerr := ref(n, in, outs)
			_, err := fastPagedAttention(n, in, outs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if rerr == nil || rerr.Error() != err.Error() {
				t.Errorf("fast error %q, reference error %v", err, rerr)
			}
			if !slices.Equal(kc.Half, kBefore) || !slices.Equal(vc.Half, vBefore) {
				t.Fatal("a failed call changed the caches")
			}
		})
	}
	// The good call writes slots 4 and 5 (block 2) and nothing else.
	if _, err := fastPagedAttention(n, good, outs); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(kc.Half[:4*KV*D], kBefore[:4*KV*D]) || !slices.Equal(vc.Half[:4*KV*D], vBefore[:4*KV*D]) {
		t.Error("the call changed slots 0-3, which it does not write")
	}
	for i, x := range k.F32 {
		if kc.Half[4*KV*D+i] != tensor.F32ToBF16(x) || vc.Half[4*KV*D+i] != tensor.F32ToBF16(v.F32[i]) {
			t.Fatalf("slots 4, 5 do not hold the step's k and v rounded to bf16 (element %d)", i)
		}
	}
}

// TestFastPagedAttentionRegistered: Compile picks the fast kernel, Reference still gives the
// reference one.
func TestFastPagedAttentionRegistered(t *testing.T) {
	k, ok := Lookup("paged_attention")
	if !ok || fmt.Sprintf("%p", k) != fmt.Sprintf("%p", Kernel(fastPagedAttention)) {
		t.Error("Lookup(paged_attention) is not the fast kernel")
	}
	r, ok := Reference("paged_attention")
	if !ok || fmt.Sprintf("%p", r) == fmt.Sprintf("%p", Kernel(fastPagedAttention)) {
		t.Error("Reference(paged_attention) is the fast kernel or missing")
	}
}

// BenchmarkPagedAttention: a decode step of 8 sequences with 512 tokens cached each (the new
// token at position 512), 14 query heads over 2 KV heads, head_dim 64, blocks of 16; q f32
// over f32 and bf16 caches. The reference and the fast kernel run side by side.
func BenchmarkPagedAttention(b *testing.B) {
	const seqs, cached, H, KV, D, BS = 8, 512, 14, 2, 64, 16
	for _, cdt := range []tensor.DType{tensor.F32, tensor.BF16} {
		b.Run("decode/cache="+cdt.String(), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(77, 78))
			lens, steps := make([]int, seqs), make([]int, seqs)
			for s := range seqs {
				lens[s], steps[s] = cached, 1
			}
			c := newPagedCase(rng, tensor.F32, cdt, BS, H, KV, D, 0, lens, steps)
			ref, _ := Reference("paged_attention")
			benchVariants(b, 0, []string{"reference", "fast"}, []func() error{
				kernelFn(b, ref, "paged_attention", c.attrs, c.in...),
				kernelFn(b, fastPagedAttention, "paged_attention", c.attrs, c.in...),
			})
		})
	}
}

// With token_major=1 both kernels give the head-major output transposed to [1,S,H,D], bit
// for bit, and write the caches the same.
func TestPagedAttentionTokenMajor(t *testing.T) {
	rng := rand.New(rand.NewPCG(91, 92))
	c := newPagedCase(rng, tensor.BF16, tensor.BF16, 16, 8, 2, 16, 0, []int{5, 0, 30}, []int{1, 9, 2})
	ref, _ := Reference("paged_attention")
	for name, k := range map[string]Kernel{"reference": ref, "fast": fastPagedAttention} {
		n, outs := nodeFor(t, "paged_attention", c.attrs, c.in)
		head, err := k(n, c.withCaches(), outs)
		if err != nil {
			t.Fatal(err)
		}
		tm := c.attrs.Clone()
		tm["token_major"] = 1
		n, outs = nodeFor(t, "paged_attention", tm, c.in)
		got, err := k(n, c.withCaches(), outs)
		if err != nil {
			t.Fatal(err)
		}
		h := head[0]
		H, S, D := h.Shape[1], h.Shape[2], h.Shape[3]
		if want := []int{1, S, H, D}; !slices.Equal(got[0].Shape, want) {
			t.Fatalf("%s: token-major output %v, want %v", name, got[0].Shape, want)
		}
		hv, gv := values(h), values(got[0])
		for hh := range H {
			for s := range S {
				for d := range D {
					if a, b := hv[(hh*S+s)*D+d], gv[(s*H+hh)*D+d]; a != b {
						t.Fatalf("%s: head %d token %d dim %d: token-major %v, head-major %v", name, hh, s, d, b, a)
					}
				}
			}
		}
	}
}
