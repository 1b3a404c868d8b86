package transform

import (
	"context"

	"github.com/loom-ml/loom/graph"
)

// CleanupDeadCode removes the nodes that no graph output depends on.
var CleanupDeadCode = &Transform{
	Name:  "cleanup_dead_code",
	Stage: PostExport,
	Doc: `Removes nodes whose outputs no graph output depends on, params included (a weight
nothing reads is never loaded). Graph inputs stay: they are the graph's signature.
Matches counts the nodes removed.`,
	After: []Dep{
		{CleanupNoop, "cleanup_dead_code sweeps what cleanup_noop leaves unused"},
		{CleanupCSE, "cleanup_dead_code sweeps what cleanup_cse leaves unused"},
	},
	Run: runDeadCode,
}

func init() { Register(CleanupDeadCode) }

func runDeadCode(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
	n := RemoveDeadCode(g)
	return Info{Matches: n, Clean: true, ValidShapes: true}, nil
}

// RemoveDeadCode deletes every node that no graph output depends on and returns how many it
// deleted. The optimizer calls it after any transform that reports its graph unclean.
func RemoveDeadCode(g *graph.Graph) int {
	live := make(map[*graph.Value]bool, len(g.Nodes))
	for _, o := range g.Outputs {
		live[o] = true
	}
	dead := map[*graph.Node]bool{}
	for i := len(g.Nodes) - 1; i >= 0; i-- {
		n := g.Nodes[i]
		used := false
		for _, o := range n.Outputs {
			used = used || live[o]
		}
		if !used {
			dead[n] = true
			continue
		}
		for _, in := range n.Inputs {
			live[in] = true
		}
	}
	if len(dead) > 0 {
		g.RemoveNodes(dead)
	}
	return len(dead)
}
