package cpu

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// concatRows returns the concatenation of matrices [n_i, K] of one dtype along axis 0.
func concatRows(parts []*tensor.Tensor) *tensor.Tensor {
	N := 0
	for _, p := range parts {
		N += p.Shape[0]
	}
	w := tensor.New(parts[0].DType, N, parts[0].Shape[1])
	off := 0
	for _, p := range parts {
		tensor.CopyRange(w, off, p, 0, p.Numel())
		off += p.Numel()
	}
	return w
}

// TestLinearPartsSameBits: linear on a weight given as its parts gives, on every kernel set, the
// bits fastLinear gives on their concatenation: for one row of x (decode: outputs written in
// place) and many (through the per-part buffers), bf16, f16 and f32 weights, x of f32 and
// bf16, K off the vector widths, and splits over the pool whose chunks start inside a part and
// span several (1200 rows at K = 64 are chunks of 512).
func TestLinearPartsSameBits(t *testing.T) {
	rng := rand.New(rand.NewPCG(121, 122))
	shapes := []struct {
		M    int
		rows []int
		K    int
	}{
		{1, []int{8, 4, 4}, 64}, {1, []int{12, 4, 8}, 203}, {3, []int{4, 4}, 7}, {8, []int{16, 8, 8}, 67},
		{30, []int{40, 8, 12}, 300}, {61, []int{36, 8, 4}, 896}, {1, []int{1000, 100, 100}, 64}, {5, []int{1000, 100, 100}, 64},
	}
	skipMissingSets(t)
	for _, s := range kernelSets {
		t.Run(s.name, func(t *testing.T) {
			withKernelSet(s, func() {
				for _, dw := range []tensor.DType{tensor.BF16, tensor.F16, tensor.F32} {
					for _, dx := range []tensor.DType{tensor.F32, tensor.BF16} {
						for _, sh := range shapes {
							parts := make([]*tensor.Tensor, len(sh.rows))
							for i, n := range sh.rows {
								parts[i] = randTensor(rng, dw, []int{n, sh.K}, -1, 1)
							}
							x := randTensor(rng, dx, []int{sh.M, sh.K}, -1, 1)
							want := runOn(t, fastLinear, "linear", nil, x, concatRows(parts))
							got, err := fastLinearParts(x, parts, Out{DType: dx, Shape: want[0].Shape})
							if err != nil {
								t.Fatal(err)
							}
							sameBits(t, fmt.Sprintf("w %s x %s M %d rows %v K %d", dw, dx, sh.M, sh.rows, sh.K), []*tensor.Tensor{got}, want)
						}
					}
				}
			})
		})
	}
}

// TestLinearPartsErrors: parts that do not make one weight for x are errors, not panics.
func TestLinearPartsErrors(t *testing.T) {
	x := tensor.New(tensor.F32, 2, 8)
	for _, c := range []struct {
		name  string
		parts []*tensor.Tensor
		out   []int
	}{
		{"rows off four", []*tensor.Tensor{tensor.New(tensor.BF16, 4, 8), tensor.New(tensor.BF16, 3, 8)}, []int{2, 7}},
		{"other K", []*tensor.Tensor{tensor.New(tensor.BF16, 4, 8), tensor.New(tensor.BF16, 4, 9)}, []int{2, 8}},
		{"two dtypes", []*tensor.Tensor{tensor.New(tensor.BF16, 4, 8), tensor.New(tensor.F32, 4, 8)}, []int{2, 8}},
		{"1-D part", []*tensor.Tensor{tensor.New(tensor.BF16, 4, 8), tensor.New(tensor.BF16, 32)}, []int{2, 8}},
		{"output of other N", []*tensor.Tensor{tensor.New(tensor.BF16, 4, 8), tensor.New(tensor.BF16, 4, 8)}, []int{2, 12}},
	} {
		if _, err := fastLinearParts(x, c.parts, Out{DType: tensor.F32, Shape: c.out}); err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
}

// partedGraph builds one fused linear of op (linear, linear_swiglu or linear_qkv_rope) on the
// concatenation of params named by keys, each [rows[i], 32], reading x [1, S, 32]; also, per
// flags, the concatenation as a graph output and neg of it (other readers).
func partedGraph(t *testing.T, op string, keys []string, rows []int, asOutput, negated bool) *graph.Graph {
	b := graph.NewBuilder("parted")
	x := b.Input("x", tensor.F32, graph.Shape{graph.D(1), graph.Sym("S"), graph.D(32)})
	ws := make([]*graph.Value, len(keys))
	for i, k := range keys {
		ws[i] = b.Param(k, tensor.BF16, graph.Dims(rows[i], 32))
	}
	w := b.Named("w", "concat", graph.Attrs{"axis": 0}, ws...)
	switch op {
	case "linear":
		b.Output(b.Linear(x, w))
	case "linear_swiglu":
		b.Output(b.Apply(op, nil, x, w)...)
	case "linear_qkv_rope": // heads 2, kv_heads 1, head size 8: q 16 rows, k 8, v 8
		pos := b.Input("positions", tensor.I32, graph.Shape{graph.D(1), graph.Sym("S")})
		b.Output(b.Apply(op, graph.Attrs{"heads": 2, "kv_heads": 1, "inv_freq": []float64{1, 0.1, 0.01, 0.001}}, x, w, pos)...)
	}
	if asOutput {
		b.Output(w)
	}
	if negated {
		b.Output(b.Neg(w))
	}
	return mustBuild(t, b)
}

// TestConcatKeptAsParts: with weights that are views of a mapping (they have ViewConcat) but
// cannot view a fused weight whole, the program keeps the very tensors Load returned as the
// fused weight's parts (no copy: LoadInto never called, no concatenation held), and its linear,
// linear_swiglu and linear_qkv_rope give the bits of the program that folds the concatenation
// (plain MapWeights). Where parts cannot serve (rows off multiples of four, the concatenation
// also a graph output or read by another op, another kernel registered for linear) the
// concatenation is read into one tensor as before.
func TestConcatKeptAsParts(t *testing.T) {
	rng := rand.New(rand.NewPCG(123, 124))
	notAdjacent := func([]graph.ParamRef) (*tensor.Tensor, bool, error) { return nil, false, nil }
	cases := []struct {
		name              string
		op                string
		rows              []int
		asOutput, negated bool
		foreignLinear     bool
		parted            bool
	}{
		{"linear", "linear", []int{16, 8, 8}, false, false, false, true},
		{"linear_swiglu", "linear_swiglu", []int{16, 16}, false, false, false, true},
		{"linear_qkv_rope", "linear_qkv_rope", []int{16, 8, 8}, false, false, false, true},
		{"rows off four", "linear", []int{14, 8, 8}, false, false, false, false},
		{"also an output", "linear", []int{16, 8, 8}, true, false, false, false},
		{"also read by neg", "linear", []int{16, 8, 8}, false, true, false, false},
		{"another linear kernel", "linear", []int{16, 8, 8}, false, false, true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			keys := []string{"wq", "wk", "wv"}[:len(c.rows)]
			m := MapWeights{}
			for i, k := range keys {
				m[k] = randTensor(rng, tensor.BF16, []int{c.rows[i], 32}, -1, 1)
			}
			g := partedGraph(t, c.op, keys, c.rows, c.asOutput, c.negated)
			folded := mustCompile(t, g, m)
			if c.foreignLinear {
				Register("linear", func(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
					return fastLinear(n, in, out)
				})
				defer Register("linear", fastLinear)
			}
			w := &viewWeights{intoWeights: intoWeights{MapWeights: m}, view: notAdjacent}
			p, err := Compile(context.Background(), g, w)
			if err != nil {
				t.Fatal(err)
			}
			if c.parted {
				if w.intos != 0 || w.loads != len(keys) {
					t.Errorf("LoadInto called %d times, Load %d: want 0 and %d (each part loaded as it is)", w.intos, w.loads, len(keys))
				}
				var held []*tensor.Tensor
				for _, f := range p.fixed {
					if f != nil {
						held = append(held, f)
					}
				}
				for _, k := range keys {
					if !slices.Contains(held, m[k]) {
						t.Errorf("the program does not hold the tensor Load gave for %s", k)
					}
				}
				if len(held) != len(keys) || len(p.parts) != 1 {
					t.Errorf("the program holds %d tensors and %d parted weights, want the %d parts of one", len(held), len(p.parts), len(keys))
				}
			} else if w.intos != len(keys) || len(p.parts) != 0 {
				t.Errorf("LoadInto called %d times, %d parted weights; want %d and none (one fused tensor)", w.intos, len(p.parts), len(keys))
			}
			if p.WeightBytes() != folded.WeightBytes() {
				t.Errorf("holds %d weight bytes, the folding program %d", p.WeightBytes(), folded.WeightBytes())
			}
			for _, S := range []int{1, 5} {
				in := map[string]*tensor.Tensor{"x": randTensor(rng, tensor.F32, []int{1, S, 32}, -1, 1)}
				if c.op == "linear_qkv_rope" {
					in["positions"] = randTensor(rng, tensor.I32, []int{1, S}, 0, 4000)
				}
				got, err := p.Run(context.Background(), in)
				if err != nil {
					t.Fatal(err)
				}
				want, err := folded.Run(context.Background(), in)
				if err != nil {
					t.Fatal(err)
				}
				sameBits(t, fmt.Sprintf("S=%d", S), got, want)
			}
		})
	}
}

// BenchmarkLinearParts: Qwen2.5-0.5B's fused q/k/v linear (896+128+128 rows, K = 896, bf16) on
// the concatenated weight and on its three parts, for one row of x (decode) and 128 (prefill).
func BenchmarkLinearParts(b *testing.B) {
	rng := rand.New(rand.NewPCG(125, 126))
	const K = 896
	parts := []*tensor.Tensor{
		randTensor(rng, tensor.BF16, []int{896, K}, -1, 1),
		randTensor(rng, tensor.BF16, []int{128, K}, -1, 1),
		randTensor(rng, tensor.BF16, []int{128, K}, -1, 1),
	}
	whole := concatRows(parts)
	for _, M := range []int{1, 128} {
		x := randTensor(rng, tensor.BF16, []int{M, K}, -1, 1)
		n, outs := nodeFor(b, "linear", nil, []*tensor.Tensor{x, whole})
		b.Run(fmt.Sprintf("M%d/fused", M), func(b *testing.B) {
			for b.Loop() {
				if _, err := fastLinear(n, []*tensor.Tensor{x, whole}, outs); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("M%d/parts", M), func(b *testing.B) {
			for b.Loop() {
				if _, err := fastLinearParts(x, parts, outs[0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
