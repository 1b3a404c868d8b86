package cpu

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// viewWeights is intoWeights that can also view a concatenation of params (as
// model.Checkpoint.Mapped does where the parts lie one after the other in the file): view says
// what ViewConcat answers.
type viewWeights struct {
	intoWeights
	view  func(refs []graph.ParamRef) (*tensor.Tensor, bool, error)
	views int
}

func (w *viewWeights) ViewConcat(ctx context.Context, refs []graph.ParamRef) (*tensor.Tensor, bool, error) {
	w.views++
	return w.view(refs)
}

// TestConcatOfParamsViewed: weights that view the concatenation of a concat's params give the
// program its fused weight as that very tensor, no part read; weights that cannot view it leave
// the parts to LoadInto; an error or a view of the wrong shape fails the compile, naming the
// concat node.
func TestConcatOfParamsViewed(t *testing.T) {
	rng := rand.New(rand.NewPCG(115, 116))
	m := MapWeights{
		"wq": randTensor(rng, tensor.BF16, []int{3, 4}, -1, 1),
		"wk": randTensor(rng, tensor.BF16, []int{2, 4}, -1, 1),
	}
	joined := tensor.New(tensor.BF16, 5, 4)
	copy(joined.Half, slices.Concat(m["wq"].Half, m["wk"].Half))
	for _, tc := range []struct {
		name    string
		view    func(refs []graph.ParamRef) (*tensor.Tensor, bool, error)
		viewed  bool
		intos   int
		wantErr string
	}{
		{"viewed", func(refs []graph.ParamRef) (*tensor.Tensor, bool, error) {
			if len(refs) != 2 || refs[0].Key != "wq" || refs[1].Key != "wk" {
				return nil, false, errors.New("asked for the wrong params")
			}
			return joined, true, nil
		}, true, 0, ""},
		{"not adjacent", func([]graph.ParamRef) (*tensor.Tensor, bool, error) { return nil, false, nil }, false, 2, ""},
		{"error", func([]graph.ParamRef) (*tensor.Tensor, bool, error) { return nil, false, errors.New("file cut short") }, false, 0, "file cut short"},
		{"wrong shape", func([]graph.ParamRef) (*tensor.Tensor, bool, error) { return tensor.New(tensor.BF16, 4, 5), true, nil }, false, 0, "bf16[4 5]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &viewWeights{intoWeights: intoWeights{MapWeights: m}, view: tc.view}
			p, err := Compile(context.Background(), fusedQKVGraph(t, false), w)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "wqk") {
					t.Fatalf("compile: %v, want an error naming the concat wqk and %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if w.views != 1 || w.loads != 0 || w.intos != tc.intos {
				t.Errorf("ViewConcat called %d times, Load %d, LoadInto %d; want 1, 0, %d", w.views, w.loads, w.intos, tc.intos)
			}
			var held []*tensor.Tensor
			for _, f := range p.fixed {
				if f != nil {
					held = append(held, f)
				}
			}
			if len(held) != 1 || !slices.Equal(held[0].Half, joined.Half) {
				t.Fatalf("program holds %d tensors, want the one concatenation", len(held))
			}
			if viewed := held[0] == joined; viewed != tc.viewed {
				t.Errorf("the program holds the weights' view: %v, want %v", viewed, tc.viewed)
			}
			if p.params != 2 || p.folded != 1 || p.paramBytes != 5*4*2 {
				t.Errorf("params %d, folded %d, param bytes %d; want 2, 1, 40", p.params, p.folded, p.paramBytes)
			}
		})
	}
}
