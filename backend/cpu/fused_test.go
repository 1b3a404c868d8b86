package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Fused ops run their decomposition as reference kernel; these tests hold that to scalar
// computations of what each op's doc says.

// checkTensorAbs compares like checkTensor, allowing an absolute error atol on top of the
// relative tolerance(dt): for results that are differences of rounded terms.
func checkTensorAbs(t *testing.T, what string, got *tensor.Tensor, dt tensor.DType, shape []int, want []float64, atol float64) {
	t.Helper()
	if got.DType != dt || fmt.Sprint(got.Shape) != fmt.Sprint(shape) {
		t.Fatalf("%s: got %s%v, want %s%v", what, got.DType, got.Shape, dt, shape)
	}
	bad := 0
	for i, w := range want {
		g := got.At(i)
		if math.Abs(g-roundTo(dt, w)) > atol+tolerance(dt)*math.Abs(w) || math.IsNaN(g) != math.IsNaN(w) {
			if bad++; bad <= 5 {
				t.Errorf("%s: element %d (index %v) = %v, want %v", what, i, unflatten(i, shape), g, w)
			}
		}
	}
}

func promote(a, b tensor.DType) tensor.DType {
	dt, err := graph.Promote(a, b)
	if err != nil {
		panic(err)
	}
	return dt
}

// rmsnormExpect is HF's RMSNorm: w * cast(x / sqrt(mean(x^2) + eps), x.dtype), per row.
func rmsnormExpect(x, w *tensor.Tensor, eps float64) []float64 {
	D := w.Numel()
	want := make([]float64, x.Numel())
	for r := range x.Numel() / D {
		ms := 0.0
		for d := range D {
			ms += x.At(r*D+d) * x.At(r*D+d)
		}
		inv := 1 / math.Sqrt(ms/float64(D)+eps)
		for d := range D {
			want[r*D+d] = w.At(d) * roundTo(x.DType, x.At(r*D+d)*inv)
		}
	}
	return want
}

func TestRMSNorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(71, 72))
	for _, dt := range [][2]tensor.DType{{tensor.F32, tensor.F32}, {tensor.BF16, tensor.BF16}, {tensor.BF16, tensor.F32}, {tensor.F16, tensor.F16}} {
		x := randTensor(rng, dt[0], []int{2, 3, 16}, -2, 2)
		w := randTensor(rng, dt[1], []int{16}, 0.5, 1.5)
		got := mustRunOp(t, "rmsnorm", graph.Attrs{"eps": 1e-5}, x, w)
		out := promote(dt[1], dt[0])
		checkTensorAbs(t, fmt.Sprintf("rmsnorm %s,%s", dt[0], dt[1]), got[0], out, x.Shape, rmsnormExpect(x, w, 1e-5), 2*tolerance(out))
	}
}

func TestAddRMSNorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(73, 74))
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		x := randTensor(rng, dt, []int{3, 8}, -2, 2)
		res := randTensor(rng, dt, []int{3, 8}, -2, 2)
		w := randTensor(rng, dt, []int{8}, 0.5, 1.5)
		sumVals := make([]float64, x.Numel())
		for i := range sumVals {
			sumVals[i] = roundTo(dt, x.At(i)+res.At(i))
		}
		sum := fromValues(dt, x.Shape, sumVals)
		got := mustRunOp(t, "add_rmsnorm", graph.Attrs{"eps": 1e-6}, x, res, w)
		checkTensorAbs(t, "add_rmsnorm out "+dt.String(), got[0], dt, x.Shape, rmsnormExpect(sum, w, 1e-6), 2*tolerance(dt))
		checkTensorTol(t, "add_rmsnorm sum "+dt.String(), got[1], dt, x.Shape, sumVals, 0)
	}
}

func TestSwiGLU(t *testing.T) {
	rng := rand.New(rand.NewPCG(75, 76))
	for _, dt := range [][2]tensor.DType{{tensor.F32, tensor.F32}, {tensor.BF16, tensor.BF16}, {tensor.BF16, tensor.F32}} {
		g := randTensor(rng, dt[0], []int{2, 5}, -4, 4)
		u := randTensor(rng, dt[1], []int{2, 5}, -4, 4)
		want := make([]float64, g.Numel())
		for i := range want {
			x := g.At(i)
			want[i] = roundTo(dt[0], x/(1+math.Exp(-x))) * u.At(i)
		}
		out := promote(dt[0], dt[1])
		checkTensorAbs(t, fmt.Sprintf("swiglu %s,%s", dt[0], dt[1]), mustRunOp(t, "swiglu", nil, g, u)[0], out, g.Shape, want, tolerance(out))
	}
}

func TestRepeatKV(t *testing.T) {
	rng := rand.New(rand.NewPCG(77, 78))
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.I32} {
		for _, n := range []int{1, 3} {
			in := []int{2, 2, 3, 4}
			x := randTensor(rng, dt, in, -9, 9)
			shape := []int{2, 2 * n, 3, 4}
			want := make([]float64, tensor.Numel(shape))
			for i := range want {
				idx := unflatten(i, shape)
				idx[1] /= n
				want[i] = x.At(flatten(idx, in))
			}
			got := mustRunOp(t, "repeat_kv", graph.Attrs{"n": n}, x)
			checkTensorTol(t, fmt.Sprintf("repeat_kv %s n=%d", dt, n), got[0], dt, shape, want, 0)
			if n == 1 && got[0] == x {
				t.Errorf("repeat_kv n=1 returned its input")
			}
		}
	}
}

func TestRope(t *testing.T) {
	rng := rand.New(rand.NewPCG(79, 80))
	const B, H, KV, S, D = 2, 4, 2, 3, 8
	invFreq := []float64{1, 0.3, 0.1, 0.01}
	pos := tensor.FromI32([]int32{0, 1, 2, 5, 6, 7}, B, S)
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		for _, scaling := range []float64{1, 0.5} {
			q := randTensor(rng, dt, []int{B, H, S, D}, -1, 1)
			k := randTensor(rng, dt, []int{B, KV, S, D}, -1, 1)
			expect := func(x *tensor.Tensor) []float64 {
				want := make([]float64, x.Numel())
				for i := range want {
					idx := unflatten(i, x.Shape)
					b, s, d := idx[0], idx[2], idx[3]
					// The angle is a float32 product, as the op computes it.
					f := float64(float32(pos.At(b*S+s)) * float32(invFreq[d%(D/2)]))
					c := roundTo(dt, roundTo(tensor.F32, math.Cos(f))*scaling)
					sn := roundTo(dt, roundTo(tensor.F32, math.Sin(f))*scaling)
					j := idx
					var rot float64
					if d < D/2 {
						j[3] = d + D/2
						rot = -x.At(flatten(j, x.Shape))
					} else {
						j[3] = d - D/2
						rot = x.At(flatten(j, x.Shape))
					}
					want[i] = x.At(i)*c + rot*sn
				}
				return want
			}
			got := mustRunOp(t, "rope", graph.Attrs{"inv_freq": invFreq, "scaling": scaling}, q, k, pos)
			name := fmt.Sprintf("rope %s scaling=%v", dt, scaling)
			checkTensorAbs(t, name+" q", got[0], dt, q.Shape, expect(q), 2*tolerance(dt))
			checkTensorAbs(t, name+" k", got[1], dt, k.Shape, expect(k), 2*tolerance(dt))
		}
	}
}

func TestSDPA(t *testing.T) {
	rng := rand.New(rand.NewPCG(81, 82))
	const B, H, KV, S, D = 2, 4, 2, 5, 8
	pos := tensor.FromI32([]int32{0, 1, 2, 3, 4, 3, 4, 5, 6, 7}, B, S)
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		for _, window := range []int{0, 2} {
			q := randTensor(rng, dt, []int{B, H, S, D}, -1, 1)
			k := randTensor(rng, dt, []int{B, KV, S, D}, -1, 1)
			v := randTensor(rng, dt, []int{B, KV, S, D}, -1, 1)
			scale := 1 / math.Sqrt(D)
			want := make([]float64, q.Numel())
			for b := range B {
				for h := range H {
					kh := h / (H / KV)
					for i := range S {
						pi := pos.At(b*S + i)
						var ws []float64
						var js []int
						for j := range S {
							pj := pos.At(b*S + j)
							if pj > pi || (window > 0 && pj <= pi-float64(window)) {
								continue
							}
							s := 0.0
							for d := range D {
								s += q.At(flatten([]int{b, h, i, d}, q.Shape)) * k.At(flatten([]int{b, kh, j, d}, k.Shape))
							}
							ws, js = append(ws, s*scale), append(js, j)
						}
						m := math.Inf(-1)
						for _, s := range ws {
							m = math.Max(m, s)
						}
						den := 0.0
						for x := range ws {
							ws[x] = math.Exp(ws[x] - m)
							den += ws[x]
						}
						for d := range D {
							o := 0.0
							for x, j := range js {
								o += ws[x] / den * v.At(flatten([]int{b, kh, j, d}, v.Shape))
							}
							want[flatten([]int{b, h, i, d}, q.Shape)] = o
						}
					}
				}
			}
			got := mustRunOp(t, "sdpa", graph.Attrs{"scale": scale, "window": window}, q, k, v, pos)
			atol := 1e-6
			if dt == tensor.BF16 {
				atol = 3e-2 // scores and probabilities are rounded to bf16 on the way
			}
			checkTensorAbs(t, fmt.Sprintf("sdpa %s window=%d", dt, window), got[0], dt, q.Shape, want, atol)
		}
	}
}

// TestDecomposedChecksInputs: the decomposition kernel, called directly with inputs that do
// not fit the op, returns an error instead of building a broken graph.
func TestDecomposedChecksInputs(t *testing.T) {
	k, ok := Reference("rope")
	if !ok {
		t.Fatal("no reference kernel for rope")
	}
	b := graph.NewBuilder("rope")
	q := b.Input("q", tensor.F32, graph.Dims(1, 1, 2, 4))
	p := b.Input("p", tensor.I32, graph.Dims(1, 2))
	outs := b.Apply("rope", graph.Attrs{"inv_freq": []float64{1, 0.5}}, q, q, p)
	if err := b.Err(); err != nil {
		t.Fatal(err)
	}
	n := outs[0].Producer
	o := []Out{{DType: tensor.F32, Shape: []int{1, 1, 2, 4}}, {DType: tensor.F32, Shape: []int{1, 1, 2, 4}}}
	qt := tensor.New(tensor.F32, 1, 1, 2, 4)
	if _, err := k(n, []*tensor.Tensor{qt, qt, tensor.New(tensor.I32, 2)}, o); err == nil {
		t.Errorf("rope with positions of rank 1: no error")
	}
	if _, err := k(n, []*tensor.Tensor{qt, qt, tensor.New(tensor.I32, 1, 2)}, o[:1]); err == nil {
		t.Errorf("rope asked for one output: no error")
	}
	res, err := k(n, []*tensor.Tensor{qt, qt, tensor.New(tensor.I32, 1, 2)}, o)
	if err != nil || len(res) != 2 {
		t.Errorf("rope called directly: %v, %v", res, err)
	}
}
