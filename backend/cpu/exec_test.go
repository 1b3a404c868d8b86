package cpu

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Test-only ops, registered in the graph catalog of this test binary: one with no CPU kernel
// at all, and one whose kernel (installed with Register) calls testHook.
const (
	opNoKernel = "cputest_nokernel"
	opHook     = "cputest_hook"
)

var testHook func()

func init() {
	identity := func(n *graph.Node) ([]graph.Type, error) { return []graph.Type{n.Inputs[0].Type}, nil }
	graph.Register(&graph.OpSpec{Name: opNoKernel, Doc: "Test op without a CPU kernel.", Inputs: []string{"x"}, Infer: identity})
	graph.Register(&graph.OpSpec{Name: opHook, Doc: "Test op: identity that calls a hook.", Inputs: []string{"x"}, Infer: identity})
	Register(opHook, func(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
		if testHook != nil {
			testHook()
		}
		return []*tensor.Tensor{in[0].Clone()}, nil
	})
}

func isTestOp(op string) bool { return strings.HasPrefix(op, "cputest_") }

// TestCoverage holds every catalog op except param to a reference kernel, and every
// reference kernel to a catalog op.
func TestCoverage(t *testing.T) {
	for _, spec := range graph.Ops() {
		if spec.Name == graph.OpParam || isTestOp(spec.Name) {
			continue
		}
		if _, ok := Reference(spec.Name); !ok {
			t.Errorf("op %s has no reference kernel", spec.Name)
		}
		if _, ok := Lookup(spec.Name); !ok {
			t.Errorf("op %s has no kernel", spec.Name)
		}
	}
	for _, op := range ReferenceOps() {
		if _, ok := graph.Lookup(op); !ok {
			t.Errorf("reference kernel for %s, which is not in the op catalog", op)
		}
	}
	if _, ok := Reference(graph.OpParam); ok {
		t.Errorf("param has a kernel; params are loaded, not run")
	}
}

func mustBuild(t *testing.T, b *graph.Builder) *graph.Graph {
	t.Helper()
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func mustCompile(t *testing.T, g *graph.Graph, w MapWeights) *Program {
	t.Helper()
	p, err := Compile(context.Background(), g, w)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func negGraph(t *testing.T) *graph.Graph {
	b := graph.NewBuilder("neg")
	b.Output(b.Neg(b.Input("x", tensor.F32, graph.Shape{graph.Sym("N")})))
	return mustBuild(t, b)
}

func TestRegisterOverride(t *testing.T) {
	g := negGraph(t)
	before := mustCompile(t, g, nil)
	fake := func(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
		return nil, errors.New("fake kernel")
	}
	Register("neg", fake)
	t.Cleanup(func() { Register("neg", nil) })

	if _, ok := Reference("neg"); !ok {
		t.Fatal("Reference(neg) lost after Register")
	}
	x := map[string]*tensor.Tensor{"x": tensor.FromF32([]float32{1, 2}, 2)}
	_, err := mustCompile(t, g, nil).Run(context.Background(), x)
	if err == nil || !strings.Contains(err.Error(), "fake kernel") || !strings.Contains(err.Error(), "neg(%x)") {
		t.Errorf("run with the registered kernel: error %v, want the fake kernel's, naming the node", err)
	}
	// A program compiled earlier keeps its kernels.
	out, err := before.Run(context.Background(), x)
	if err != nil || out[0].F32[1] != -2 {
		t.Errorf("program compiled before Register: %v, %v", out, err)
	}
	// Removing the override brings the reference back.
	Register("neg", nil)
	out, err = mustCompile(t, g, nil).Run(context.Background(), x)
	if err != nil || out[0].F32[0] != -1 {
		t.Errorf("after Register(neg, nil): %v, %v", out, err)
	}
}

// TestKernelContract catches a kernel that returns the wrong shape or dtype.
func TestKernelContract(t *testing.T) {
	g := negGraph(t)
	x := map[string]*tensor.Tensor{"x": tensor.FromF32([]float32{1, 2}, 2)}
	for name, k := range map[string]Kernel{
		"shape": func(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
			return []*tensor.Tensor{tensor.New(tensor.F32, 3)}, nil
		},
		"dtype": func(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
			return []*tensor.Tensor{tensor.New(tensor.BF16, 2)}, nil
		},
		"count": func(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
			return nil, nil
		},
		"storage": func(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
			return []*tensor.Tensor{{DType: tensor.F32, Shape: []int{2}}}, nil
		},
	} {
		Register("neg", k)
		_, err := mustCompile(t, g, nil).Run(context.Background(), x)
		Register("neg", nil)
		if err == nil || !strings.Contains(err.Error(), "neg(%x)") {
			t.Errorf("kernel with a bad %s: error %v, want one naming the node", name, err)
		}
	}
}

// symGraph: ids i32[B,S], x f32[B,S,4], table param f32[10,4] ->
// y = mean(embedding(table, ids) * x, axis -1) : f32[B,S]; z = reshape(x, [B,S,2,2]).
func symGraph(t *testing.T) *graph.Graph {
	b := graph.NewBuilder("sym")
	B, S := graph.Sym("B"), graph.Sym("S")
	ids := b.Input("ids", tensor.I32, graph.Shape{B, S})
	x := b.Input("x", tensor.F32, graph.Shape{B, S, graph.D(4)})
	table := b.Param("table", tensor.BF16, graph.Dims(10, 4))
	y := b.Reduce("mean", b.Mul(b.Embedding(table, ids), x), false, -1)
	z := b.Reshape(x, B, S, graph.D(2), graph.D(2))
	b.Output(y, z)
	return mustBuild(t, b)
}

func symWeights() MapWeights {
	vals := make([]float64, 40)
	for i := range vals {
		vals[i] = float64(i%7) - 3
	}
	return MapWeights{"table": fromValues(tensor.BF16, []int{10, 4}, vals)}
}

func TestSymbolBinding(t *testing.T) {
	w := symWeights()
	p := mustCompile(t, symGraph(t), w)
	for _, bs := range [][2]int{{2, 3}, {1, 5}, {3, 1}} {
		B, S := bs[0], bs[1]
		ids := make([]int32, B*S)
		for i := range ids {
			ids[i] = int32((i * 3) % 10)
		}
		xv := make([]float32, B*S*4)
		for i := range xv {
			xv[i] = float32(i%5) - 1.5
		}
		out, err := p.Run(context.Background(), map[string]*tensor.Tensor{
			"ids": tensor.FromI32(ids, B, S), "x": tensor.FromF32(xv, B, S, 4),
		})
		if err != nil {
			t.Fatalf("B=%d S=%d: %v", B, S, err)
		}
		want := make([]float64, B*S)
		for i := range want {
			for d := range 4 {
				want[i] += w["table"].At(int(ids[i])*4+d) * float64(xv[i*4+d]) / 4
			}
		}
		checkTensor(t, fmt.Sprintf("y B=%d S=%d", B, S), out[0], tensor.F32, []int{B, S}, want)
		checkTensor(t, fmt.Sprintf("z B=%d S=%d", B, S), out[1], tensor.F32, []int{B, S, 2, 2}, values(tensor.FromF32(xv, len(xv))))
	}
}

func TestInputErrors(t *testing.T) {
	p := mustCompile(t, symGraph(t), symWeights())
	ids := tensor.New(tensor.I32, 2, 3)
	x := tensor.New(tensor.F32, 2, 3, 4)
	for _, tc := range []struct {
		name   string
		inputs map[string]*tensor.Tensor
		want   []string
	}{
		{"missing", map[string]*tensor.Tensor{"ids": ids}, []string{`missing input "x"`}},
		{"unknown", map[string]*tensor.Tensor{"ids": ids, "x": x, "y": x}, []string{`unknown input "y"`}},
		{"dtype", map[string]*tensor.Tensor{"ids": ids.Cast(tensor.I64), "x": x}, []string{`"ids"`, "i64", "i32"}},
		{"rank", map[string]*tensor.Tensor{"ids": ids, "x": tensor.New(tensor.F32, 2, 3)}, []string{`"x"`, "rank 2"}},
		{"constant dim", map[string]*tensor.Tensor{"ids": ids, "x": tensor.New(tensor.F32, 2, 3, 5)}, []string{`"x"`, "[2 3 5]", "[B,S,4]"}},
		{"conflict", map[string]*tensor.Tensor{"ids": ids, "x": tensor.New(tensor.F32, 2, 4, 4)},
			[]string{"symbol S", `"ids"`, `"x"`, "3", "4"}},
		{"nil", map[string]*tensor.Tensor{"ids": ids, "x": nil}, []string{`"x"`, "nil"}},
		{"storage", map[string]*tensor.Tensor{"ids": ids, "x": {DType: tensor.F32, Shape: []int{2, 3, 4}, F32: make([]float32, 5)}},
			[]string{`"x"`, "holds 5 elements"}},
	} {
		_, err := p.Run(context.Background(), tc.inputs)
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %s", tc.name, err, w)
			}
		}
	}
}

func TestContextCancel(t *testing.T) {
	// Cancelled before the run starts.
	p := mustCompile(t, negGraph(t), nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Run(ctx, map[string]*tensor.Tensor{"x": tensor.New(tensor.F32, 2)}); !errors.Is(err, context.Canceled) {
		t.Errorf("run with a cancelled context: %v", err)
	}

	// Cancelled by a kernel midway: the next node does not run.
	b := graph.NewBuilder("cancel")
	h := b.Op(opHook, nil, b.Input("x", tensor.F32, graph.Dims(2)))
	b.Output(b.Unary("exp", b.Neg(h)))
	p = mustCompile(t, mustBuild(t, b), nil)
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	testHook = cancel
	defer func() { testHook = nil }()
	_, err := p.Run(ctx, map[string]*tensor.Tensor{"x": tensor.New(tensor.F32, 2)})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "before %1 = neg(%0)") {
		t.Errorf("run cancelled by the first node: error %v, want context.Canceled before the neg node", err)
	}

	// Cancelled before the weights are read.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := Compile(ctx, symGraph(t), symWeights()); !errors.Is(err, context.Canceled) {
		t.Errorf("compile with a cancelled context: %v", err)
	}
}

func TestMissingKernel(t *testing.T) {
	b := graph.NewBuilder("nokernel")
	b.Output(b.Op(opNoKernel, nil, b.Neg(b.Input("x", tensor.F32, graph.Dims(2)))))
	_, err := Compile(context.Background(), mustBuild(t, b), nil)
	if err == nil || !strings.Contains(err.Error(), `"cputest_nokernel"`) || !strings.Contains(err.Error(), "%1 = cputest_nokernel(%0) : f32[2]") {
		t.Errorf("compile with an op without a kernel: error %v, want one naming the op and the node", err)
	}
}

func TestUnboundSymbol(t *testing.T) {
	b := graph.NewBuilder("unbound")
	x := b.Input("x", tensor.F32, graph.Shape{graph.Sym("S")})
	b.Output(x, b.Iota(tensor.I32, graph.Shape{graph.Sym("T")}, 0))
	_, err := Compile(context.Background(), mustBuild(t, b), nil)
	if err == nil || !strings.Contains(err.Error(), "symbol T") || !strings.Contains(err.Error(), "iota") {
		t.Errorf("compile with an unbound symbol: error %v, want one naming the symbol and the node", err)
	}
}

// badWeights returns a fixed tensor (or error) for every key.
type badWeights struct {
	t   *tensor.Tensor
	err error
}

func (b badWeights) Load(ctx context.Context, ref graph.ParamRef) (*tensor.Tensor, error) {
	return b.t, b.err
}

func TestWeightErrors(t *testing.T) {
	g := symGraph(t)
	for _, tc := range []struct {
		name string
		w    backend.Weights
		want []string
	}{
		{"missing key", MapWeights{}, []string{`"table"`, "not found"}},
		{"wrong dtype", MapWeights{"table": tensor.New(tensor.F32, 10, 4)}, []string{`"table"`, "f32[10 4]", "bf16[10 4]"}},
		{"wrong shape", MapWeights{"table": tensor.New(tensor.BF16, 4, 10)}, []string{`"table"`, "bf16[4 10]"}},
		{"nil weights", nil, []string{`"table"`, "no weights"}},
		{"load error", badWeights{err: errors.New("disk on fire")}, []string{`"table"`, "disk on fire"}},
		{"bad tensor", badWeights{t: tensor.New(tensor.BF16, 3)}, []string{`"table"`, "bf16[3]", "want bf16[10,4]"}},
		{"nil tensor", badWeights{}, []string{`"table"`, "nil tensor"}},
	} {
		_, err := Compile(context.Background(), g, tc.w)
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %s", tc.name, err, w)
			}
		}
	}
}

func TestParamSlicesAndOutputs(t *testing.T) {
	full := make([]float32, 24)
	for i := range full {
		full[i] = float32(i)
	}
	w := MapWeights{"w": tensor.FromF32(full, 4, 6)}
	b := graph.NewBuilder("slices")
	whole := b.Param("w", tensor.F32, graph.Dims(4, 6))
	rows := b.Op(graph.OpParam, graph.Attrs{"key": "w", "dtype": tensor.F32, "shape": graph.Dims(4, 6), "slice_dim": 0, "slice_index": 1, "slice_count": 2})
	cols := b.Op(graph.OpParam, graph.Attrs{"key": "w", "dtype": tensor.F32, "shape": graph.Dims(4, 6), "slice_dim": 1, "slice_index": 2, "slice_count": 3})
	b.Output(whole, rows, cols)
	p := mustCompile(t, mustBuild(t, b), w)
	out, err := p.Run(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	checkTensor(t, "whole", out[0], tensor.F32, []int{4, 6}, values(w["w"]))
	checkTensor(t, "rows 2:4", out[1], tensor.F32, []int{2, 6}, values(tensor.FromF32(full[12:], 12)))
	checkTensor(t, "cols 4:6", out[2], tensor.F32, []int{4, 2}, []float64{4, 5, 10, 11, 16, 17, 22, 23})
	// Outputs that are params are copies: changing them changes neither the program nor w.
	out[0].F32[0] = 99
	again, err := p.Run(context.Background(), nil)
	if err != nil || again[0].F32[0] != 0 || full[0] != 0 {
		t.Errorf("a param output aliases the weights: %v, %v", again, err)
	}
}

// TestFreeing checks that intermediates are released after their last use, and that values
// used twice (by two nodes, twice by one node, or also as an output) survive until then.
func TestFreeing(t *testing.T) {
	b := graph.NewBuilder("free")
	x := b.Input("x", tensor.F32, graph.Shape{graph.Sym("N")})
	a := b.Named("a", "neg", nil, x)
	e := b.Named("e", "exp", nil, a)
	c := b.Named("c", "add", nil, a, e)
	d := b.Named("d", "mul", nil, c, c)
	b.Named("dead", "sin", nil, x)
	r := b.Named("r", "add", nil, d, a)
	b.Output(r, e, r)
	g := mustBuild(t, b)
	p := mustCompile(t, g, nil)
	var mu sync.Mutex
	var freed []string
	p.onFree = func(v *graph.Value) {
		mu.Lock()
		defer mu.Unlock()
		freed = append(freed, v.Name)
	}
	xv := []float32{0, 0.5, -1}
	for range 2 {
		freed = nil
		out, err := p.Run(context.Background(), map[string]*tensor.Tensor{"x": tensor.FromF32(xv, 3)})
		if err != nil {
			t.Fatal(err)
		}
		var wantR, wantE []float64
		for _, v := range xv {
			av := -float64(v)
			ev := math.Exp(av)
			wantE = append(wantE, ev)
			wantR = append(wantR, (av+ev)*(av+ev)+av)
		}
		checkTensor(t, "r", out[0], tensor.F32, []int{3}, wantR)
		checkTensor(t, "e", out[1], tensor.F32, []int{3}, wantE)
		if out[0] != out[2] {
			t.Errorf("an output listed twice gave two tensors")
		}
		slices.Sort(freed)
		if want := []string{"a", "c", "d", "dead", "x"}; !slices.Equal(freed, want) {
			t.Errorf("freed %v, want %v", freed, want)
		}
	}
	// a is released by the last node that reads it, not earlier.
	for _, st := range p.steps {
		for _, s := range st.free {
			if p.values[s].Name == "a" && st.node.Out().Name != "r" {
				t.Errorf("a released after %s", st.node)
			}
		}
	}
}

func TestConstEvaluatedOnce(t *testing.T) {
	ref, _ := Reference(graph.OpConst)
	calls := 0
	Register(graph.OpConst, func(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
		calls++
		return ref(n, in, out)
	})
	defer Register(graph.OpConst, nil)
	b := graph.NewBuilder("const")
	x := b.Input("x", tensor.F32, graph.Dims(2))
	b.Output(b.Mul(x, b.Scalar(tensor.F32, 3)))
	p := mustCompile(t, mustBuild(t, b), nil)
	for range 3 {
		out, err := p.Run(context.Background(), map[string]*tensor.Tensor{"x": tensor.FromF32([]float32{1, 2}, 2)})
		if err != nil || out[0].F32[1] != 6 {
			t.Fatalf("run: %v, %v", out, err)
		}
	}
	if calls != 1 {
		t.Errorf("const kernel ran %d times, want once (at compile)", calls)
	}
}

func TestConcurrentRuns(t *testing.T) {
	p := mustCompile(t, symGraph(t), symWeights())
	in := map[string]*tensor.Tensor{"ids": tensor.FromI32([]int32{1, 2, 3, 4, 5, 6}, 2, 3), "x": tensor.New(tensor.F32, 2, 3, 4)}
	for i := range in["x"].F32 {
		in["x"].F32[i] = float32(i)
	}
	want, err := p.Run(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			got, err := p.Run(context.Background(), in)
			if err != nil || !slices.Equal(got[0].F32, want[0].F32) {
				t.Errorf("concurrent run: %v, %v", got, err)
			}
		})
	}
	wg.Wait()
}

func TestProgramGraph(t *testing.T) {
	g := negGraph(t)
	if p := mustCompile(t, g, nil); p.Graph() != g {
		t.Errorf("Graph() is not the compiled graph")
	}
	if _, err := Compile(context.Background(), nil, nil); err == nil {
		t.Errorf("Compile(nil graph) succeeded")
	}
	bad := graph.New("bad") // no outputs: the verifier refuses it
	if _, err := Compile(context.Background(), bad, nil); err == nil || !strings.Contains(err.Error(), "no outputs") {
		t.Errorf("Compile of an unverifiable graph: %v", err)
	}
}
