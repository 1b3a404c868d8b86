package transformtest

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform"
	"golang.org/x/tools/txtar"
)

func TestDiff(t *testing.T) {
	tests := []struct{ a, b, want string }{
		{"x\ny\n", "x\ny\n", "  x\n  y\n"},
		{"x\ny\nz\n", "x\nz\n", "  x\n- y\n  z\n"},
		{"x\nz\n", "x\ny\nz\n", "  x\n+ y\n  z\n"},
		{"a\n", "b\n", "+ b\n- a\n"},
	}
	for _, tt := range tests {
		if got := Diff(tt.a, tt.b); got != tt.want {
			t.Errorf("Diff(%q, %q) =\n%s\nwant\n%s", tt.a, tt.b, got, tt.want)
		}
	}
}

func TestWriteUpdate(t *testing.T) {
	file := filepath.Join(t.TempDir(), "case.txtar")
	const input = "graph g(x: f32[4]) {\n  return %x\n}\n"
	orig := "A comment.\n-- input --\n" + input + "-- options --\ncast: false\n-- output --\nstale\n-- matches --\n9\n"
	if err := os.WriteFile(file, []byte(orig), 0o644); err != nil {
		t.Fatal(err)
	}
	// Unchanged graph: the output section goes, matches is rewritten, the rest stays.
	writeUpdate(t, file, txtar.Parse([]byte(orig)), input, input, 0)
	got, _ := os.ReadFile(file)
	want := "A comment.\n-- input --\n" + input + "-- options --\ncast: false\n-- matches --\n0\n"
	if string(got) != want {
		t.Errorf("after update:\n%s\nwant\n%s", got, want)
	}
	// Changed graph: an output section is added.
	const out = "graph g(x: f32[4]) {\n  %0 = neg(%x) : f32[4]\n  return %0\n}\n"
	writeUpdate(t, file, txtar.Parse(got), out, input, 1)
	got, _ = os.ReadFile(file)
	want = "A comment.\n-- input --\n" + input + "-- options --\ncast: false\n-- output --\n" + out + "-- matches --\n1\n"
	if string(got) != want {
		t.Errorf("after update:\n%s\nwant\n%s", got, want)
	}
}

// swapOperands is a transform that swaps the two operands of every op node in g.
func swapOperands(op string) *transform.Transform {
	return &transform.Transform{
		Name: "test_swap_" + op, Stage: transform.PostLoadFusion, Doc: "Swaps operands.",
		Run: func(_ context.Context, _ *transform.Context, g *graph.Graph, _ any) (transform.Info, error) {
			n := 0
			for _, node := range g.Nodes {
				if node.Op == op {
					node.Inputs[0], node.Inputs[1] = node.Inputs[1], node.Inputs[0]
					n++
				}
			}
			return transform.Info{Matches: n, Clean: true, ValidShapes: true}, nil
		},
	}
}

// TestNumericCatchesWrongRewrite: swapping the operands of add keeps the outputs, swapping
// those of sub does not, and the numeric check tells them apart.
func TestNumericCatchesWrongRewrite(t *testing.T) {
	const src = `graph g(x: f32[B,4], y: bf16[B,4]) {
  %w = param "w" : bf16[4]
  %c = cast(%y) {dtype=f32} : f32[B,4]
  %0 = add(%x, %c) : f32[B,4]
  %1 = sub(%0, %w) : f32[B,4]
  return %1
}
`
	for _, c := range []struct {
		op    string
		diffs bool
	}{{"add", false}, {"sub", true}} {
		in, err := graph.Parse(src)
		if err != nil {
			t.Fatal(err)
		}
		out := in.Clone()
		tr := swapOperands(c.op)
		if _, err := transform.Apply(context.Background(), nil, tr, out, nil); err != nil {
			t.Fatal(err)
		}
		summary, diffs, err := numericDiffs(tr, in, out, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(diffs) > 0; got != c.diffs {
			t.Errorf("swapped %s: differences %q (%s), want some: %v", c.op, diffs, summary, c.diffs)
		}
	}
}

func TestCompare(t *testing.T) {
	f := func(v ...float32) *tensor.Tensor { return tensor.FromF32(v, len(v)) }
	nan, negZero := float32(math.NaN()), float32(math.Copysign(0, -1))
	const u = 0x1p-24
	tol := toleranceUnits * u * 2 // the largest magnitude below is 2
	for _, c := range []struct {
		name      string
		want, got *tensor.Tensor
		exact     bool
		ok        bool
	}{
		{"equal", f(1, 2), f(1, 2), true, true},
		{"signed zeros", f(0, 2), f(negZero, 2), true, false},
		{"one rounding unit, exact", f(1, 2), f(1, 2+2*u*2), true, false},
		{"within tolerance", f(1, 2), f(1, float32(2+tol/2)), false, true},
		{"beyond tolerance", f(1, 2), f(1, float32(2+2*tol)), false, false},
		{"NaN got", f(1, 2), f(1, nan), false, false},
		{"NaN both, exact", f(1, nan), f(1, nan), true, false},
		{"NaN both", f(1, nan), f(1, nan), false, false},
		{"infinity both", f(1, float32(math.Inf(1))), f(1, float32(math.Inf(1))), false, false},
		{"shape", f(1, 2), f(1, 2, 3), false, false},
		{"dtype", f(1, 2), f(1, 2).Cast(tensor.BF16), false, false},
		{"ints", tensor.FromI32([]int32{1, 2}, 2), tensor.FromI32([]int32{1, 3}, 2), false, false},
	} {
		if msg := compare(c.want, c.got, c.exact, u); (msg == "") != c.ok {
			t.Errorf("%s: compare = %q, want ok %v", c.name, msg, c.ok)
		}
	}
}

// TestRandomInputs: integer inputs follow their names' meaning, floats are seeded.
func TestRandomInputs(t *testing.T) {
	g, err := graph.Parse(`graph g(input_ids: i32[B,S], positions: i64[B,S], slot_mapping: i32[S], token_seq: i32[S], block_tables: i32[N,M], kv_cache.0.k: bf16[NB,4,1,2], x: f32[B,S,2]) {
  %e = param "embed" : f32[7,2]
  %0 = embedding(%e, %input_ids) : f32[B,S,2]
  return %0
}
`)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]int{"B": 2, "S": 5, "N": 1, "M": 2, "NB": 3}
	in, err := randomInputs(env, "", g)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range in["input_ids"].Int64s() {
		if id < 0 || id >= 7 {
			t.Errorf("input id %d outside the vocabulary of 7", id)
		}
	}
	check := func(name string, want []int64) {
		t.Helper()
		if got := in[name].Int64s(); !slices.Equal(got, want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("positions", []int64{0, 1, 2, 3, 4, 1, 2, 3, 4, 5})
	check("slot_mapping", []int64{4, 5, 6, 7, 8}) // blocks of 4: block 1, then block 2
	check("token_seq", []int64{0, 0, 0, 0, 0})
	check("block_tables", []int64{1, 2})
	again, _ := randomInputs(env, "", g)
	other, _ := randomInputs(env, "#1", g)
	if !slices.Equal(in["x"].F32, again["x"].F32) || slices.Equal(in["x"].F32, other["x"].F32) {
		t.Errorf("float inputs are not determined by name and seed")
	}
	bad, _ := graph.Parse("graph g(k: i32[4]) {\n  return %k\n}\n")
	if _, err := randomInputs(env, "", bad); err == nil || !strings.Contains(err.Error(), "no rule") {
		t.Errorf("an integer input without a rule: err = %v", err)
	}
}
