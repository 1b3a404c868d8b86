package cpu

import (
	"context"
	"fmt"
	"reflect"
	"slices"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Fused weights kept as their parts. A fused GEMM's weight is concat(w_q, w_k, w_v) along
// axis 0 (fuse_gemms). Where the weights are views of the checkpoint's mapping
// (model.Checkpoint.Mapped) and the parts lie one after the other in the file, the
// concatenation is one view as well (viewConcat, load_into.go). Where they do not (q, k and v
// of a checkpoint written by the safetensors library: k_proj, o_proj, q_proj and v_proj sort
// in that order), a contiguous fused weight would be a second copy of the parts' bytes, read
// from the page cache into fresh memory at load. Instead the program keeps each part as its
// own view of the mapping, and the linears that read the concatenation (linear,
// linear_swiglu, linear_qkv_rope) run on the parts in place (fastLinearParts): one split of
// the N weight rows over the worker pool, as for the fused weight, each chunk running the
// same row kernels on the part that holds its rows. Each output gets the bits it gets from
// the fused weight: the kernels compute every output on its own, in groups of four rows
// starting at multiples of four, and every part holds a multiple of four rows.

// partedOps are the ops whose weight (input 1) may be a concatenation kept as its parts:
// linear itself, and the linears fused with the packed op that reads their output
// (fastLinearThen).
var partedOps = map[string]bool{"linear": true, "linear_swiglu": true, "linear_qkv_rope": true}

// ownKernel reports whether k is this package's fast kernel for op (what Lookup gives unless
// a caller registered another): only those know how to read a weight kept as parts.
func ownKernel(op string, k Kernel) bool {
	own, ok := ownKernels[op]
	return ok && k != nil && reflect.ValueOf(k).Pointer() == reflect.ValueOf(own).Pointer()
}

// ownKernels are the kernels this package registers for the partedOps (set by init).
var ownKernels = map[string]Kernel{}

// partableConcats returns, of the concats that compile reads straight from w (directs, see
// directConcats), those whose params may stay apart if w cannot view them as one tensor: w
// keeps its tensors as views of a mapping (it has ViewConcat); every part is a float matrix
// [n_i, K] with n_i a multiple of 4; the concatenation is no graph output, and every node
// that reads it is a partedOp reading it as its weight only, with this package's kernel
// (lookup); linear's kernel too, for the fused ops.
func partableConcats(g *graph.Graph, w backend.Weights, directs map[int]bool, lookup func(string) (Kernel, bool)) map[int]bool {
	if _, ok := w.(concatViewer); !ok || len(directs) == 0 {
		return nil
	}
	if k, _ := lookup("linear"); !ownKernel("linear", k) {
		return nil
	}
	users := g.Users()
	partable := map[int]bool{}
	for i := range directs {
		n := g.Nodes[i]
		if g.IsOutput(n.Out()) || !partsFit(n) {
			continue
		}
		readers := users[n.Out()]
		ok := len(readers) > 0
		for _, r := range readers {
			k, _ := lookup(r.Op)
			if !partedOps[r.Op] || !ownKernel(r.Op, k) || len(r.Inputs) < 2 || r.Inputs[1] != n.Out() || slices.Index(r.Inputs[2:], n.Out()) >= 0 || r.Inputs[0] == n.Out() {
				ok = false
				break
			}
		}
		if ok {
			partable[i] = true
		}
	}
	return partable
}

// partsFit reports whether the inputs of concat node n are float matrices [n_i, K] of one
// dtype and K, with every n_i a positive multiple of 4.
func partsFit(n *graph.Node) bool {
	var dt tensor.DType
	K := -1
	for _, in := range n.Inputs {
		shape, err := in.Type.Shape.Resolve(nil)
		if err != nil || len(shape) != 2 || shape[0] <= 0 || shape[0]%4 != 0 || !in.Type.DType.IsFloat() || in.Type.DType.Size() < 2 {
			return false
		}
		if K >= 0 && (shape[1] != K || in.Type.DType != dt) {
			return false
		}
		K, dt = shape[1], in.Type.DType
	}
	return len(n.Inputs) > 1
}

// loadParts loads each param that concat node n joins as a fixed value of its own (a view of
// w's mapping where w gives one) and records them as the parts of n's output, which gets no
// fixed value: the steps that read it read the parts instead (partedStep).
func (p *Program) loadParts(ctx context.Context, n *graph.Node, w backend.Weights, slot map[*graph.Value]int) error {
	parts := make([]int, len(n.Inputs))
	for i, in := range n.Inputs {
		t, err := backend.LoadParam(ctx, in.Producer, w)
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		s := slot[in]
		p.fixed[s] = t
		p.params++
		p.paramBytes += t.Numel() * t.DType.Size()
		parts[i] = s
	}
	if p.parts == nil {
		p.parts = map[int][]int{}
	}
	p.parts[slot[n.Out()]] = parts
	return nil
}

// partedStep rewrites st, the step of a partedOp whose weight is kept as parts, to read the
// parts' slots in place of the weight's and to run fastLinearParts.
func (p *Program) partedStep(st *step) {
	if len(st.in) < 2 {
		return
	}
	parts, ok := p.parts[st.in[1]]
	if !ok {
		return
	}
	st.in = slices.Concat(st.in[:1], parts, st.in[2:])
	st.run = partedKernel(st.node, len(parts))
}

// partedKernel is the kernel of node n (a partedOp) whose inputs come as x, the np parts of
// its weight, then its other inputs.
func partedKernel(n *graph.Node, np int) ctxKernel {
	return func(_ context.Context, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
		if len(in) < 1+np {
			return nil, fmt.Errorf("%s on a weight of %d parts: %d inputs", n.Op, np, len(in))
		}
		x, parts, rest := in[0], in[1:1+np], in[1+np:]
		if n.Op == "linear" {
			if len(rest) != 0 || len(out) != 1 {
				return nil, fmt.Errorf("linear takes 2 inputs and has 1 output, got %d and %d", 2+len(rest), len(out))
			}
			y, err := fastLinearParts(x, parts, out[0])
			if err != nil {
				return nil, err
			}
			return []*tensor.Tensor{y}, nil
		}
		next, ok := linearThenOps[n.Op]
		if !ok {
			return nil, fmt.Errorf("no kernel for %s on a weight kept as parts", n.Op)
		}
		N := 0
		for _, w := range parts {
			if len(w.Shape) == 2 {
				N += w.Shape[0]
			}
		}
		if len(x.Shape) < 1 {
			return nil, fmt.Errorf("%s needs x[...,K], got %v", n.Op, x.Shape)
		}
		shape := append(slices.Clone(x.Shape[:len(x.Shape)-1]), N)
		y, err := fastLinearParts(x, parts, Out{DType: x.DType, Shape: shape})
		if err != nil {
			return nil, fmt.Errorf("%s: linear: %w", n.Op, err)
		}
		return thenOp(n, next, y, rest, out)
	}
}

// fastLinearParts is fastLinear for a weight [N,K] given as its parts along N (parts[i]
// [n_i, K], one dtype, each n_i a multiple of 4): x[...,K] -> out[...,N] in out's dtype, the
// bits fastLinear gives for the concatenated weight.
func fastLinearParts(x *tensor.Tensor, parts []*tensor.Tensor, o Out) (*tensor.Tensor, error) {
	if err := x.Validate(); err != nil {
		return nil, fmt.Errorf("input 0: %w", err)
	}
	if len(x.Shape) < 1 || !x.DType.IsFloat() || !o.DType.IsFloat() {
		return nil, fmt.Errorf("linear needs float x of rank >= 1 and a float result, got %s%v -> %s", x.DType, x.Shape, o.DType)
	}
	K := x.Shape[len(x.Shape)-1]
	N := 0
	for i, w := range parts {
		if err := w.Validate(); err != nil {
			return nil, fmt.Errorf("weight part %d: %w", i, err)
		}
		if len(w.Shape) != 2 || w.Shape[1] != K || w.Shape[0]%4 != 0 || !w.DType.IsFloat() || w.DType != parts[0].DType {
			return nil, fmt.Errorf("weight part %d is %s%v: want [4n, %d] of the first part's float dtype", i, w.DType, w.Shape, K)
		}
		N += w.Shape[0]
	}
	if err := checkShape(append(slices.Clone(x.Shape[:len(x.Shape)-1]), N), o); err != nil {
		return nil, err
	}
	M := tensor.Numel(x.Shape[:len(x.Shape)-1])
	return linearProduct(x, o, M, N, K, func(res, xs []float32) { gemmParts(res, xs, parts, M, N, K) }), nil
}

// gemmParts is gemmRows for a weight [N,K] given as its parts along N (see fastLinearParts):
// res[m*N+j] = x[m,:]·w[j,:]. The N rows are split over the pool as gemmRows splits them; a
// chunk runs, on each part it covers, the call gemmRows' chunk makes on the whole weight,
// with the part's rows and outputs. Each part's outputs go to a buffer [M, n_i] (for one row
// of x, straight to its run of res), copied into res's columns afterwards.
func gemmParts(res, xs []float32, parts []*tensor.Tensor, M, N, K int) {
	first := make([]int, len(parts)+1)
	for i, w := range parts {
		first[i+1] = first[i] + w.Shape[0]
	}
	outs := make([][]float32, len(parts))
	var bufs []*[]float32
	for i := range parts {
		if M == 1 {
			outs[i] = res[first[i]:first[i+1]]
			continue
		}
		b := getF32(M * (first[i+1] - first[i]))
		bufs = append(bufs, b)
		outs[i] = *b
	}
	// each calls f on every part that rows [lo, hi) of the whole weight meet, with its index
	// and the rows as the part's own.
	each := func(lo, hi int, f func(i, lo, hi int)) {
		for i := range parts {
			if a, b := max(lo, first[i]), min(hi, first[i+1]); a < b {
				f(i, a-first[i], b-first[i])
			}
		}
	}
	grain := grainFor(N, M*K, 4)
	if p := bf16Rows; p != nil && parts[0].DType == tensor.BF16 {
		xb := p.round(xs, M, K) // once for every chunk, as gemmRows
		parallel(N, grain, func(lo, hi int) {
			each(lo, hi, func(i, a, b int) { p.rows(outs[i], *xb, parts[i].Half, M, first[i+1]-first[i], K, a, b) })
		})
		putU16(xb)
	} else {
		parallel(N, grain, func(lo, hi int) {
			each(lo, hi, func(i, a, b int) { gemmRange(outs[i], xs, parts[i], M, first[i+1]-first[i], K, a, b) })
		})
	}
	if M == 1 {
		return
	}
	parallel(M, grainFor(M, N, 1), func(lo, hi int) {
		for m := lo; m < hi; m++ {
			for i, o := range outs {
				n := first[i+1] - first[i]
				copy(res[m*N+first[i]:m*N+first[i+1]], o[m*n:(m+1)*n])
			}
		}
	})
	for _, b := range bufs {
		putF32(b)
	}
}
