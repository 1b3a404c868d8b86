package transform

import (
	"context"

	"github.com/loom-ml/loom/graph"
)

// NoopConfig holds the options of cleanup_noop: which kinds of no-op to remove.
type NoopConfig struct {
	// Reshape removes reshapes to the shape the value already has, and makes a reshape of a
	// reshape read the first one's input.
	Reshape bool `yaml:"reshape"`
	// Transpose removes identity transposes and transpose pairs that cancel, and folds other
	// pairs into one transpose.
	Transpose bool `yaml:"transpose"`
	// Cast removes casts to the dtype the value already has.
	Cast bool `yaml:"cast"`
	// Views removes expands to the same shape, slices of a whole axis and concats of one
	// input.
	Views bool `yaml:"views"`
}

// CleanupNoop removes views and casts that change nothing.
var CleanupNoop = &Transform{
	Name:  "cleanup_noop",
	Stage: PostExport,
	Doc: `Removes ops that return their input unchanged: reshapes to the same shape, identity
transposes and transpose pairs that cancel, casts to the same dtype, expands to the same shape,
slices of a whole axis and one-input concats. A reshape of a reshape reads the inner reshape's
input, and two transposes that do not cancel fold into one. Matches counts the nodes removed
or simplified.`,
	Config: NoopConfig{Reshape: true, Transpose: true, Cast: true, Views: true},
	Run:    Typed(runNoop),
}

func init() { Register(CleanupNoop) }

func runNoop(_ context.Context, _ *Context, g *graph.Graph, cfg NoopConfig) (Info, error) {
	subst := map[*graph.Value]*graph.Value{}
	dead := map[*graph.Node]bool{}
	matches := 0
	for _, n := range g.Nodes {
		for i, in := range n.Inputs {
			if r, ok := subst[in]; ok {
				n.Inputs[i] = r
			}
		}
		if len(n.Inputs) == 0 || len(n.Outputs) != 1 {
			continue
		}
		x := n.Inputs[0]
		changed := false
		switch n.Op {
		case "reshape":
			if !cfg.Reshape {
				continue
			}
			if p := x.Producer; p != nil && p.Op == "reshape" {
				n.Inputs[0], x, changed = p.Inputs[0], p.Inputs[0], true
			}
			if x.Type.Shape.Equal(n.Attrs.Shape("shape")) {
				subst[n.Out()], dead[n], changed = x, true, true
			}
		case "transpose":
			if !cfg.Transpose {
				continue
			}
			perm := n.Attrs.Ints("perm")
			if p := x.Producer; p != nil && p.Op == "transpose" {
				inner := p.Attrs.Ints("perm")
				composed := make([]int, len(perm))
				for i, a := range perm {
					composed[i] = inner[a]
				}
				n.Inputs[0], x, perm, changed = p.Inputs[0], p.Inputs[0], composed, true
				n.Attrs["perm"] = composed
			}
			if isIdentityPerm(perm) {
				subst[n.Out()], dead[n], changed = x, true, true
			}
		case "cast":
			if cfg.Cast && x.Type.DType == n.Attrs.DType("dtype") {
				subst[n.Out()], dead[n], changed = x, true, true
			}
		case "expand":
			if cfg.Views && x.Type.Shape.Equal(n.Attrs.Shape("shape")) {
				subst[n.Out()], dead[n], changed = x, true, true
			}
		case "slice":
			if cfg.Views && isWholeSlice(n) {
				subst[n.Out()], dead[n], changed = x, true, true
			}
		case "concat":
			if cfg.Views && len(n.Inputs) == 1 {
				subst[n.Out()], dead[n], changed = x, true, true
			}
		}
		if changed {
			matches++
		}
	}
	for i, o := range g.Outputs {
		if r, ok := subst[o]; ok {
			g.Outputs[i] = r
		}
	}
	g.RemoveNodes(dead)
	// A folded reshape or transpose may leave the inner one unused: the optimizer sweeps it.
	return Info{Matches: matches, Clean: matches == 0, ValidShapes: true}, nil
}

func isIdentityPerm(perm []int) bool {
	for i, p := range perm {
		if p != i {
			return false
		}
	}
	return true
}

// isWholeSlice reports whether a slice node takes every element of its axis.
func isWholeSlice(n *graph.Node) bool {
	shape := n.Inputs[0].Type.Shape
	ax, err := graph.NormAxis(n.Attrs.Int("axis"), len(shape))
	if err != nil || shape[ax].IsSym() {
		return false
	}
	return n.Attrs.Int("start") == 0 && n.Attrs.Int("step") == 1 && n.Attrs.Int("end") == shape[ax].Size
}
