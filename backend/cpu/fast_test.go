package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Fast kernels against the reference kernel of the same op (for fused ops: the
// decomposition run with reference kernels), on random inputs.
//
// Tolerances, per element, with r the reference value and g the fast one:
//   - linear, matmul: |g-r| <= 1e-5·Σ|a·b| (the sum of absolute products behind the output),
//     plus one unit in the last place of a bf16 or f16 output; for linear with bf16 weights,
//     plus what the kernel set's conversion of x adds (linearTol: 2^-8·Σ|a·b| where x is
//     rounded to bf16);
//   - rmsnorm, add_rmsnorm, rope, swiglu, repeat_kv: |g-r| <= 1e-5·|r| (+1e-30) for f32, one
//     unit in the last place (|r|·2^-7 for bf16, 2^-10 for f16) for half outputs;
//   - sdpa: |g-r| <= 1e-4·max|v| for f32, 2^-7·max|v| for half dtypes.
//
// The kernels round where the decomposition rounds and sum in the same order, so in practice
// most results are bit-identical; TestFastKernels logs the largest error seen per case.

// kernelCase runs op through kernel fast and through the reference kernel on the same
// inputs and compares every output with tol (see above).
type kernelCase struct {
	name  string
	op    string
	attrs graph.Attrs
	in    []*tensor.Tensor
	fast  Kernel
	// tol gives the allowed error of output o's element i, whose reference value is r.
	tol func(o, i int, r float64) float64
}

// nodeFor builds a node of op over inputs of the given tensors' types and returns it with
// its concrete output types.
func nodeFor(t testing.TB, op string, attrs graph.Attrs, in []*tensor.Tensor) (*graph.Node, []Out) {
	t.Helper()
	b := graph.NewBuilder("k")
	vals := make([]*graph.Value, len(in))
	for i, x := range in {
		vals[i] = b.Input(fmt.Sprintf("x%d", i), x.DType, graph.Dims(x.Shape...))
	}
	outs := b.Apply(op, attrs, vals...)
	if err := b.Err(); err != nil {
		t.Fatalf("build %s: %v", op, err)
	}
	n := outs[0].Producer
	o, err := resolveOuts(n, nil)
	if err != nil {
		t.Fatal(err)
	}
	return n, o
}

func (c kernelCase) run(t *testing.T) {
	t.Helper()
	n, outs := nodeFor(t, c.op, c.attrs, c.in)
	ref, ok := Reference(c.op)
	if !ok {
		t.Fatalf("no reference kernel for %s", c.op)
	}
	want, err := runKernel(ref, n, c.in, outs)
	if err != nil {
		t.Fatalf("reference: %v", err)
	}
	got, err := runKernel(c.fast, n, c.in, outs)
	if err != nil {
		t.Fatalf("fast: %v", err)
	}
	worst := 0.0
	for o := range want {
		bad := 0
		for i := range want[o].Numel() {
			g, r := got[o].At(i), want[o].At(i)
			if math.IsNaN(r) && math.IsNaN(g) || g == r {
				continue
			}
			d := math.Abs(g - r)
			worst = max(worst, d/max(math.Abs(r), 1e-30))
			if !(d <= c.tol(o, i, r)) {
				if bad++; bad <= 5 {
					t.Errorf("output %d element %d (index %v): fast %v, reference %v (tolerance %.3g)",
						o, i, unflatten(i, outs[o].Shape), g, r, c.tol(o, i, r))
				}
			}
		}
		if bad > 5 {
			t.Errorf("output %d: %d elements differ in all", o, bad)
		}
	}
	t.Logf("largest relative difference %.3g", worst)
}

// ulp is the relative size of one unit in the last place of dtype dt (0 for f32, whose
// tolerance is given separately).
func ulp(dt tensor.DType) float64 {
	switch dt {
	case tensor.BF16:
		return 1.0 / 128
	case tensor.F16:
		return 1.0 / 1024
	}
	return 0
}

// relTol allows 1e-5 relative for f32 outputs and one unit in the last place for half ones.
func relTol(outs ...tensor.DType) func(o, i int, r float64) float64 {
	return func(o, i int, r float64) float64 {
		return math.Abs(r)*max(1e-5, ulp(outs[o])) + 1e-30
	}
}

// absProducts runs the reference kernel of op (linear or matmul) on |a| and |b|: the sum of
// absolute products behind each output, which bounds its rounding error.
func absProducts(t *testing.T, op string, a, b *tensor.Tensor) []float64 {
	t.Helper()
	abs := func(x *tensor.Tensor) *tensor.Tensor {
		v := values(x)
		for i := range v {
			v[i] = math.Abs(v[i])
		}
		return fromValues(tensor.F32, x.Shape, v)
	}
	in := []*tensor.Tensor{abs(a), abs(b)}
	n, outs := nodeFor(t, op, nil, in)
	ref, _ := Reference(op)
	res, err := ref(n, in, outs)
	if err != nil {
		t.Fatal(err)
	}
	return values(res[0])
}

// productTol allows 1e-5 of the absolute products plus one half-precision ulp.
func productTol(sums []float64, dt tensor.DType) func(o, i int, r float64) float64 {
	return func(o, i int, r float64) float64 { return 1e-5*sums[i] + ulp(dt)*math.Abs(r) + 1e-30 }
}

// positionsFrom returns positions [B,S]: row b counts up from starts[b] in steps of step.
func positionsFrom(dt tensor.DType, S, step int, starts ...int) *tensor.Tensor {
	vals := make([]float64, len(starts)*S)
	for b, s0 := range starts {
		for s := range S {
			vals[b*S+s] = float64(s0 + s*step)
		}
	}
	return fromValues(dt, []int{len(starts), S}, vals)
}

func TestFastKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(101, 102))
	F32, BF16, F16 := tensor.F32, tensor.BF16, tensor.F16
	var cases []kernelCase

	// linear: M below, at and above the 4-row block; K odd and tiny; N below the 4-row group
	// and the worker count; a case large enough to be split over workers.
	for _, tc := range []struct {
		x      []int
		n      int
		dx, dw tensor.DType
	}{
		{[]int{1, 64}, 1, F32, BF16},
		{[]int{1, 33}, 3, F32, BF16},
		{[]int{1, 130}, 9, F32, F32},
		{[]int{3, 7}, 5, BF16, BF16},
		{[]int{4, 1}, 4, F32, BF16},
		{[]int{5, 65}, 6, F32, BF16},
		{[]int{2, 4, 31}, 10, F32, F16},
		{[]int{9, 17}, 7, F16, BF16},
		{[]int{8, 40}, 13, BF16, F32},
		{[]int{6}, 2, F32, BF16}, // rank-1 x
		{[]int{5, 300}, 131, F32, BF16},
		{[]int{1, 1000}, 257, F32, BF16},
		{[]int{0, 8}, 3, F32, BF16},
		{[]int{2, 0}, 3, F32, BF16},
	} {
		K := tc.x[len(tc.x)-1]
		x := randTensor(rng, tc.dx, tc.x, -1, 1)
		w := randTensor(rng, tc.dw, []int{tc.n, K}, -1, 1)
		cases = append(cases, kernelCase{
			name: fmt.Sprintf("linear %s%v@%s[%d,%d]", tc.dx, tc.x, tc.dw, tc.n, K),
			op:   "linear", in: []*tensor.Tensor{x, w}, fast: fastLinear,
			tol: linearTol(absProducts(t, "linear", x, w), tc.dx, tc.dw),
		})
	}

	// matmul: broadcast batches, N below and not a multiple of the 8-column block.
	for _, tc := range []struct {
		a, b   []int
		da, db tensor.DType
	}{
		{[]int{3, 4}, []int{4, 5}, F32, F32},
		{[]int{2, 3, 9}, []int{9, 17}, BF16, BF16},
		{[]int{2, 1, 3, 4}, []int{5, 4, 8}, F16, F32},
		{[]int{1, 32, 8, 64}, []int{1, 32, 64, 8}, F32, F32},
		{[]int{1, 4, 8, 8}, []int{1, 4, 8, 64}, BF16, BF16},
		{[]int{2, 40, 30}, []int{2, 30, 70}, F32, BF16},
		{[]int{2, 0, 4}, []int{4, 3}, F32, F32},
	} {
		a, b := randTensor(rng, tc.da, tc.a, -1, 1), randTensor(rng, tc.db, tc.b, -1, 1)
		od := promote(tc.da, tc.db)
		cases = append(cases, kernelCase{
			name: fmt.Sprintf("matmul %s%v@%s%v", tc.da, tc.a, tc.db, tc.b),
			op:   "matmul", in: []*tensor.Tensor{a, b}, fast: fastMatmul,
			tol: productTol(absProducts(t, "matmul", a, b), od),
		})
	}
	ai, bi := randTensor(rng, tensor.I32, []int{2, 3, 4}, -5, 5), randTensor(rng, tensor.I32, []int{4, 2}, -5, 5)
	cases = append(cases, kernelCase{name: "matmul i32", op: "matmul", in: []*tensor.Tensor{ai, bi}, fast: fastMatmul, tol: relTol(tensor.I32)})

	// rmsnorm and add_rmsnorm.
	for _, tc := range []struct {
		x      []int
		dx, dw tensor.DType
	}{
		{[]int{1, 1}, F32, F32},
		{[]int{3, 7}, F32, F32},
		{[]int{2, 3, 64}, BF16, BF16},
		{[]int{4, 33}, BF16, F32},
		{[]int{2, 16}, F32, BF16},
		{[]int{3, 10}, F16, F16},
		{[]int{37, 2048}, F32, BF16}, // several workers
		{[]int{0, 8}, F32, F32},
	} {
		D := tc.x[len(tc.x)-1]
		x := randTensor(rng, tc.dx, tc.x, -3, 3)
		r := randTensor(rng, tc.dx, tc.x, -3, 3)
		w := randTensor(rng, tc.dw, []int{D}, 0.5, 1.5)
		od := promote(tc.dw, tc.dx)
		for _, eps := range []float64{1e-5, 1e-6} {
			cases = append(cases,
				kernelCase{name: fmt.Sprintf("rmsnorm %s%v w=%s eps=%g", tc.dx, tc.x, tc.dw, eps),
					op: "rmsnorm", attrs: graph.Attrs{"eps": eps}, in: []*tensor.Tensor{x, w}, fast: fastRMSNorm, tol: relTol(od)},
				kernelCase{name: fmt.Sprintf("add_rmsnorm %s%v w=%s eps=%g", tc.dx, tc.x, tc.dw, eps),
					op: "add_rmsnorm", attrs: graph.Attrs{"eps": eps}, in: []*tensor.Tensor{x, r, w}, fast: fastAddRMSNorm, tol: relTol(od, tc.dx)})
		}
	}
	xb, rf := randTensor(rng, BF16, []int{3, 8}, -2, 2), randTensor(rng, F32, []int{3, 8}, -2, 2)
	cases = append(cases, kernelCase{name: "add_rmsnorm bf16+f32 residual", op: "add_rmsnorm", attrs: graph.Attrs{"eps": 1e-6},
		in: []*tensor.Tensor{xb, rf, randTensor(rng, BF16, []int{8}, 0.5, 1.5)}, fast: fastAddRMSNorm, tol: relTol(F32, F32)})

	// rope: positions from 0, from 5, with gaps, per-batch offsets; scaling 1 and not.
	for _, tc := range []struct {
		B, H, KV, S, D int
		pos            *tensor.Tensor
		scaling        float64
		dt             tensor.DType
	}{
		{1, 1, 1, 1, 2, positionsFrom(tensor.I32, 1, 1, 0), 1, F32},
		{1, 4, 2, 3, 8, positionsFrom(tensor.I32, 3, 1, 5), 1, F32},
		{2, 4, 2, 5, 8, positionsFrom(tensor.I64, 5, 3, 0, 7), 0.5, F32},
		{2, 6, 1, 4, 16, positionsFrom(tensor.I32, 4, 1, 5, 1000), 1, BF16},
		{1, 32, 8, 8, 64, positionsFrom(tensor.I32, 8, 1, 5), 1, BF16},
		{1, 3, 3, 2, 4, positionsFrom(tensor.I32, 2, 2, 9), 0.7, F16},
		{1, 32, 8, 37, 64, positionsFrom(tensor.I32, 37, 1, 0), 1, F32}, // several workers
	} {
		inv := make([]float64, tc.D/2)
		for i := range inv {
			inv[i] = math.Pow(10000, -2*float64(i)/float64(tc.D))
		}
		q := randTensor(rng, tc.dt, []int{tc.B, tc.H, tc.S, tc.D}, -2, 2)
		k := randTensor(rng, tc.dt, []int{tc.B, tc.KV, tc.S, tc.D}, -2, 2)
		cases = append(cases, kernelCase{
			name: fmt.Sprintf("rope %s B=%d H=%d KV=%d S=%d D=%d pos=%v scaling=%g", tc.dt, tc.B, tc.H, tc.KV, tc.S, tc.D, values(tc.pos), tc.scaling),
			op:   "rope", attrs: graph.Attrs{"inv_freq": inv, "scaling": tc.scaling}, in: []*tensor.Tensor{q, k, tc.pos}, fast: fastRope,
			// rope sums two rounded products: allow for cancellation against the inputs' size.
			tol: func(o, i int, r float64) float64 { return (math.Abs(r) + 2) * max(1e-6, ulp(tc.dt)) },
		})
	}

	// repeat_kv.
	for _, tc := range []struct {
		shape []int
		n     int
		dt    tensor.DType
	}{
		{[]int{1, 8, 3, 4}, 1, F32},
		{[]int{2, 2, 3, 5}, 2, BF16},
		{[]int{1, 8, 8, 64}, 4, F32},
		{[]int{2, 1, 2, 3}, 6, tensor.I32},
		{[]int{1, 2, 0, 4}, 3, F32},
	} {
		x := randTensor(rng, tc.dt, tc.shape, -9, 9)
		cases = append(cases, kernelCase{name: fmt.Sprintf("repeat_kv %s%v n=%d", tc.dt, tc.shape, tc.n),
			op: "repeat_kv", attrs: graph.Attrs{"n": tc.n}, in: []*tensor.Tensor{x}, fast: fastRepeatKV, tol: relTol(tc.dt)})
	}

	// sdpa: GQA ratios 1, 2, 4, 6; windows; positions from 0, from 5, with gaps, per-batch offsets.
	for _, tc := range []struct {
		B, H, KV, S, D int
		pos            *tensor.Tensor
		window         int
		dt             tensor.DType
	}{
		{1, 1, 1, 1, 4, positionsFrom(tensor.I32, 1, 1, 0), 0, F32},
		{1, 4, 4, 5, 8, positionsFrom(tensor.I32, 5, 1, 0), 0, F32},
		{2, 4, 2, 5, 8, positionsFrom(tensor.I32, 5, 1, 0, 3), 0, F32},
		{1, 8, 2, 7, 3, positionsFrom(tensor.I64, 7, 1, 5), 3, F32},
		{2, 6, 1, 6, 16, positionsFrom(tensor.I32, 6, 2, 5, 0), 2, F32},
		{1, 12, 2, 9, 8, positionsFrom(tensor.I32, 9, 1, 5), 1, F32},
		{1, 4, 2, 5, 8, positionsFrom(tensor.I32, 5, 1, 5), 0, BF16},
		{2, 8, 2, 6, 16, positionsFrom(tensor.I32, 6, 1, 0, 5), 4, BF16},
		{1, 6, 1, 4, 8, positionsFrom(tensor.I32, 4, 3, 2), 5, F16},
		{1, 32, 8, 8, 64, positionsFrom(tensor.I32, 8, 1, 5), 0, F32},
		{1, 32, 8, 8, 64, positionsFrom(tensor.I32, 8, 1, 5), 0, BF16},
		{1, 8, 2, 40, 64, positionsFrom(tensor.I32, 40, 1, 0), 16, F32}, // several workers, window
	} {
		q := randTensor(rng, tc.dt, []int{tc.B, tc.H, tc.S, tc.D}, -2, 2)
		k := randTensor(rng, tc.dt, []int{tc.B, tc.KV, tc.S, tc.D}, -2, 2)
		v := randTensor(rng, tc.dt, []int{tc.B, tc.KV, tc.S, tc.D}, -1, 1)
		vmax := 0.0
		for _, x := range values(v) {
			vmax = max(vmax, math.Abs(x))
		}
		atol := 1e-4 * vmax
		if tc.dt != F32 {
			atol = 1.0 / 128 * vmax
		}
		cases = append(cases, kernelCase{
			name: fmt.Sprintf("sdpa %s B=%d H=%d KV=%d S=%d D=%d pos=%v window=%d", tc.dt, tc.B, tc.H, tc.KV, tc.S, tc.D, values(tc.pos), tc.window),
			op:   "sdpa", attrs: graph.Attrs{"scale": 1 / math.Sqrt(float64(tc.D)), "window": tc.window},
			in: []*tensor.Tensor{q, k, v, tc.pos}, fast: fastSDPA,
			tol: func(o, i int, r float64) float64 { return atol },
		})
	}

	// swiglu: chunks of 1024 elements, split over workers for the large case.
	for _, tc := range []struct {
		shape  []int
		dg, du tensor.DType
	}{
		{[]int{1}, F32, F32},
		{[]int{3, 5}, BF16, BF16},
		{[]int{2, 700}, BF16, F32},
		{[]int{4, 9}, F16, F16},
		{[]int{8, 8192}, F32, F32},
		{[]int{0, 3}, F32, F32},
	} {
		g, u := randTensor(rng, tc.dg, tc.shape, -6, 6), randTensor(rng, tc.du, tc.shape, -3, 3)
		cases = append(cases, kernelCase{name: fmt.Sprintf("swiglu %s,%s%v", tc.dg, tc.du, tc.shape),
			op: "swiglu", in: []*tensor.Tensor{g, u}, fast: fastSwiGLU, tol: relTol(promote(tc.dg, tc.du))})
	}

	for _, c := range cases {
		t.Run(c.name, c.run)
	}
}

// TestFastKernelsRegistered: Compile picks the fast kernels, Reference still gives the
// reference ones.
func TestFastKernelsRegistered(t *testing.T) {
	for op, fast := range map[string]Kernel{
		"linear": fastLinear, "matmul": fastMatmul, "rmsnorm": fastRMSNorm, "add_rmsnorm": fastAddRMSNorm,
		"rope": fastRope, "repeat_kv": fastRepeatKV, "sdpa": fastSDPA, "swiglu": fastSwiGLU,
	} {
		k, ok := Lookup(op)
		if !ok || fmt.Sprintf("%p", k) != fmt.Sprintf("%p", fast) {
			t.Errorf("Lookup(%s) is not the fast kernel", op)
		}
		r, ok := Reference(op)
		if !ok || fmt.Sprintf("%p", r) == fmt.Sprintf("%p", fast) {
			t.Errorf("Reference(%s) is the fast kernel or missing", op)
		}
	}
}

// TestFastKernelsDeterministic: the split over workers does not change any bit.
func TestFastKernelsDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(103, 104))
	x := randTensor(rng, tensor.F32, []int{7, 257}, -1, 1)
	w := randTensor(rng, tensor.BF16, []int{301, 257}, -1, 1)
	q := randTensor(rng, tensor.F32, []int{1, 8, 33, 16}, -1, 1)
	kv := randTensor(rng, tensor.F32, []int{1, 2, 33, 16}, -1, 1)
	pos := positionsFrom(tensor.I32, 33, 1, 5)
	attrs := graph.Attrs{"scale": 0.25, "window": 0}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	var lin, att []*tensor.Tensor
	for _, procs := range []int{1, 3, 8} {
		runtime.GOMAXPROCS(procs)
		n, o := nodeFor(t, "linear", nil, []*tensor.Tensor{x, w})
		r, err := fastLinear(n, []*tensor.Tensor{x, w}, o)
		if err != nil {
			t.Fatal(err)
		}
		lin = append(lin, r[0])
		n, o = nodeFor(t, "sdpa", attrs, []*tensor.Tensor{q, kv, kv, pos})
		if r, err = fastSDPA(n, []*tensor.Tensor{q, kv, kv, pos}, o); err != nil {
			t.Fatal(err)
		}
		att = append(att, r[0])
	}
	for i := 1; i < len(lin); i++ {
		if !slices.Equal(lin[0].F32, lin[i].F32) || !slices.Equal(att[0].F32, att[i].F32) {
			t.Errorf("results depend on GOMAXPROCS")
		}
	}
}

// TestFastKernelErrors: inputs that do not fit the op are errors, not panics.
func TestFastKernelErrors(t *testing.T) {
	f := func(dt tensor.DType, shape ...int) *tensor.Tensor { return tensor.New(dt, shape...) }
	F32 := tensor.F32
	for _, tc := range []struct {
		name  string
		k     Kernel
		op    string
		attrs graph.Attrs
		node  []*tensor.Tensor // the node is built over these
		in    []*tensor.Tensor // the kernel is called with these
	}{
		{"linear K", fastLinear, "linear", nil, []*tensor.Tensor{f(F32, 2, 4), f(F32, 3, 4)}, []*tensor.Tensor{f(F32, 2, 5), f(F32, 3, 4)}},
		{"linear int", fastLinear, "linear", nil, []*tensor.Tensor{f(F32, 2, 4), f(F32, 3, 4)}, []*tensor.Tensor{f(tensor.I32, 2, 4), f(F32, 3, 4)}},
		{"matmul inner", fastMatmul, "matmul", nil, []*tensor.Tensor{f(F32, 2, 4), f(F32, 4, 3)}, []*tensor.Tensor{f(F32, 2, 4), f(F32, 5, 3)}},
		{"rmsnorm weight", fastRMSNorm, "rmsnorm", graph.Attrs{"eps": 1e-6}, []*tensor.Tensor{f(F32, 2, 4), f(F32, 4)}, []*tensor.Tensor{f(F32, 2, 4), f(F32, 5)}},
		{"rmsnorm arity", fastRMSNorm, "rmsnorm", graph.Attrs{"eps": 1e-6}, []*tensor.Tensor{f(F32, 2, 4), f(F32, 4)}, []*tensor.Tensor{f(F32, 2, 4)}},
		{"add_rmsnorm residual", fastAddRMSNorm, "add_rmsnorm", graph.Attrs{"eps": 1e-6},
			[]*tensor.Tensor{f(F32, 2, 4), f(F32, 2, 4), f(F32, 4)}, []*tensor.Tensor{f(F32, 2, 4), f(F32, 3, 4), f(F32, 4)}},
		{"rope positions", fastRope, "rope", graph.Attrs{"inv_freq": []float64{1, 0.5}},
			[]*tensor.Tensor{f(F32, 1, 2, 3, 4), f(F32, 1, 1, 3, 4), f(tensor.I32, 1, 3)}, []*tensor.Tensor{f(F32, 1, 2, 3, 4), f(F32, 1, 1, 3, 4), f(tensor.I32, 3)}},
		{"rope head size", fastRope, "rope", graph.Attrs{"inv_freq": []float64{1, 0.5}},
			[]*tensor.Tensor{f(F32, 1, 2, 3, 4), f(F32, 1, 1, 3, 4), f(tensor.I32, 1, 3)}, []*tensor.Tensor{f(F32, 1, 2, 3, 6), f(F32, 1, 1, 3, 6), f(tensor.I32, 1, 3)}},
		{"repeat_kv rank", fastRepeatKV, "repeat_kv", graph.Attrs{"n": 2}, []*tensor.Tensor{f(F32, 1, 2, 3, 4)}, []*tensor.Tensor{f(F32, 2, 3, 4)}},
		{"sdpa heads", fastSDPA, "sdpa", graph.Attrs{"scale": 0.5},
			[]*tensor.Tensor{f(F32, 1, 4, 3, 2), f(F32, 1, 2, 3, 2), f(F32, 1, 2, 3, 2), f(tensor.I32, 1, 3)},
			[]*tensor.Tensor{f(F32, 1, 4, 3, 2), f(F32, 1, 3, 3, 2), f(F32, 1, 3, 3, 2), f(tensor.I32, 1, 3)}},
		{"sdpa positions", fastSDPA, "sdpa", graph.Attrs{"scale": 0.5},
			[]*tensor.Tensor{f(F32, 1, 4, 3, 2), f(F32, 1, 2, 3, 2), f(F32, 1, 2, 3, 2), f(tensor.I32, 1, 3)},
			[]*tensor.Tensor{f(F32, 1, 4, 3, 2), f(F32, 1, 2, 3, 2), f(F32, 1, 2, 3, 2), f(F32, 1, 3)}},
		{"swiglu shapes", fastSwiGLU, "swiglu", nil, []*tensor.Tensor{f(F32, 2, 3), f(F32, 2, 3)}, []*tensor.Tensor{f(F32, 2, 3), f(F32, 3, 2)}},
		{"bad storage", fastSwiGLU, "swiglu", nil, []*tensor.Tensor{f(F32, 2, 3), f(F32, 2, 3)}, []*tensor.Tensor{f(F32, 2, 3), {DType: F32, Shape: []int{2, 3}}}},
	} {
		n, outs := nodeFor(t, tc.op, tc.attrs, tc.node)
		if _, err := runKernel(tc.k, n, tc.in, outs); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

// TestParallel: every index is visited once, whatever the grain and the worker count, also
// from concurrent and nested calls.
func TestParallel(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, procs := range []int{1, 2, 5} {
		runtime.GOMAXPROCS(procs)
		for _, tc := range [][2]int{{0, 1}, {1, 1}, {10, 3}, {1000, 7}, {64, 64}, {5, 100}} {
			seen := make([]int32, tc[0])
			parallel(tc[0], tc[1], func(lo, hi int) {
				parallel(hi-lo, 2, func(a, b int) {
					for i := lo + a; i < lo+b; i++ {
						seen[i]++
					}
				})
			})
			for i, s := range seen {
				if s != 1 {
					t.Fatalf("procs=%d n=%d grain=%d: index %d visited %d times", procs, tc[0], tc[1], i, s)
				}
			}
		}
		// Concurrent callers, each nesting calls: no deadlock, every index once.
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				seen := make([]atomic.Int32, 300+g)
				for range 20 {
					parallel(len(seen), 7, func(lo, hi int) {
						parallel(hi-lo, 1, func(a, b int) {
							for i := lo + a; i < lo+b; i++ {
								seen[i].Add(1)
							}
						})
					})
				}
				for i := range seen {
					if n := seen[i].Load(); n != 20 {
						t.Errorf("procs=%d caller %d: index %d visited %d times, want 20", procs, g, i, n)
						return
					}
				}
			})
		}
		wg.Wait()
	}
}
