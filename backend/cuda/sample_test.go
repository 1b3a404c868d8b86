package cuda

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

// hostArgmax is the argmax kernel's rule: the lowest index of the largest value, NaN never
// wins, 0 when the first value is NaN.
func hostArgmax(x []float32) int {
	best := -1
	for i, v := range x {
		if v == v && (best < 0 || v > x[best]) {
			best = i
		}
	}
	if best < 0 || x[0] != x[0] {
		return 0
	}
	return best
}

// keptWeights returns the probability of every token after temperature, top-k, top-p and
// min-p as SampleRow defines them (float64, exact ties by index); zero for dropped tokens.
func keptWeights(x []float32, r SampleRow) []float64 {
	V := len(x)
	m := math.Inf(-1)
	for _, v := range x {
		m = max(m, float64(v))
	}
	w := make([]float64, V)
	for i, v := range x {
		w[i] = math.Exp((float64(v) - m) / float64(r.Temperature))
	}
	order := make([]int, V)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(x[b], x[a]) })
	if r.TopK > 0 && int(r.TopK) < V {
		order = order[:r.TopK]
	}
	if r.TopP > 0 && r.TopP < 1 {
		total := 0.0
		for _, i := range order {
			total += w[i]
		}
		acc := 0.0
		for n, i := range order {
			acc += w[i]
			if acc >= float64(r.TopP)*total {
				order = order[:n+1]
				break
			}
		}
	}
	out := make([]float64, V)
	sum := 0.0
	for _, i := range order {
		if r.MinP > 0 && w[i] < float64(r.MinP) {
			continue
		}
		out[i] = w[i]
		sum += w[i]
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}

// sampleOnGPU runs SampleRows on the rows of logits x [N,V] with the given parameters.
func sampleOnGPU(t *testing.T, d *Device, x *tensor.Tensor, rows SampleParams) []int32 {
	t.Helper()
	N, V := x.Shape[0], x.Shape[1]
	in := up(t, d, x, rows.Tensor())
	ids := like(t, d, tensor.New(tensor.I32, N))[0]
	ws := like(t, d, tensor.New(tensor.Bool, int(SampleWorkspace(N, V))))[0]
	if err := SampleRows(d, ids, in[0], in[1], ws); err != nil {
		t.Fatal(err)
	}
	return down(t, d, ids).I32
}

// repeatRows returns logits x [V] repeated n times as [n,V].
func repeatRows(x []float32, n int) *tensor.Tensor {
	out := make([]float32, 0, n*len(x))
	for range n {
		out = append(out, x...)
	}
	return tensor.FromF32(out, n, len(x))
}

// Greedy rows (temperature 0) give the argmax, ties to the lowest index, NaN skipped; a
// row with top-k 1 does too.
func TestSampleGreedy(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(3, 4))
	const N, V = 6, 1000
	x := randTensor(rng, tensor.F32, []int{N, V}, -5, 5)
	row := func(i int) []float32 { return x.F32[i*V : (i+1)*V] }
	row(1)[17], row(1)[400] = 9, 9 // a tie: 17 wins
	row(2)[0] = float32(math.NaN())
	row(3)[5], row(3)[6] = float32(math.NaN()), 7
	rows := SampleParams{{}, {}, {}, {}, {Temperature: 1, TopK: 1, Seed: 9}, {Temperature: -1}}
	got := sampleOnGPU(t, d, x, rows)
	for i := range N {
		if want := hostArgmax(row(i)); int(got[i]) != want {
			t.Errorf("row %d: token %d, want the argmax %d", i, got[i], want)
		}
	}
}

// The empirical frequencies of many draws (8192 counters) from a 50-token distribution
// match the exact truncated distribution, by a chi-square bound, for temperature, top-k
// (with a tie at the boundary), top-p, min-p and their combinations (min-p narrower than
// what top-k or top-p keep); tokens the truncation drops never appear.
func TestSampleDistribution(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(5, 6))
	const V, draws = 50, 8192
	x := make([]float32, V)
	for i := range x {
		x[i] = float32(math.Round(rng.Float64()*600-300) / 100) // steps of 0.01 in [-3,3]
	}
	x[10], x[11], x[30] = 2.5, 2.5, 2.5 // ties, ranked by index
	order := make([]int, V)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(x[b], x[a]) })
	tieK := int32(slices.Index(order, 11) + 1) // top-k ends inside the tie group: keeps 10 and 11, not 30
	for _, r := range []SampleRow{
		{Temperature: 1},
		{Temperature: 0.6},
		{Temperature: 1.5, TopK: 10},
		{Temperature: 1, TopK: tieK},
		{Temperature: 1, TopP: 0.7},
		{Temperature: 0.8, MinP: 0.2},
		{Temperature: 1.2, TopK: 30, TopP: 0.9, MinP: 0.05},
		{Temperature: 1, TopK: 20, MinP: 0.3}, // min-p narrower than top-k
		{Temperature: 1, TopP: 0.95, MinP: 0.3},
		{Temperature: 1, TopK: 2},
	} {
		name := fmt.Sprintf("T %.1f top-k %d top-p %.1f min-p %.2f", r.Temperature, r.TopK, r.TopP, r.MinP)
		want := keptWeights(x, r)
		rows := make(SampleParams, draws)
		for i := range rows {
			rows[i] = r
			rows[i].Seed, rows[i].Counter = 1234, uint64(i)
		}
		got := sampleOnGPU(t, d, repeatRows(x, draws), rows)
		counts := make([]float64, V)
		for _, id := range got {
			if id < 0 || int(id) >= V || want[id] == 0 {
				t.Errorf("%s: token %d, which the truncation drops", name, id)
				continue
			}
			counts[id]++
		}
		// Chi-square over tokens expected at least 5 times, the rest pooled.
		chi, df, restObs, restExp := 0.0, -1, 0.0, 0.0
		for i := range V {
			e := want[i] * draws
			if e == 0 {
				continue
			}
			if e < 5 {
				restObs += counts[i]
				restExp += e
				continue
			}
			chi += (counts[i] - e) * (counts[i] - e) / e
			df++
		}
		if restExp > 0 {
			chi += (restObs - restExp) * (restObs - restExp) / restExp
			df++
		}
		bound := float64(df) + 6*math.Sqrt(2*float64(max(df, 1)))
		if chi > bound {
			t.Errorf("%s: chi-square %.1f over %d degrees of freedom, above %.1f", name, chi, df, bound)
		}
		t.Logf("%s: %d tokens kept, chi-square %.1f (df %d, bound %.1f)", name, len(slices.DeleteFunc(slices.Clone(want), func(w float64) bool { return w == 0 })), chi, df, bound)
	}
}

// The same seed and counter give the same token, whatever the row's position and the
// batch; other counters give other tokens.
func TestSampleReproducible(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(7, 8))
	const V = 3000
	base := randTensor(rng, tensor.F32, []int{1, V}, -1, 1).F32
	r := SampleRow{Temperature: 1, TopP: 0.95, Seed: 42, Counter: 7}
	// Row 0 and row 5 of a batch of 8, and row 2 of a batch of 3, all with seed 42 counter 7.
	batch := make(SampleParams, 8)
	for i := range batch {
		batch[i] = SampleRow{Temperature: 1, TopP: 0.95, Seed: 42, Counter: uint64(100 + i)}
	}
	batch[0], batch[5] = r, r
	got8 := sampleOnGPU(t, d, repeatRows(base, 8), batch)
	got3 := sampleOnGPU(t, d, repeatRows(base, 3), SampleParams{batch[1], batch[2], r})
	if got8[0] != got8[5] || got8[0] != got3[2] {
		t.Errorf("seed 42 counter 7 gave tokens %d, %d and %d", got8[0], got8[5], got3[2])
	}
	if got3[0] != got8[1] || got3[1] != got8[2] {
		t.Errorf("counters 101, 102 gave %d, %d in one batch and %d, %d in another", got8[1], got8[2], got3[0], got3[1])
	}
	distinct := map[int32]bool{}
	for _, id := range got8 {
		distinct[id] = true
	}
	if len(distinct) < 4 {
		t.Errorf("8 draws over %d flat tokens gave only %d distinct tokens: %v", V, len(distinct), got8)
	}
}

// Rows of a Llama-3 vocabulary (128256) with mixed parameters: greedy rows give the
// argmax, sampled tokens lie within what top-k, top-p and min-p keep, including rows whose
// candidates overflow the workspace (a flat distribution) and ties spanning the row.
func TestSampleLargeVocab(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(9, 10))
	const N, V = 64, 128256
	x := tensor.New(tensor.F32, N, V)
	for i := range x.F32 {
		x.F32[i] = float32(rng.NormFloat64() * 2.5)
	}
	row := func(i int) []float32 { return x.F32[i*V : (i+1)*V] }
	clear(row(6)) // all ties: top-k 10 keeps tokens 0..9
	kinds := []SampleRow{
		{},
		{Temperature: 0.7, TopK: 50},
		{Temperature: 1, TopP: 0.9},
		{Temperature: 1, MinP: 0.05},
		{Temperature: 0.8, TopK: 40, TopP: 0.8, MinP: 0.01},
		{Temperature: 2, TopP: 0.99}, // thousands of candidates: more than the workspace holds
		{Temperature: 1, TopK: 10},
		{Temperature: 1},
	}
	rows := make(SampleParams, N)
	for i := range rows {
		rows[i] = kinds[i%len(kinds)]
		rows[i].Seed, rows[i].Counter = uint64(i), 3
	}
	rows[6] = SampleRow{Temperature: 1, TopK: 10, Seed: 1}
	got := sampleOnGPU(t, d, x, rows)
	for i := range N {
		r := rows[i]
		if r.Temperature == 0 {
			if want := hostArgmax(row(i)); int(got[i]) != want {
				t.Errorf("row %d (greedy): token %d, want %d", i, got[i], want)
			}
			continue
		}
		if got[i] < 0 || got[i] >= V {
			t.Errorf("row %d: token %d outside the vocabulary", i, got[i])
			continue
		}
		if r.TopK == 0 && r.TopP == 0 && r.MinP == 0 {
			continue // nothing to check but the range
		}
		if w := keptWeights(row(i), r); w[got[i]] == 0 {
			t.Errorf("row %d (%+v): token %d (logit %g) is not kept", i, r, got[i], row(i)[got[i]])
		}
	}
}

// SampleParams.Tensor packs each row into eight words: float bits, top-k, then the seed
// and counter as low and high words.
func TestSampleParamsTensor(t *testing.T) {
	p := SampleParams{{Temperature: 0.5, TopP: 0.9, MinP: 0.1, TopK: 7, Seed: 0x1122334455667788, Counter: 0x99aabbccddeeff00}}
	got := p.Tensor()
	want := []int32{int32(math.Float32bits(0.5)), int32(math.Float32bits(0.9)), int32(math.Float32bits(0.1)), 7,
		0x55667788, 0x11223344, int32(-0x22110100), int32(-0x66554434)}
	if !slices.Equal(got.Shape, []int{1, 8}) || !slices.Equal(got.I32, want) {
		t.Errorf("packed %v %#x, want [1 8] %#x", got.Shape, got.I32, want)
	}
	if SampleWorkspace(64, 128256) != 64*16384*8 || SampleWorkspace(2, 50) != 2*50*8 {
		t.Errorf("SampleWorkspace(64, 128256) = %d, SampleWorkspace(2, 50) = %d", SampleWorkspace(64, 128256), SampleWorkspace(2, 50))
	}
}

// sample.cu compiles with NVRTC (no GPU needed).
func TestSampleKernelCompiles(t *testing.T) {
	compileOnly(t, "sample.cu", "", nvrtcArch(t))
}

// TestSampleTimings times SampleRows on a Llama-3 vocabulary (128256) for 1 and 64 rows
// when LOOM_CUDA_TIMINGS=1.
func TestSampleTimings(t *testing.T) {
	d := gpu(t)
	if os.Getenv("LOOM_CUDA_TIMINGS") != "1" {
		t.Skip("set LOOM_CUDA_TIMINGS=1 to time the kernels")
	}
	const V = 128256
	rng := rand.New(rand.NewPCG(11, 12))
	for _, N := range []int{1, 64} {
		x := tensor.New(tensor.F32, N, V)
		for i := range x.F32 {
			x.F32[i] = float32(rng.NormFloat64() * 2.5)
		}
		for _, r := range []SampleRow{
			{},
			{Temperature: 1},
			{Temperature: 0.7, TopK: 50},
			{Temperature: 0.7, TopP: 0.9},
			{Temperature: 0.7, TopK: 50, TopP: 0.9, MinP: 0.05},
			{Temperature: 2, TopP: 0.99},
		} {
			rows := make(SampleParams, N)
			for i := range rows {
				rows[i] = r
				rows[i].Seed, rows[i].Counter = uint64(i), 1
			}
			in := up(t, d, x, rows.Tensor())
			ids := like(t, d, tensor.New(tensor.I32, N))[0]
			ws := like(t, d, tensor.New(tensor.Bool, int(SampleWorkspace(N, V))))[0]
			per, err := wallTime(d, 2, 20, func() error { return SampleRows(d, ids, in[0], in[1], ws) })
			if err != nil {
				t.Fatal(err)
			}
			el := per.Seconds()
			t.Logf("sample f32 [%d,%d] T %.1f top-k %d top-p %.2f min-p %.2f: %8.1f µs (%.0f GB/s of one pass)", N, V, r.Temperature, r.TopK, r.TopP, r.MinP, el*1e6, float64(N*V*4)/el/1e9)
		}
	}
}

// GreedyRows gives what SampleRows gives greedy rows and the host argmax: ties to the
// lowest index (also across the chunks of different blocks), NaN skipped, 0 for a row whose
// first logit is NaN, for a row of only NaN and a row of only -inf; over 1, 3 and 64 rows of
// vocabularies from 1 to 128256.
func TestGreedyRows(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(8, 9))
	nan, inf := float32(math.NaN()), float32(math.Inf(-1))
	for _, tc := range []struct{ N, V int }{{1, 1}, {3, 7}, {3, 1000}, {1, 128256}, {64, 128256}, {64, 5000}} {
		t.Run(fmt.Sprintf("N%d_V%d", tc.N, tc.V), func(t *testing.T) {
			N, V := tc.N, tc.V
			x := randTensor(rng, tensor.F32, []int{N, V}, -5, 5)
			row := func(i int) []float32 { return x.F32[i*V : (i+1)*V] }
			chunk := (V + greedyChunks(N, V) - 1) / greedyChunks(N, V)
			for i := range N {
				r := row(i)
				switch i % 5 {
				case 1: // a tie across two chunks: the lower index wins
					r[V/3], r[min(V-1, V/3+chunk)] = 9, 9
				case 2:
					r[0] = nan
				case 3:
					for j := range r {
						r[j] = nan
					}
				case 4:
					for j := range r {
						r[j] = inf
					}
					r[V-1] = nan
				}
			}
			in := up(t, d, x)
			ids := like(t, d, tensor.New(tensor.I32, N))[0]
			ws := like(t, d, tensor.New(tensor.Bool, int(SampleWorkspace(N, V))))[0]
			if err := GreedyRows(d, ids, in[0], ws); err != nil {
				t.Fatal(err)
			}
			got := down(t, d, ids).I32
			viaSample := sampleOnGPU(t, d, x, make(SampleParams, N))
			for i := range N {
				if want := hostArgmax(row(i)); int(got[i]) != want || viaSample[i] != got[i] {
					t.Errorf("row %d: GreedyRows %d, SampleRows %d, argmax %d", i, got[i], viaSample[i], want)
				}
			}
		})
	}
}
