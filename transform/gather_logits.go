package transform

import (
	"context"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// LogitRowsInput is the graph input gather_logits adds: i32[N], the position in the step's
// flattened tokens of each sequence's last token, whose logits are the only ones the runtime
// samples from.
const LogitRowsInput = "logit_rows"

// GatherLogitsConfig is gather_logits' (empty) option set.
type GatherLogitsConfig struct{}

// GatherLogits computes the LM head only for the tokens whose logits are needed.
var GatherLogits = &Transform{
	Name:  "gather_logits",
	Stage: CacheInit,
	Doc: `In a graph on the paged KV cache (after insert_cached_attention; skipped otherwise),
computes the LM head only for the last token of each sequence in a step: it adds the
graph input logit_rows i32[N] and gathers those rows of the LM head's input [1,S,hidden]
along the token axis, so the logits output becomes [1,N,vocab]. During a prefill of S
tokens this saves S-N rows of the largest GEMM of the model and S-N rows of logits. It
follows the logits output back through casts and all_gathers to the linear that produces
it; matches is 1 when it found it.`,
	Config: GatherLogitsConfig{},
	After: []Dep{
		{InsertCachedAttention, "insert_cached_attention puts the graph on the flattened tokens of a step, which gather_logits needs (it skips any other graph)"},
	},
	Run: Typed(func(ctx context.Context, c *Context, g *graph.Graph, _ GatherLogitsConfig) (Info, error) {
		return gatherLogits(g)
	}),
}

func init() { Register(GatherLogits) }

func gatherLogits(g *graph.Graph) (Info, error) {
	// Only a graph on the paged KV cache runs steps whose tokens mix sequences; a graph on
	// whole sequences keeps every position's logits.
	if len(g.Outputs) == 0 || g.Input(LogitRowsInput) != nil || g.Input(SlotMappingInput) == nil {
		return Info{Skipped: true}, nil
	}
	v := g.Outputs[0]
	for v.Producer != nil && (v.Producer.Op == "cast" || v.Producer.Op == "all_gather") {
		v = v.Producer.Inputs[0]
	}
	head := v.Producer
	if head == nil || head.Op != "linear" || len(head.Inputs[0].Type.Shape) != 3 {
		return Info{Clean: true, ValidShapes: true}, nil
	}
	rows, err := g.AddInput(LogitRowsInput, graph.Type{DType: tensor.I32, Shape: graph.Shape{graph.Sym(symSequences)}})
	if err != nil {
		return Info{}, err
	}
	gather, err := g.NewNode("gather", graph.Attrs{"axis": 1}, []*graph.Value{head.Inputs[0], rows}, head.Scope)
	if err != nil {
		return Info{}, err
	}
	if err := g.InsertBefore(head, gather); err != nil {
		return Info{}, err
	}
	head.Inputs[0] = gather.Out()
	return Info{Matches: 1, Clean: true, ValidShapes: false}, nil
}
