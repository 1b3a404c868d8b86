package transform

import (
	"context"
	"slices"
	"sort"
	"strings"

	"github.com/loom-ml/loom/graph"
)

// CSEConfig holds the options of cleanup_cse.
type CSEConfig struct {
	// Commutative treats the two inputs of a commutative op as unordered, so add(a, b) and
	// add(b, a) merge.
	Commutative bool `yaml:"commutative"`
	// ExcludeOps lists ops whose nodes are never merged. Collectives never are.
	ExcludeOps []string `yaml:"exclude_ops"`
}

// CleanupCSE merges nodes that compute the same value.
var CleanupCSE = &Transform{
	Name:  "cleanup_cse",
	Stage: PostExport,
	Doc: `Merges nodes that compute the same thing: the same op with the same attributes on
the same inputs (constants and params included). Uses of a later duplicate move to the first
one, which keeps its scope. Collective ops are never merged. Matches counts the nodes removed.`,
	Config: CSEConfig{Commutative: true, ExcludeOps: []string{}},
	After: []Dep{
		{CleanupNoop, "cleanup_noop removes the no-op views (reshapes to the same shape, casts to the same dtype) that hide duplicates from cleanup_cse"},
	},
	Run: Typed(runCSE),
}

func init() { Register(CleanupCSE) }

func runCSE(_ context.Context, _ *Context, g *graph.Graph, cfg CSEConfig) (Info, error) {
	seen := map[string]*graph.Node{}
	subst := map[*graph.Value]*graph.Value{}
	dead := map[*graph.Node]bool{}
	for _, n := range g.Nodes {
		for i, in := range n.Inputs {
			if r, ok := subst[in]; ok {
				n.Inputs[i] = r
			}
		}
		spec := n.Spec()
		if spec == nil || spec.Collective || slices.Contains(cfg.ExcludeOps, n.Op) {
			continue
		}
		key := cseKey(n, cfg.Commutative && spec.Commutative)
		first, ok := seen[key]
		if !ok {
			seen[key] = n
			continue
		}
		for i, o := range n.Outputs {
			subst[o] = first.Outputs[i]
		}
		dead[n] = true
	}
	for i, o := range g.Outputs {
		if r, ok := subst[o]; ok {
			g.Outputs[i] = r
		}
	}
	g.RemoveNodes(dead)
	return Info{Matches: len(dead), Clean: true, ValidShapes: true}, nil
}

// cseKey identifies what a node computes: op, attributes, input values and output types.
func cseKey(n *graph.Node, unordered bool) string {
	var sb strings.Builder
	sb.WriteString(n.Op)
	sb.WriteByte('(')
	ins := make([]string, len(n.Inputs))
	for i, in := range n.Inputs {
		ins[i] = in.Name
	}
	if unordered && len(ins) == 2 && ins[1] < ins[0] {
		ins[0], ins[1] = ins[1], ins[0]
	}
	sb.WriteString(strings.Join(ins, ","))
	sb.WriteString("){")
	names := make([]string, 0, len(n.Attrs))
	for k := range n.Attrs {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		sb.WriteString(k)
		sb.WriteByte('=')
		sb.WriteString(graph.FormatAttr(n.Attrs[k]))
		sb.WriteByte(';')
	}
	sb.WriteString("}:")
	for _, o := range n.Outputs {
		sb.WriteString(o.Type.String())
		sb.WriteByte(';')
	}
	return sb.String()
}
