package cuda

import (
	"fmt"
	"slices"
	"strings"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Context parallelism on the GPU (graph/catalog_cp.go): the kernels of attention_partial,
// paged_attention_partial and attention_merge (kernels/cp.cu), and the exchanges between the
// ranks of a cp group, ring_shift (an ncclSend/ncclRecv pair) and all_to_all (grouped
// sends and receives), through the program's Collectives when it also has Exchanges. With
// a group of one rank both are a copy on the device.

func init() {
	opKernels["attention_partial"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return attentionPartial(d, out[0], out[1], in[0], in[1], in[2], in[3], in[4], float32(n.Attrs.Float("scale")), n.Attrs.Int("window"))
	}}
	opKernels["paged_attention_partial"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return pagedAttentionPartial(d, out[0], out[1], in, float32(n.Attrs.Float("scale")), n.Attrs.Int("window"))
	}}
	opKernels["attention_merge"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return attentionMerge(d, out[0], out[1], in[0], in[1], in[2], in[3])
	}}
	opKernels["ring_shift"] = &opKernel{collective: true, run: runRingShift}
	opKernels["all_to_all"] = &opKernel{collective: true, workspace: allToAllWorkspace, run: runAllToAll}
}

// Exchanges is the point-to-point power of a Collectives that ring_shift and all_to_all
// need: SendRecv sends count elements of send to the group's rank to and receives count
// from its rank from into recv (positions in g.Ranks), in one group so that a ring cannot
// deadlock; AllToAll sends the j-th piece of countPerPeer elements of send to rank j of g
// and receives rank j's piece for this rank into the j-th piece of recv. Both queue their
// work on stream s.
type Exchanges interface {
	SendRecv(g dist.Group, send, recv cubind.DevicePtr, count int, dt tensor.DType, to, from int, s cubind.Stream) error
	AllToAll(g dist.Group, send, recv cubind.DevicePtr, countPerPeer int, dt tensor.DType, s cubind.Stream) error
}

var _ Exchanges = ncclRank{}

func (r ncclRank) SendRecv(g dist.Group, send, recv cubind.DevicePtr, count int, dt tensor.DType, to, from int, s cubind.Stream) error {
	c, err := r.w.Group(g)
	if err != nil {
		return err
	}
	return c.SendRecv(send, recv, count, dt, to, from, s)
}

func (r ncclRank) AllToAll(g dist.Group, send, recv cubind.DevicePtr, countPerPeer int, dt tensor.DType, s cubind.Stream) error {
	c, err := r.w.Group(g)
	if err != nil {
		return err
	}
	return c.AllToAll(send, recv, countPerPeer, dt, s)
}

// exchanges returns the program's communicator as Exchanges, or an error naming the op.
func (c *collective) exchanges(op string) (Exchanges, error) {
	x, ok := c.comm.(Exchanges)
	if !ok {
		return nil, fmt.Errorf("%s over %s: the communicator (%T) has no point-to-point exchanges", op, c.b.Group(), c.comm)
	}
	return x, nil
}

// runRingShift passes x one step around the ring of its group: out gets the x of the
// previous rank (mod the group's size).
func runRingShift(d *Device, n *graph.Node, in, out []*Tensor, state any) error {
	c := state.(*collective)
	x := in[0]
	if err := checkOut("ring_shift output", out[0], x.DType, x.Shape); err != nil {
		return err
	}
	g := c.b.Group()
	G := g.Size()
	if G == 1 || x.Numel() == 0 {
		return copyWhole(d, out[0], x)
	}
	ex, err := c.exchanges("ring_shift")
	if err != nil {
		return err
	}
	return ex.SendRecv(g, x.ptr, out[0].ptr, x.Numel(), x.DType, (g.Index+1)%G, (g.Index+G-1)%G, d.stream)
}

// copyWhole copies src into dst (same dtype and element count).
func copyWhole(d *Device, dst, src *Tensor) error {
	if dst.ptr == src.ptr || src.Numel() == 0 {
		return nil
	}
	return d.copyDtoD(dst.ptr, src.ptr, uint64(src.Bytes()))
}

// allToAllWorkspace: the pieces of x laid out for sending, then the pieces received (each
// x's size, the second at a 256-byte boundary).
func allToAllWorkspace(n *graph.Node, in [][]int) int64 {
	size := int64(tensor.Numel(in[0])) * int64(n.Inputs[0].Type.DType.Size())
	return (size+255)&^255 + size
}

// runAllToAll cuts x into G pieces along split_axis, sends piece j to rank j of the group and
// concatenates the pieces received along concat_axis in group order. NCCL sends contiguous
// pieces: unless everything before split_axis has size 1, x is first laid out as [G, pre,
// A/G, post] in the workspace; unless everything before concat_axis (of a piece) has size
// 1, the pieces arrive in the workspace and are copied into out's layout.
func runAllToAll(d *Device, n *graph.Node, in, out []*Tensor, state any) error {
	c := state.(*collective)
	x, y := in[0], out[0]
	g := c.b.Group()
	G := g.Size()
	sa, err := graph.NormAxis(n.Attrs.Int("split_axis"), len(x.Shape))
	if err != nil {
		return fmt.Errorf("all_to_all: split_axis: %w", err)
	}
	ca, err := graph.NormAxis(n.Attrs.Int("concat_axis"), len(x.Shape))
	if err != nil {
		return fmt.Errorf("all_to_all: concat_axis: %w", err)
	}
	if x.Shape[sa]%G != 0 {
		return fmt.Errorf("all_to_all: axis %d of %v does not split into %d pieces", sa, x.Shape, G)
	}
	piece := slices.Clone(x.Shape)
	piece[sa] /= G
	want := slices.Clone(piece)
	want[ca] *= G
	if err := checkOut("all_to_all output", y, x.DType, want); err != nil {
		return err
	}
	if G == 1 || x.Numel() == 0 {
		return copyWhole(d, y, x)
	}
	ex, err := c.exchanges("all_to_all")
	if err != nil {
		return err
	}
	ws := out[len(n.Outputs)]
	recvOff := cubind.DevicePtr((int64(x.Bytes()) + 255) &^ 255)
	send := x
	if pre, A, post := splitAt(x.Shape, sa); pre != 1 {
		send = workspaceTensor(ws, x.DType, x.Shape)
		p := A / G
		dims := []int{G, pre, p, post}
		from := []int64{int64(p * post), int64(A * post), int64(post), 1}
		to := []int64{int64(pre * p * post), int64(p * post), int64(post), 1}
		if err := copyStrided(d, send, x, dims, from, to, 0, 0); err != nil {
			return fmt.Errorf("all_to_all: %w", err)
		}
	}
	pre, P, post := splitAt(piece, ca)
	recv := y
	if pre != 1 {
		recv = &Tensor{DType: x.DType, Shape: []int{x.Numel()}, ptr: ws.ptr + recvOff, dev: ws.dev}
	}
	per := x.Numel() / G
	if err := ex.AllToAll(g, send.ptr, recv.ptr, per, x.DType, d.stream); err != nil {
		return err
	}
	if recv == y {
		return nil
	}
	dims := []int{G, pre, P, post}
	from := []int64{int64(per), int64(P * post), int64(post), 1}
	to := []int64{int64(P * post), int64(G * P * post), int64(post), 1}
	if err := copyStrided(d, y, recv, dims, from, to, 0, 0); err != nil {
		return fmt.Errorf("all_to_all: %w", err)
	}
	return nil
}

// Tiling of the cp kernels; must match cp.cu.
const (
	cpWarps = 4
	cpBR    = 16
	cpBC    = 32
	cpMaxD  = 256
)

// cpHeadClass is the instantiated head-size class of D: values per lane 1, 2, 3, 4 or 8
// (D up to 32, 64, 96, 128, 256).
func cpHeadClass(D int) int {
	dl := (D + 31) / 32
	if dl > 4 {
		dl = 8
	}
	return dl
}

// cpShared is the dynamic shared memory of the cp attention kernels for head size D.
func cpShared(D int) int {
	return 4*(cpBC*(D+1)+cpBC*D+cpBR*D+(cpBR*D)%2) + 8*cpBC
}

// AttentionPartial runs graph op attention_partial: q[NQ,B,H,Sq,D] against k, v
// [NK,B,KV,Sk,D] (one dtype, f32 or bf16; H a multiple of KV; D <= 256) at positions
// qPos[NQ,B,Sq] and kPos[NK,B,Sk] (i32 or i64) into o f32[NQ,B,H,Sq,D] and lse
// f32[NQ,B,H,Sq]: a query sees a key of its batch row when k_pos <= q_pos (and k_pos >
// q_pos - window when window > 0); a query that sees none gets o = 0 and lse = -inf.
func AttentionPartial(d *Device, o, lse, q, k, v, qPos, kPos *Tensor, scale float32, window int) error {
	return d.do(func() error { return attentionPartial(d, o, lse, q, k, v, qPos, kPos, scale, window) })
}

func attentionPartial(d *Device, o, lse, q, k, v, qPos, kPos *Tensor, scale float32, window int) error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("cuda: attention_partial: "+format, args...)
	}
	if err := checkLive(o, lse, q, k, v, qPos, kPos); err != nil {
		return fail("%w", err)
	}
	xn, err := floatName("q", q.DType)
	if err != nil {
		return fail("%w", err)
	}
	if k.DType != q.DType || v.DType != q.DType {
		return fail("q, k and v must share a dtype, got %s, %s, %s", q.DType, k.DType, v.DType)
	}
	if _, err := intName("q_pos", qPos.DType); err != nil {
		return fail("%w", err)
	}
	if _, err := intName("k_pos", kPos.DType); err != nil {
		return fail("%w", err)
	}
	if len(q.Shape) != 5 || len(k.Shape) != 5 || !slices.Equal(k.Shape, v.Shape) {
		return fail("want q [NQ,B,H,Sq,D] and k, v [NK,B,KV,Sk,D], got %v, %v, %v", q.Shape, k.Shape, v.Shape)
	}
	NQ, B, H, Sq, D := q.Shape[0], q.Shape[1], q.Shape[2], q.Shape[3], q.Shape[4]
	NK, KV, Sk := k.Shape[0], k.Shape[2], k.Shape[3]
	if KV == 0 || H%KV != 0 || k.Shape[1] != B || k.Shape[4] != D {
		return fail("q %v does not fit k %v", q.Shape, k.Shape)
	}
	if !slices.Equal(qPos.Shape, []int{NQ, B, Sq}) || !slices.Equal(kPos.Shape, []int{NK, B, Sk}) {
		return fail("q_pos %v and k_pos %v do not fit q %v and k %v", qPos.Shape, kPos.Shape, q.Shape, k.Shape)
	}
	if D > cpMaxD {
		return fail("head size %d is above the kernel's limit %d", D, cpMaxD)
	}
	if err := checkOut("o", o, tensor.F32, q.Shape); err != nil {
		return fail("%w", err)
	}
	if err := checkOut("lse", lse, tensor.F32, q.Shape[:4]); err != nil {
		return fail("%w", err)
	}
	if q.Numel() == 0 && lse.Numel() == 0 {
		return nil
	}
	if H > 65535 || NQ*B > 65535 {
		return fail("heads %d or query blocks times batch %d above the grid limit 65535", H, NQ*B)
	}
	if int64(NK)*int64(Sk) > 1<<31-1 {
		return fail("%d key blocks of %d keys are above the kernel's 2^31 keys", NK, Sk)
	}
	dl := cpHeadClass(D)
	name := fmt.Sprintf("cp_partial_%s_d%d", xn, dl)
	inst := fmt.Sprintf("CP_PARTIAL(%s, %s, %d)", strings.ToUpper(xn), xn, dl)
	grid := cubind.Dim3{X: (Sq + cpBR - 1) / cpBR, Y: H, Z: NQ * B}
	return d.launchX("cp.cu", inst, name, grid, cubind.Dim3{X: cpWarps * 32, Y: 1, Z: 1}, cpShared(D), func(a *cubind.Args) {
		a.Ptr(o.ptr).Ptr(lse.ptr).Ptr(q.ptr).Ptr(k.ptr).Ptr(v.ptr).Ptr(qPos.ptr).I32(is64(qPos)).Ptr(kPos.ptr).I32(is64(kPos)).
			I32(int32(B)).I32(int32(H)).I32(int32(KV)).I32(int32(Sq)).I32(int32(Sk)).I32(int32(NK)).I32(int32(D)).
			F32(scale).I32(int32(window))
	})
}

// PagedAttentionPartial runs graph op paged_attention_partial: in holds q[NQ,1,H,Sq,D],
// k, v[1,KV,Sk,D] (the rank's own tokens of the step), q_pos[NQ,1,Sq], k_cache,
// v_cache[NB,BS,KV,D], slot_mapping[Sk], q_seq[NQ,Sq], block_tables[N,M] and kv_pos[N,L]
// (L <= M*BS). It writes k and v into the caches at their slots (in place; a slot < 0 is
// not written), then attends every query to the entries of its sequence's kv_pos row that
// it may see, into o f32[NQ,1,H,Sq,D] and lse f32[NQ,1,H,Sq] (a query of q_seq < 0, or
// that sees no key, gets o = 0 and lse = -inf). q, k and v share a dtype, f32 or bf16, as
// do the caches; indices are i32 or i64. A slot outside the cache, a q_seq entry outside
// block_tables' rows or a block_tables entry (of an entry with kv_pos >= 0) outside the
// cache's blocks is skipped and reported by the next Sync or Download.
//
// One block serves one query and up to 16 query heads of one KV head, reading the keys
// of its sequence in tiles of 32; the context is not split across blocks.
func PagedAttentionPartial(d *Device, o, lse *Tensor, in []*Tensor, scale float32, window int) error {
	return d.do(func() error { return pagedAttentionPartial(d, o, lse, in, scale, window) })
}

func pagedAttentionPartial(d *Device, o, lse *Tensor, in []*Tensor, scale float32, window int) error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("cuda: paged_attention_partial: "+format, args...)
	}
	if len(in) != 10 {
		return fail("want 10 inputs, got %d", len(in))
	}
	if err := checkLive(append([]*Tensor{o, lse}, in...)...); err != nil {
		return fail("%w", err)
	}
	q, k, v, qp, kc, vc, slots, qseq, tables, kvp := in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8], in[9]
	xn, err := floatName("q", q.DType)
	if err != nil {
		return fail("%w", err)
	}
	if k.DType != q.DType || v.DType != q.DType {
		return fail("q, k and v must share a dtype, got %s, %s, %s", q.DType, k.DType, v.DType)
	}
	cn, err := floatName("k_cache", kc.DType)
	if err != nil {
		return fail("%w", err)
	}
	for i, t := range []*Tensor{qp, slots, qseq, tables, kvp} {
		if _, err := intName([]string{"q_pos", "slot_mapping", "q_seq", "block_tables", "kv_pos"}[i], t.DType); err != nil {
			return fail("%w", err)
		}
	}
	shapes := make([][]int, len(in))
	for i, t := range in {
		shapes[i] = t.Shape
	}
	dims, err := graph.PagedPartialShapes(shapes, kc.DType, vc.DType)
	if err != nil {
		return fail("%w", err)
	}
	NQ, H, Sq, D, KV, Sk := dims.NQ, dims.H, dims.Sq, dims.D, dims.KV, dims.Sk
	NB, BS, N, M, L := dims.NB, dims.BS, dims.N, dims.M, dims.L
	if D > cpMaxD {
		return fail("head size %d is above the kernel's limit %d", D, cpMaxD)
	}
	if err := checkOut("o", o, tensor.F32, q.Shape); err != nil {
		return fail("%w", err)
	}
	if err := checkOut("lse", lse, tensor.F32, q.Shape[:4]); err != nil {
		return fail("%w", err)
	}
	if Sk > 0 && KV*D > 0 {
		name := fmt.Sprintf("cp_write_%s_%s", xn, cn)
		inst := fmt.Sprintf("CP_WRITE(%s, %s, %s, %s)", strings.ToUpper(xn), xn, strings.ToUpper(cn), cn)
		err := d.launchX("cp.cu", inst, name, gridStride(d, int64(Sk)*int64(KV)*int64(D)), block256, 0, func(a *cubind.Args) {
			a.Ptr(kc.ptr).Ptr(vc.ptr).Ptr(k.ptr).Ptr(v.ptr).Ptr(slots.ptr).I32(is64(slots)).I32(int32(KV)).I32(int32(Sk)).
				I32(int32(D)).I64(int64(NB) * int64(BS)).Ptr(d.errWord)
		})
		if err != nil {
			return fail("%w", err)
		}
	}
	if NQ*Sq == 0 || H == 0 {
		return nil
	}
	rep := H / KV
	if KV > 65535 || (rep+cpBR-1)/cpBR > 65535 {
		return fail("KV heads %d or query heads per KV head %d above the grid limit", KV, rep)
	}
	dl := cpHeadClass(D)
	name := fmt.Sprintf("cp_paged_%s_%s_d%d", xn, cn, dl)
	inst := fmt.Sprintf("CP_PAGED(%s, %s, %s, %s, %d)", strings.ToUpper(xn), xn, strings.ToUpper(cn), cn, dl)
	grid := cubind.Dim3{X: NQ * Sq, Y: KV, Z: (rep + cpBR - 1) / cpBR}
	return d.launchX("cp.cu", inst, name, grid, cubind.Dim3{X: cpWarps * 32, Y: 1, Z: 1}, cpShared(D), func(a *cubind.Args) {
		a.Ptr(o.ptr).Ptr(lse.ptr).Ptr(q.ptr).Ptr(kc.ptr).Ptr(vc.ptr).Ptr(qp.ptr).I32(is64(qp)).Ptr(qseq.ptr).I32(is64(qseq)).
			Ptr(tables.ptr).I32(is64(tables)).Ptr(kvp.ptr).I32(is64(kvp)).I32(int32(H)).I32(int32(KV)).I32(int32(Sq)).
			I32(int32(D)).I32(int32(N)).I32(int32(M)).I32(int32(L)).I32(int32(BS)).I32(int32(NB)).F32(scale).
			I32(int32(window)).Ptr(d.errWord)
	})
}

// AttentionMerge runs graph op attention_merge: o1, o2 f32[...,D] and lse1, lse2 f32[...]
// into o f32[...,D] and lse f32[...], with the CPU kernel's f32 arithmetic (bit for bit but
// for exp and log, computed in double and rounded).
func AttentionMerge(d *Device, o, lse, o1, lse1, o2, lse2 *Tensor) error {
	return d.do(func() error { return attentionMerge(d, o, lse, o1, lse1, o2, lse2) })
}

func attentionMerge(d *Device, o, lse, o1, lse1, o2, lse2 *Tensor) error {
	if err := checkLive(o, lse, o1, lse1, o2, lse2); err != nil {
		return fmt.Errorf("cuda: attention_merge: %w", err)
	}
	for i, t := range []*Tensor{o1, lse1, o2, lse2} {
		if t.DType != tensor.F32 {
			return fmt.Errorf("cuda: attention_merge: %s is %s, want f32", []string{"o1", "lse1", "o2", "lse2"}[i], t.DType)
		}
	}
	if !slices.Equal(o1.Shape, o2.Shape) || !slices.Equal(lse1.Shape, lse2.Shape) || len(o1.Shape) != len(lse1.Shape)+1 ||
		!slices.Equal(o1.Shape[:len(lse1.Shape)], lse1.Shape) {
		return fmt.Errorf("cuda: attention_merge: o %v, %v and lse %v, %v do not fit", o1.Shape, o2.Shape, lse1.Shape, lse2.Shape)
	}
	if err := checkOut("o", o, tensor.F32, o1.Shape); err != nil {
		return fmt.Errorf("cuda: attention_merge: %w", err)
	}
	if err := checkOut("lse", lse, tensor.F32, lse1.Shape); err != nil {
		return fmt.Errorf("cuda: attention_merge: %w", err)
	}
	rows, D := lse1.Numel(), o1.Shape[len(o1.Shape)-1]
	if rows == 0 {
		return nil
	}
	return d.launch("cp.cu", "cp_merge", gridStride(d, int64(rows)*int64(max(D, 1))), block256, 0, func(a *cubind.Args) {
		a.Ptr(o.ptr).Ptr(lse.ptr).Ptr(o1.ptr).Ptr(lse1.ptr).Ptr(o2.ptr).Ptr(lse2.ptr).I64(int64(rows)).I32(int32(D))
	})
}
