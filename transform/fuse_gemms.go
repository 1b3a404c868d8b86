package transform

import (
	"context"
	"fmt"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform/pattern"
)

// FuseGEMMs joins the linears that read one input into one.
var FuseGEMMs = &Transform{
	Name:  "fuse_gemms",
	Stage: PostLoadFusion,
	Doc: `Joins the linears that read the same input, such as the q/k/v projections of
attention or the gate/up projections of an MLP, into one linear on the weights concatenated
along their output axis, followed by a split of the result along its last axis. A linear
whose only reader adds a bias param [N] brings the bias along: the joined linear adds the
concatenated biases before the split. Only linears whose weights are params of one dtype join
(biases too must be params of one dtype); those with a bias and those without join
separately. Quantized linears (linear_fp8) join those of the same scheme, block and
activation scheme, their scales concatenated with their weights: channel scales always,
block scales when every member's output size is a whole number of blocks; those with one
scale for the whole tensor stay apart. Anything else, such as a computed weight, is left as
it is. The backend folds the concatenated params at load time. Matches counts the joined
groups.`,
	Run: runFuseGEMMs,
}

func init() { Register(FuseGEMMs) }

// gemm is one linear that may join a group.
type gemm struct {
	lin  *graph.Node
	bias *graph.Value // the bias param, or nil
	out  *graph.Value // the linear's output, or the bias add's
}

// gemmKey is what the linears of one joined group share.
type gemmKey struct {
	x     *graph.Value
	w, b  tensor.DType // b is Invalid without a bias
	quant string       // for linear_fp8: scheme, block, activation scheme and scale dtype
}

func runFuseGEMMs(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
	users := g.Users()
	groups := map[gemmKey][]gemm{}
	var order []gemmKey
	for _, n := range g.Nodes {
		gm, key, ok := joinable(g, n, users)
		if !ok {
			continue
		}
		if _, seen := groups[key]; !seen {
			order = append(order, key)
		}
		groups[key] = append(groups[key], gm)
	}
	matches := 0
	for _, key := range order {
		members := groups[key]
		if len(members) < 2 {
			continue
		}
		if err := joinGEMMs(g, key.x, members); err != nil {
			return Info{}, fmt.Errorf("join the linears of %s: %w", key.x, err)
		}
		matches++
	}
	// The joined linears (read by nothing once their bias adds are replaced) are swept.
	return Info{Matches: matches, Clean: matches == 0, ValidShapes: true}, nil
}

// joinable reports whether n is a linear that can join a group, and which.
func joinable(g *graph.Graph, n *graph.Node, users map[*graph.Value][]*graph.Node) (gemm, gemmKey, bool) {
	if !(n.Op == "linear" && len(n.Inputs) == 2 || n.Op == "linear_fp8" && len(n.Inputs) == 3) {
		return gemm{}, gemmKey{}, false
	}
	w := n.Inputs[1]
	if !isParam(w) || len(w.Type.Shape) != 2 {
		return gemm{}, gemmKey{}, false
	}
	gm := gemm{lin: n, out: n.Out()}
	key := gemmKey{x: n.Inputs[0], w: w.Type.DType}
	if n.Op == "linear_fp8" {
		quant, ok := fp8Joinable(n)
		if !ok {
			return gemm{}, gemmKey{}, false
		}
		key.quant = quant
	}
	if us := users[n.Out()]; len(us) == 1 && us[0].Op == "add" && !g.IsOutput(n.Out()) {
		add := us[0]
		other := add.Inputs[1]
		if add.Inputs[1] == n.Out() {
			other = add.Inputs[0]
		}
		if isParam(other) && shapeIs(other.Type.Shape, w.Type.Shape[0]) && add.Out().Type.Shape.Equal(n.Out().Type.Shape) {
			gm.bias, gm.out, key.b = other, add.Out(), other.Type.DType
		}
	}
	return gm, key, true
}

// fp8Joinable reports whether the quantized linear n can join others, and the key of those
// it can join: its scale is a param whose rows follow the weight's (a channel scale, or a
// block scale over a whole number of row blocks).
func fp8Joinable(n *graph.Node) (string, bool) {
	w, scale := n.Inputs[1], n.Inputs[2]
	if !isParam(scale) || w.Type.Shape[0].Size <= 0 {
		return "", false
	}
	scheme, block := n.Attrs.String("scheme"), n.Attrs.Ints("block")
	switch scheme {
	case graph.QuantChannel:
	case graph.QuantBlock:
		if len(block) != 2 || block[0] <= 0 || w.Type.Shape[0].Size%block[0] != 0 {
			return "", false
		}
	default:
		return "", false
	}
	return fmt.Sprintf("%s %v %s %s %d", scheme, block, n.Attrs.String("activation_scheme"), scale.Type.DType, len(scale.Type.Shape)), true
}

func isParam(v *graph.Value) bool {
	return v != nil && v.Producer != nil && v.Producer.Op == graph.OpParam
}

// joinGEMMs replaces the members, all reading x, with one linear and a split.
func joinGEMMs(g *graph.Graph, x *graph.Value, members []gemm) error {
	olds := make([]*graph.Value, len(members))
	weights := make([]*graph.Value, len(members))
	var biases, scales []*graph.Value
	sizes := make([]int, len(members))
	for i, m := range members {
		olds[i], weights[i] = m.out, m.lin.Inputs[1]
		sizes[i] = m.lin.Inputs[1].Type.Shape[0].Size
		if m.bias != nil {
			biases = append(biases, m.bias)
		}
		if m.lin.Op == "linear_fp8" {
			scales = append(scales, m.lin.Inputs[2])
		}
	}
	return pattern.Rewrite(g, olds, func(b *graph.Builder) ([]*graph.Value, error) {
		var y *graph.Value
		if q := members[0].lin; q.Op == "linear_fp8" {
			y = b.LinearFP8(x, b.Concat(0, weights...), b.Concat(0, scales...), q.Attrs.String("scheme"), q.Attrs.Ints("block"), q.Attrs.String("activation_scheme"))
		} else {
			y = b.Linear(x, b.Concat(0, weights...))
		}
		if len(biases) > 0 {
			y = b.Add(y, b.Concat(0, biases...))
		}
		return b.Split(y, -1, sizes...), nil
	})
}
