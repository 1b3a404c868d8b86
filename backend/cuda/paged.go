package cuda

import (
	"fmt"
	"slices"
	"strings"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// The paged KV cache ops: paged_attention (see its doc in graph/catalog_cache.go) and the
// gather that gather_logits adds. Kernels are in kernels/paged.cu.

func init() {
	opKernels["paged_attention"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return d.pagedAttention(out[0], in, float32(n.Attrs.Float("scale")), n.Attrs.Int("window"))
	}}
	opKernels["gather"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		ax, err := graph.NormAxis(n.Attrs.Int("axis"), len(in[0].Shape))
		if err != nil {
			return err
		}
		return d.gather(out[0], in[0], in[1], ax)
	}}
}

// PagedAttention runs graph op paged_attention: in holds q[1,H,S,D], k, v[1,KV,S,D],
// positions[1,S], k_cache, v_cache[NB,BS,KV,D], slot_mapping[S], token_seq[S] and
// block_tables[N,M]. It writes this step's k and v into the caches (in place) and then
// attends into out[1,H,S,D]. Indices outside the cache or the tables are skipped, not
// reported: a token whose positions cannot be read gives NaN.
func (d *Device) PagedAttention(out *Tensor, in []*Tensor, scale float32, window int) error {
	return d.do(func() error { return d.pagedAttention(out, in, scale, window) })
}

func is64(t *Tensor) int32 {
	if t.DType == tensor.I64 {
		return 1
	}
	return 0
}

func (d *Device) pagedAttention(out *Tensor, in []*Tensor, scale float32, window int) error {
	if len(in) != 9 {
		return fmt.Errorf("cuda: paged_attention: want 9 inputs, got %d", len(in))
	}
	q, k, v, pos, kc, vc, slots, seqs, tables := in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8]
	if err := checkLive(append([]*Tensor{out}, in...)...); err != nil {
		return fmt.Errorf("cuda: paged_attention: %w", err)
	}
	xn, err := floatName("q", q.DType)
	if err != nil {
		return fmt.Errorf("cuda: paged_attention: %w", err)
	}
	if k.DType != q.DType || v.DType != q.DType {
		return fmt.Errorf("cuda: paged_attention: q, k and v must share a dtype, got %s, %s, %s", q.DType, k.DType, v.DType)
	}
	cn, err := floatName("k_cache", kc.DType)
	if err != nil {
		return fmt.Errorf("cuda: paged_attention: %w", err)
	}
	if vc.DType != kc.DType {
		return fmt.Errorf("cuda: paged_attention: caches must share a dtype, got %s and %s", kc.DType, vc.DType)
	}
	for i, t := range []*Tensor{pos, slots, seqs, tables} {
		if _, err := intName([]string{"positions", "slot_mapping", "token_seq", "block_tables"}[i], t.DType); err != nil {
			return fmt.Errorf("cuda: paged_attention: %w", err)
		}
	}
	if len(q.Shape) != 4 || len(k.Shape) != 4 || !slices.Equal(k.Shape, v.Shape) || q.Shape[0] != 1 {
		return fmt.Errorf("cuda: paged_attention: want q [1,H,S,D] and k, v [1,KV,S,D], got %v, %v, %v", q.Shape, k.Shape, v.Shape)
	}
	H, S, D, KV := q.Shape[1], q.Shape[2], q.Shape[3], k.Shape[1]
	if KV == 0 || H%KV != 0 {
		return fmt.Errorf("cuda: paged_attention: query heads %d are not a multiple of KV heads %d", H, KV)
	}
	if k.Shape[0] != 1 || k.Shape[2] != S || k.Shape[3] != D {
		return fmt.Errorf("cuda: paged_attention: q %v and k %v disagree on batch, tokens or head size", q.Shape, k.Shape)
	}
	if !slices.Equal(pos.Shape, []int{1, S}) || !slices.Equal(slots.Shape, []int{S}) || !slices.Equal(seqs.Shape, []int{S}) {
		return fmt.Errorf("cuda: paged_attention: positions %v, slot_mapping %v, token_seq %v do not match %d tokens", pos.Shape, slots.Shape, seqs.Shape, S)
	}
	if len(kc.Shape) != 4 || !slices.Equal(kc.Shape, vc.Shape) || kc.Shape[2] != KV || kc.Shape[3] != D || kc.Shape[1] < 1 {
		return fmt.Errorf("cuda: paged_attention: caches must be [NB,BS,%d,%d], got %v and %v", KV, D, kc.Shape, vc.Shape)
	}
	if len(tables.Shape) != 2 {
		return fmt.Errorf("cuda: paged_attention: block_tables must be [N,M], got %v", tables.Shape)
	}
	if D > attMaxD {
		return fmt.Errorf("cuda: paged_attention: head size %d is above the kernel's limit %d", D, attMaxD)
	}
	if err := checkOut("output", out, q.DType, q.Shape); err != nil {
		return fmt.Errorf("cuda: paged_attention: %w", err)
	}
	if S == 0 {
		return nil
	}
	NB, BS, N, M := kc.Shape[0], kc.Shape[1], tables.Shape[0], tables.Shape[1]
	dl := (D + 31) / 32
	if dl > 4 {
		dl = 8
	}
	inst := fmt.Sprintf("PAGED(%s, %s, %s, %s, %d)", strings.ToUpper(xn), xn, strings.ToUpper(cn), cn, dl)
	err = d.launchX("paged.cu", inst, "paged_write_"+xn+"_"+cn, cubind.Dim3{X: S, Y: 1, Z: 1}, rowBlock(KV*D), 0, func(a *cubind.Args) {
		a.Ptr(kc.ptr).Ptr(vc.ptr).Ptr(k.ptr).Ptr(v.ptr).Ptr(slots.ptr).I32(is64(slots)).I32(int32(KV)).I32(int32(S)).
			I32(int32(D)).I64(int64(NB) * int64(BS))
	})
	if err != nil {
		return fmt.Errorf("cuda: paged_attention: %w", err)
	}
	const warps = 4
	tasks := S * H
	name := fmt.Sprintf("paged_attend_%s_%s_d%d", xn, cn, dl)
	err = d.launchX("paged.cu", inst, name, cubind.Dim3{X: (tasks + warps - 1) / warps, Y: 1, Z: 1}, cubind.Dim3{X: warps * 32, Y: 1, Z: 1}, 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).Ptr(q.ptr).Ptr(kc.ptr).Ptr(vc.ptr).Ptr(pos.ptr).I32(is64(pos)).Ptr(seqs.ptr).I32(is64(seqs)).
			Ptr(tables.ptr).I32(is64(tables)).I32(int32(H)).I32(int32(KV)).I32(int32(S)).I32(int32(D)).
			I32(int32(NB)).I32(int32(BS)).I32(int32(N)).I32(int32(M)).F32(scale).I32(int32(window))
	})
	if err != nil {
		return fmt.Errorf("cuda: paged_attention: %w", err)
	}
	return nil
}

// Gather selects entries of x along axis by the integer indices idx (i32 or i64) into out,
// as graph op gather. An index outside the axis gives zeros, not an error.
func (d *Device) Gather(out, x, idx *Tensor, axis int) error {
	return d.do(func() error { return d.gather(out, x, idx, axis) })
}

func (d *Device) gather(out, x, idx *Tensor, axis int) error {
	if err := checkLive(out, x, idx); err != nil {
		return fmt.Errorf("cuda: gather: %w", err)
	}
	if _, err := intName("indices", idx.DType); err != nil {
		return fmt.Errorf("cuda: gather: %w", err)
	}
	if axis < 0 || axis >= len(x.Shape) {
		return fmt.Errorf("cuda: gather: axis %d is outside x %v", axis, x.Shape)
	}
	shape := slices.Concat(x.Shape[:axis], idx.Shape, x.Shape[axis+1:])
	if err := checkOut("output", out, x.DType, shape); err != nil {
		return fmt.Errorf("cuda: gather: %w", err)
	}
	outer, inner := int64(tensor.Numel(x.Shape[:axis])), int64(tensor.Numel(x.Shape[axis+1:]))
	n, A := int64(idx.Numel()), int64(x.Shape[axis])
	total := outer * n * inner
	if total == 0 {
		return nil
	}
	var tn, ct string
	switch x.DType.Size() {
	case 1:
		tn, ct = "b1", "unsigned char"
	case 2:
		tn, ct = "b2", "unsigned short"
	case 4:
		tn, ct = "b4", "unsigned int"
	case 8:
		tn, ct = "b8", "unsigned long long"
	default:
		return fmt.Errorf("cuda: gather: unsupported dtype %s", x.DType)
	}
	return d.launchX("paged.cu", fmt.Sprintf("GATHER(%s, %s)", ct, tn), "gather_"+tn, d.gridStride(total), block256, 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).Ptr(x.ptr).Ptr(idx.ptr).I32(is64(idx)).I64(outer).I64(A).I64(n).I64(inner)
	})
}
