package main

import (
	"cmp"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	_ "github.com/loom-ml/loom/model/all"
	"github.com/loom-ml/loom/transform"
)

func newInspectCmd() *cobra.Command {
	var (
		dir        string
		summary    bool
		transforms transform.Flags
	)
	cmd := &cobra.Command{
		Use:   "inspect",
		Short: "Print a checkpoint's architecture, sizes and graph (--summary: counts instead of the graph)",
		Long: `Prints a checkpoint's architecture and sizes, then its plain graph in text form. With --summary
it prints counts instead of the graph: the parameters and their bytes by dtype, the layers, the
ops of the plain graph by kind, and those of the optimized graph after the transform pipeline
(configured by --config and --set, its summary lines on stderr) with the transforms that
changed it. No weight is read.`,
		Example: "  loom inspect --model testdata/tiny-qwen3 --summary\n  loom inspect --model testdata/tiny-qwen3 > graph.txt",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := resolveModels(&dir); err != nil {
				return err
			}
			m, err := model.Open(dir)
			if err != nil {
				return err
			}
			defer m.Close()
			g, err := model.BuildGraph(m.Config, model.BuildOptions{Tensors: m.Checkpoint})
			if err != nil {
				return err
			}
			c := m.Config
			st := checkpointStats(m.Checkpoint)
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "architecture: %s (model_type %s)\n", c.Architectures[0], c.ModelType)
			fmt.Fprintf(out, "layers: %d  hidden: %d  intermediate: %d  heads: %d  kv_heads: %d  head_dim: %d  vocab: %d\n",
				c.NumHiddenLayers, c.HiddenSize, c.IntermediateSize, c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim, c.VocabSize)
			fmt.Fprintf(out, "rope: type %s theta %g  tie_word_embeddings: %v  sliding_window: %d\n", ropeType(c.Rope.Type), c.Rope.Theta, c.TieWordEmbeddings, c.SlidingWindow)
			fmt.Fprintf(out, "parameters: %d (%d tensors, %.2f MB)\n", st.params, st.tensors, float64(st.bytes)/1e6)
			if !summary {
				fmt.Fprintf(out, "graph: %d nodes, %d params\n\n", len(g.Nodes), len(g.Params()))
				_, err = fmt.Fprint(out, g.String())
				return err
			}
			opt, results, err := engine.Optimize(cmd.Context(), &transforms, m, g.Clone())
			if err != nil {
				return err
			}
			return writeSummary(out, st, g, opt, results)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "model", "", modelUsage)
	f.BoolVar(&summary, "summary", false, "print counts (params and bytes, layers, ops by kind, the transforms applied) instead of the whole graph")
	addTransformFlags(cmd, &transforms)
	_ = cmd.MarkFlagRequired("model")
	return cmd
}

// ckptStats are a checkpoint's sizes.
type ckptStats struct {
	params, bytes int64
	tensors       int
	byDType       map[string][2]int64 // dtype: params, bytes
}

func checkpointStats(ck *model.Checkpoint) ckptStats {
	st := ckptStats{byDType: map[string][2]int64{}}
	for _, name := range ck.Names() {
		info, _ := ck.Info(name)
		n := int64(1)
		for _, d := range info.Shape {
			n *= int64(d)
		}
		b := n * int64(info.DType.Size())
		st.params += n
		st.bytes += b
		st.tensors++
		d := st.byDType[info.DType.String()]
		st.byDType[info.DType.String()] = [2]int64{d[0] + n, d[1] + b}
	}
	return st
}

// layerScope finds the layer index in a node's scope, such as model.layers.12.mlp.
var layerScope = regexp.MustCompile(`(?:^|\.)layers\.(\d+)(?:\.|$)`)

// graphLayers counts the distinct layers the nodes of g come from.
func graphLayers(g *graph.Graph) int {
	seen := map[string]bool{}
	for _, n := range g.Nodes {
		if m := layerScope.FindStringSubmatch(n.Scope); m != nil {
			seen[m[1]] = true
		}
	}
	return len(seen)
}

// opCounts lists the ops of g by kind, most first (then by name).
func opCounts(g *graph.Graph) string {
	counts := map[string]int{}
	for _, n := range g.Nodes {
		counts[n.Op]++
	}
	ops := make([]string, 0, len(counts))
	for op := range counts {
		ops = append(ops, op)
	}
	slices.SortFunc(ops, func(a, b string) int {
		return cmp.Or(cmp.Compare(counts[b], counts[a]), cmp.Compare(a, b))
	})
	parts := make([]string, len(ops))
	for i, op := range ops {
		parts[i] = fmt.Sprintf("%s %d", op, counts[op])
	}
	return strings.Join(parts, ", ")
}

// writeSummary prints the counts of inspect --summary.
func writeSummary(w io.Writer, st ckptStats, plain, opt *graph.Graph, results []transform.Result) error {
	dtypes := make([]string, 0, len(st.byDType))
	for d := range st.byDType {
		dtypes = append(dtypes, d)
	}
	slices.Sort(dtypes)
	for _, d := range dtypes {
		fmt.Fprintf(w, "  %s: %d params, %d bytes\n", d, st.byDType[d][0], st.byDType[d][1])
	}
	fmt.Fprintf(w, "graph layers: %d\n", graphLayers(plain))
	fmt.Fprintf(w, "plain graph: %d nodes (%d params)\n  ops: %s\n", len(plain.Nodes), len(plain.Params()), opCounts(plain))
	fmt.Fprintf(w, "optimized graph: %d nodes (%d params)\n  ops: %s\n", len(opt.Nodes), len(opt.Params()), opCounts(opt))
	var applied, unchanged, off []string
	for _, r := range results {
		switch {
		case r.Disabled:
			off = append(off, r.Name)
		case r.Info.Skipped || r.Info.Matches == 0:
			unchanged = append(unchanged, r.Name)
		default:
			applied = append(applied, fmt.Sprintf("%s (%d)", r.Name, r.Info.Matches))
		}
	}
	fmt.Fprintf(w, "transforms applied (matches): %s\n", orNone(applied))
	fmt.Fprintf(w, "transforms that matched nothing or were skipped: %s\n", orNone(unchanged))
	_, err := fmt.Fprintf(w, "transforms disabled: %s\n", orNone(off))
	return err
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func ropeType(t string) string {
	if t == "" {
		return "default"
	}
	return t
}
