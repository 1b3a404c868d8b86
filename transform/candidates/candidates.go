// Package candidates finds where the next fusion should go: the chains of unfused ops that
// repeat in an optimized graph, such as elementwise chains, norms beside matrix products and
// the ops around attention.
package candidates

import (
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/loom-ml/loom/graph"
)

// Candidate is one repeated chain.
type Candidate struct {
	// Chain lists the chain's ops in graph order, with the matrix products it reads from or
	// feeds in brackets: "[linear] → add → rmsnorm → [linear]".
	Chain string
	// Ops is the number of unfused ops in one occurrence.
	Ops int
	// Count is the number of occurrences.
	Count int
	// Layers lists the decoder layers the occurrences are in (from node scopes).
	Layers []int
}

// gemm ops are fusion boundaries: a chain may be fused into their prologue or epilogue.
var gemm = map[string]bool{"linear": true, "matmul": true}

// source ops are not work: they are folded or loaded.
var source = map[string]bool{graph.OpParam: true, graph.OpConst: true, "iota": true}

var layerRE = regexp.MustCompile(`layers\.(\d+)`)

// Find groups the graph's non-GEMM compute ops into connected chains (two ops are in one
// chain when one reads the other's output), describes each chain by its ops and the GEMMs
// around it, and returns the descriptions that occur at least twice, the most work first.
func Find(g *graph.Graph) []Candidate {
	parent := map[*graph.Node]*graph.Node{}
	var find func(n *graph.Node) *graph.Node
	find = func(n *graph.Node) *graph.Node {
		if parent[n] != n {
			parent[n] = find(parent[n])
		}
		return parent[n]
	}
	work := func(n *graph.Node) bool { return n != nil && !source[n.Op] && !gemm[n.Op] }
	for _, n := range g.Nodes {
		if work(n) {
			parent[n] = n
		}
	}
	users := g.Users()
	layer := layers(g, users)
	layerOf := func(n *graph.Node) int { return layer[n] }
	for _, n := range g.Nodes {
		if !work(n) {
			continue
		}
		for _, in := range n.Inputs {
			// Chains stay inside one layer: the residual stream and the shared rotary
			// tables would otherwise join every layer into one chain.
			if p := in.Producer; work(p) && layerOf(p) == layerOf(n) {
				parent[find(p)] = find(n)
			}
		}
	}
	type group struct {
		ops    []string
		before map[string]bool // GEMMs feeding the chain
		after  map[string]bool // GEMMs the chain feeds
		layer  int
	}
	groups := map[*graph.Node]*group{}
	var order []*graph.Node
	for _, n := range g.Nodes {
		if !work(n) {
			continue
		}
		root := find(n)
		gr := groups[root]
		if gr == nil {
			gr = &group{before: map[string]bool{}, after: map[string]bool{}, layer: -1}
			groups[root] = gr
			order = append(order, root)
		}
		gr.ops = append(gr.ops, n.Op)
		gr.layer = layerOf(n)
		for _, in := range n.Inputs {
			if p := in.Producer; p != nil && gemm[p.Op] {
				gr.before[p.Op] = true
			}
		}
		for _, o := range n.Outputs {
			for _, u := range users[o] {
				if gemm[u.Op] {
					gr.after[u.Op] = true
				}
			}
		}
	}
	byChain := map[string]*Candidate{}
	var chains []string
	for _, root := range order {
		gr := groups[root]
		if len(gr.ops) < 2 && len(gr.before)+len(gr.after) == 0 {
			continue // a lone op with nothing to fuse into
		}
		chain := bracket(gr.before, " → ") + strings.Join(gr.ops, " → ") + bracket(gr.after, "")
		c := byChain[chain]
		if c == nil {
			c = &Candidate{Chain: chain, Ops: len(gr.ops)}
			byChain[chain] = c
			chains = append(chains, chain)
		}
		c.Count++
		if gr.layer >= 0 && (len(c.Layers) == 0 || c.Layers[len(c.Layers)-1] != gr.layer) {
			c.Layers = append(c.Layers, gr.layer)
		}
	}
	var out []Candidate
	for _, chain := range chains {
		if c := byChain[chain]; c.Count >= 2 {
			out = append(out, *c)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Ops*out[i].Count > out[j].Ops*out[j].Count })
	return out
}

// layers maps each node to the decoder layer its scope names, or -1 for nodes outside the
// layers and for nodes whose outputs other layers read too (CSE shares such nodes).
func layers(g *graph.Graph, users map[*graph.Value][]*graph.Node) map[*graph.Node]int {
	scoped := func(n *graph.Node) int {
		m := layerRE.FindStringSubmatch(n.Scope)
		if m == nil {
			return -1
		}
		l, _ := strconv.Atoi(m[1])
		return l
	}
	out := map[*graph.Node]int{}
	for _, n := range g.Nodes {
		l := scoped(n)
		for _, o := range n.Outputs {
			for _, u := range users[o] {
				if scoped(u) != l {
					l = -1
				}
			}
		}
		out[n] = l
	}
	return out
}

// bracket prints GEMM neighbours as "[linear]" with a separator on the chain's side.
func bracket(ops map[string]bool, sep string) string {
	if len(ops) == 0 {
		return ""
	}
	names := make([]string, 0, len(ops))
	for op := range ops {
		names = append(names, op)
	}
	sort.Strings(names)
	s := "[" + strings.Join(names, "|") + "]"
	if sep == "" {
		return " → " + s
	}
	return s + sep
}

// Write prints candidates as a table.
func Write(w io.Writer, cs []Candidate) error {
	if len(cs) == 0 {
		_, err := fmt.Fprintln(w, "no repeated unfused chains")
		return err
	}
	if _, err := fmt.Fprintf(w, "%5s  %4s  %-14s  %s\n", "count", "ops", "layers", "chain"); err != nil {
		return err
	}
	for _, c := range cs {
		ls := ranges(c.Layers)
		if _, err := fmt.Fprintf(w, "%5d  %4d  %-14s  %s\n", c.Count, c.Ops, ls, c.Chain); err != nil {
			return err
		}
	}
	return nil
}

// ranges prints sorted layer numbers compactly: 0-3,5.
func ranges(ls []int) string {
	if len(ls) == 0 {
		return "-"
	}
	var parts []string
	for i := 0; i < len(ls); {
		j := i
		for j+1 < len(ls) && ls[j+1] == ls[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", ls[i], ls[j]))
		} else {
			parts = append(parts, strconv.Itoa(ls[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
