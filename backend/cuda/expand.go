package cuda

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/loom-ml/loom/graph"
)

// Fused ops without a CUDA kernel. The graph catalog declares a decomposition into
// primitives for every fused op; Compile replaces each node whose op has no kernel in
// opKernels by that decomposition (graph.Expand, recursively: a decomposition may hold fused
// ops of its own), so that a new fused op runs on the GPU, through the primitive kernels
// (primitive.go), before it has a kernel of its own. It logs once per op and process that
// the op runs decomposed. A node whose op has neither a kernel nor a decomposition, or
// whose decomposition needs an op without a kernel, is a compile error naming it; there is
// no CPU fallback.

// decomposeOps names ops that Compile runs as their decompositions although they have a
// kernel; tests set it to run the decompositions of the fused ops on the GPU.
var decomposeOps map[string]bool

// hasKernel reports whether Compile lowers op to a kernel of its own.
func hasKernel(op string) bool {
	_, ok := opKernels[op]
	return ok && !decomposeOps[op]
}

// decomposedLogged holds the ops logged as running decomposed.
var decomposedLogged sync.Map

// logDecomposed logs, the first time for op in this process, that op runs as its
// decomposition; it reports whether it logged.
func logDecomposed(op string, graphName string) bool {
	if _, seen := decomposedLogged.LoadOrStore(op, true); seen {
		return false
	}
	slog.Info("cuda: op has no CUDA kernel; it runs as its decomposition into primitives", "op", op, "graph", graphName)
	return true
}

// expandGraph returns g with every node whose op has no kernel (hasKernel) but a
// decomposition replaced by it, and for messages the op each new node comes from: g itself
// (and no map) when no node needs it.
func expandGraph(g *graph.Graph) (*graph.Graph, map[*graph.Node]string, error) {
	keep, refused := keepFor(g)
	x, err := graph.Expand(g, keep)
	if err != nil {
		return nil, nil, err
	}
	for _, op := range x.Expanded() {
		if !refused[op] { // logged with the reason by keepFor
			logDecomposed(op, g.Name)
		}
	}
	return x.Graph, x.From, nil
}

// missingKernels names every node of g whose op has no kernel: from is what expandGraph
// gave, so that a primitive of a decomposition is named with the fused op it serves.
func missingKernels(g *graph.Graph, from map[*graph.Node]string) error {
	var missing []string
	for _, n := range g.Nodes {
		if n.Op == graph.OpParam || n.Op == graph.OpConst || hasKernel(n.Op) {
			continue
		}
		why := "and no decomposition in the graph catalog"
		if op, ok := from[n]; ok {
			why = fmt.Sprintf("needed by the decomposition of %s, which has no CUDA kernel either", op)
		}
		missing = append(missing, fmt.Sprintf("no CUDA kernel for op %q (node %s) %s", n.Op, nodeText(n), why))
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s", strings.Join(missing, "; "))
	}
	return nil
}

// keepFor is hasKernel for graph g, less the ops whose kernel refuses one of g's nodes
// (opKernel.supports): every node of such an op runs as its decomposition, logged once per
// op and graph with the reason.
func keepFor(g *graph.Graph) (keep func(op string) bool, refused map[string]bool) {
	refused = map[string]bool{}
	for _, n := range g.Nodes {
		k, ok := opKernels[n.Op]
		if !ok || k.supports == nil || refused[n.Op] || !hasKernel(n.Op) {
			continue
		}
		if err := k.supports(n); err != nil {
			refused[n.Op] = true
			slog.Info("cuda: the op's kernel does not take a node of this graph; its nodes run as the decomposition", "op", n.Op, "graph", g.Name, "node", nodeText(n), "reason", err)
		}
	}
	if len(refused) == 0 {
		return hasKernel, refused
	}
	return func(op string) bool { return !refused[op] && hasKernel(op) }, refused
}
