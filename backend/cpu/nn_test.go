package cpu

import (
	"context"
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

// quarters fills a tensor with multiples of 1/4 in [-2, 2]: exact in every float dtype, and
// exact in float32 sums of products, so matrix products can be checked exactly.
func quarters(rng *rand.Rand, dt tensor.DType, shape ...int) *tensor.Tensor {
	vals := make([]float64, tensor.Numel(shape))
	for i := range vals {
		vals[i] = float64(rng.IntN(17)-8) / 4
		if dt.IsInt() {
			vals[i] = float64(rng.IntN(9) - 4)
		}
	}
	return fromValues(dt, shape, vals)
}

func TestLinear(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, tc := range []struct {
		x      []int
		n      int
		dx, dw tensor.DType
	}{
		{[]int{2, 3, 16}, 5, tensor.F32, tensor.F32},
		{[]int{4, 8}, 7, tensor.BF16, tensor.BF16},
		{[]int{3, 8}, 6, tensor.F16, tensor.BF16},
		{[]int{2, 300}, 131, tensor.F32, tensor.BF16}, // several goroutines, uneven split
		{[]int{1, 1, 64}, 2049, tensor.F32, tensor.F16},
		{[]int{8}, 3, tensor.F32, tensor.F32}, // rank-1 x
		{[]int{0, 4}, 3, tensor.F32, tensor.F32},
		{[]int{2, 0}, 3, tensor.BF16, tensor.F32}, // K = 0: zeros
	} {
		name := fmt.Sprintf("%s%v@%s[%d,%d]", tc.dx, tc.x, tc.dw, tc.n, tc.x[len(tc.x)-1])
		t.Run(name, func(t *testing.T) {
			K := tc.x[len(tc.x)-1]
			x := quarters(rng, tc.dx, tc.x...)
			w := quarters(rng, tc.dw, tc.n, K)
			shape := append(slices.Clone(tc.x[:len(tc.x)-1]), tc.n)
			M := tensor.Numel(tc.x[:len(tc.x)-1])
			want := make([]float64, M*tc.n)
			for m := range M {
				for j := range tc.n {
					s := 0.0
					for k := range K {
						s += x.At(m*K+k) * w.At(j*K+k)
					}
					want[m*tc.n+j] = s
				}
			}
			got := mustRunOp(t, "linear", nil, x, w)
			checkTensor(t, name, got[0], tc.dx, shape, want)
		})
	}
}

// TestLinearWorkers checks that the split across goroutines does not change any bit.
func TestLinearWorkers(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	x := randTensor(rng, tensor.F32, []int{3, 257}, -1, 1)
	w := randTensor(rng, tensor.BF16, []int{301, 257}, -1, 1)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	var results []*tensor.Tensor
	for _, procs := range []int{1, 3, 8} {
		runtime.GOMAXPROCS(procs)
		results = append(results, mustRunOp(t, "linear", nil, x, w)[0])
	}
	for i := 1; i < len(results); i++ {
		if !slices.Equal(results[0].F32, results[i].F32) {
			t.Errorf("linear result depends on GOMAXPROCS")
		}
	}
}

func TestMatmul(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, 26))
	for _, tc := range []struct {
		a, b       []int
		da, db, do tensor.DType
	}{
		{[]int{3, 4}, []int{4, 5}, tensor.F32, tensor.F32, tensor.F32},
		{[]int{2, 3, 4}, []int{4, 5}, tensor.BF16, tensor.BF16, tensor.BF16},
		{[]int{2, 1, 3, 4}, []int{5, 4, 2}, tensor.F16, tensor.F32, tensor.F32},
		{[]int{1, 3, 4}, []int{2, 4, 6}, tensor.BF16, tensor.F16, tensor.F32},
		{[]int{2, 3, 40}, []int{2, 40, 70}, tensor.F32, tensor.BF16, tensor.F32},
		{[]int{2, 3, 4}, []int{2, 4, 5}, tensor.I32, tensor.I32, tensor.I32},
		{[]int{3, 4}, []int{2, 4, 2}, tensor.I32, tensor.I64, tensor.I64},
		{[]int{2, 0, 4}, []int{4, 3}, tensor.F32, tensor.F32, tensor.F32},
		{[]int{2, 3, 0}, []int{0, 3}, tensor.F32, tensor.F32, tensor.F32},
	} {
		name := fmt.Sprintf("%s%v@%s%v", tc.da, tc.a, tc.db, tc.b)
		t.Run(name, func(t *testing.T) {
			a, b := quarters(rng, tc.da, tc.a...), quarters(rng, tc.db, tc.b...)
			ra, rb := len(tc.a), len(tc.b)
			M, K, N := tc.a[ra-2], tc.a[ra-1], tc.b[rb-1]
			batch := testBroadcast(tc.a[:ra-2], tc.b[:rb-2])
			shape := append(slices.Clone(batch), M, N)
			want := make([]float64, tensor.Numel(shape))
			for i := range want {
				idx := unflatten(i, shape)
				bi, m, n := idx[:len(batch)], idx[len(batch)], idx[len(batch)+1]
				aBase := bcastIndex(bi, tc.a[:ra-2]) * M * K
				bBase := bcastIndex(bi, tc.b[:rb-2]) * K * N
				for k := range K {
					want[i] += a.At(aBase+m*K+k) * b.At(bBase+k*N+n)
				}
			}
			got := mustRunOp(t, "matmul", nil, a, b)
			checkTensor(t, name, got[0], tc.do, shape, want)
		})
	}
}

func TestEmbedding(t *testing.T) {
	rng := rand.New(rand.NewPCG(27, 28))
	for _, tc := range []struct {
		dt, idt tensor.DType
		ids     []int
	}{
		{tensor.F32, tensor.I32, []int{2, 2}},
		{tensor.BF16, tensor.I64, []int{4}},
		{tensor.F16, tensor.I32, []int{}},
		{tensor.I32, tensor.I64, []int{3, 1}},
	} {
		table := randTensor(rng, tc.dt, []int{5, 3}, -4, 4)
		ids := randTensor(rng, tc.idt, tc.ids, 0, 5)
		shape := append(slices.Clone(tc.ids), 3)
		want := make([]float64, tensor.Numel(shape))
		for i := range want {
			idx := unflatten(i, shape)
			row := int(ids.At(flatten(idx[:len(idx)-1], tc.ids)))
			want[i] = table.At(row*3 + idx[len(idx)-1])
		}
		got := mustRunOp(t, "embedding", nil, table, ids)
		// Rows are copied bit for bit, so the tolerance is zero.
		checkTensorTol(t, fmt.Sprintf("embedding %s by %s%v", tc.dt, tc.idt, tc.ids), got[0], tc.dt, shape, want, 0)
	}
}

func TestEmbeddingOutOfRange(t *testing.T) {
	table := tensor.New(tensor.BF16, 5, 3)
	for _, id := range []int32{5, 7, -1} {
		ids := tensor.FromI32([]int32{0, id, 1}, 3)
		_, err := runOp(t, "embedding", nil, table, ids)
		if err == nil {
			t.Fatalf("embedding with id %d: no error", id)
		}
		for _, want := range []string{fmt.Sprintf("id %d", id), "5 rows", "embedding(%x0, %x1)"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("embedding with id %d: error %q does not mention %q", id, err, want)
			}
		}
	}
}

// runSource builds and runs a graph whose one output is a source node (const or iota).
func runSource(t *testing.T, op string, attrs graph.Attrs) ([]*tensor.Tensor, error) {
	t.Helper()
	b := graph.NewBuilder("src")
	b.Output(b.Op(op, attrs))
	g, err := b.Build()
	if err != nil {
		t.Fatalf("build %s: %v", op, err)
	}
	p, err := Compile(context.Background(), g, nil)
	if err != nil {
		return nil, err
	}
	return p.Run(context.Background(), nil)
}

func TestConst(t *testing.T) {
	for _, tc := range []struct {
		dt    tensor.DType
		shape []int
		vals  []float64
		want  []float64
	}{
		{tensor.F32, []int{2, 3}, []float64{1.5}, []float64{1.5, 1.5, 1.5, 1.5, 1.5, 1.5}},
		{tensor.BF16, []int{3}, []float64{0.1, -2, 1e30}, []float64{0.10009765625, -2, 1.0000000150474662e30}},
		{tensor.F16, []int{}, []float64{-0.5}, []float64{-0.5}},
		{tensor.I32, []int{2}, []float64{3, -4.7}, []float64{3, -4}},
		{tensor.I64, []int{2, 2}, []float64{1 << 40}, []float64{1 << 40, 1 << 40, 1 << 40, 1 << 40}},
		{tensor.Bool, []int{3}, []float64{0, 1, -2}, []float64{0, 1, 1}},
		{tensor.F32, []int{0, 4}, []float64{7}, []float64{}},
		{tensor.F32, []int{1}, []float64{math.Inf(-1)}, []float64{math.Inf(-1)}},
	} {
		out, err := runSource(t, graph.OpConst, graph.Attrs{"dtype": tc.dt, "shape": constShape(tc.shape), "values": tc.vals})
		if err != nil {
			t.Fatalf("const %s%v %v: %v", tc.dt, tc.shape, tc.vals, err)
		}
		checkTensorTol(t, fmt.Sprintf("const %s%v", tc.dt, tc.shape), out[0], tc.dt, tc.shape, tc.want, 0)
	}
	for _, tc := range []struct {
		dt  tensor.DType
		val float64
	}{{tensor.I32, 1e10}, {tensor.I64, math.NaN()}, {tensor.I64, math.Inf(1)}} {
		_, err := runSource(t, graph.OpConst, graph.Attrs{"dtype": tc.dt, "shape": graph.Dims(1), "values": []float64{tc.val}})
		if err == nil || !strings.Contains(err.Error(), "does not fit") || !strings.Contains(err.Error(), "const(") {
			t.Errorf("const %s %v: error %v, want one saying it does not fit and naming the node", tc.dt, tc.val, err)
		}
	}
}

func TestIota(t *testing.T) {
	for _, tc := range []struct {
		dt    tensor.DType
		shape []int
		axis  int
	}{
		{tensor.I32, []int{2, 3}, 0},
		{tensor.I64, []int{2, 3}, 1},
		{tensor.F32, []int{2, 3, 4}, -2},
		{tensor.BF16, []int{300}, 0},
		{tensor.F16, []int{3}, -1},
	} {
		want := make([]float64, tensor.Numel(tc.shape))
		ax := tc.axis
		if ax < 0 {
			ax += len(tc.shape)
		}
		for i := range want {
			want[i] = float64(unflatten(i, tc.shape)[ax])
		}
		out, err := runSource(t, "iota", graph.Attrs{"dtype": tc.dt, "shape": constShape(tc.shape), "axis": tc.axis})
		if err != nil {
			t.Fatal(err)
		}
		checkTensor(t, fmt.Sprintf("iota %s%v axis %d", tc.dt, tc.shape, tc.axis), out[0], tc.dt, tc.shape, want)
	}
}

// TestIotaSymbolic resolves an iota's symbolic shape from a graph input.
func TestIotaSymbolic(t *testing.T) {
	b := graph.NewBuilder("pos")
	x := b.Input("x", tensor.F32, graph.Shape{graph.Sym("B"), graph.Sym("S")})
	pos := b.Iota(tensor.I64, graph.Shape{graph.Sym("B"), graph.Sym("S")}, 1)
	b.Output(pos, x)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	p, err := Compile(context.Background(), g, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, shape := range [][]int{{2, 3}, {1, 5}} {
		out, err := p.Run(context.Background(), map[string]*tensor.Tensor{"x": tensor.New(tensor.F32, shape...)})
		if err != nil {
			t.Fatal(err)
		}
		want := make([]float64, tensor.Numel(shape))
		for i := range want {
			want[i] = float64(i % shape[1])
		}
		checkTensor(t, fmt.Sprintf("iota [B,S] = %v", shape), out[0], tensor.I64, shape, want)
	}
}
