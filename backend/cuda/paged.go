package cuda

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// The paged KV cache ops: paged_attention (see its doc in graph/catalog_cache.go) and the
// gather that gather_logits adds. Kernels are in kernels/paged.cu.

func init() {
	opKernels["paged_attention"] = &opKernel{
		workspace: func(n *graph.Node, in [][]int) int64 { return PagedAttentionWorkspace(in) },
		run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
			var ws *Tensor
			if len(out) > len(n.Outputs) {
				ws = out[len(n.Outputs)]
			}
			return pagedAttention(d, out[0], in, ws, float32(n.Attrs.Float("scale")), n.Attrs.Int("window"), n.Attrs.Int("token_major") == 1)
		},
	}
	opKernels["gather"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		ax, err := graph.NormAxis(n.Attrs.Int("axis"), len(in[0].Shape))
		if err != nil {
			return err
		}
		return gather(d, out[0], in[0], in[1], ax)
	}}
}

// PagedAttention runs graph op paged_attention: in holds q[1,H,S,D], k, v[1,KV,S,D],
// positions[1,S], k_cache, v_cache[NB,BS,KV,D], slot_mapping[S], token_seq[S] and
// block_tables[N,M]. It writes this step's k and v into the caches (in place) and then
// attends into out[1,H,S,D], or with tokenMajor into out[1,S,H,D] (the op's token_major).
// ws is scratch memory of at least PagedAttentionWorkspace bytes (nil when that is 0); the
// call allocates nothing and never waits for the device, and its launches depend only on
// the shapes, so it can be captured in a CUDA graph.
//
// When S <= N (decoding: one new token per sequence) a split-KV kernel writes the step's
// keys and values into the caches itself, reads each token's context in parallel splits
// and, when there are several, a second kernel merges them; otherwise a cache-write kernel
// runs first and a tiled kernel serves several tokens and all query heads of a KV head per
// block. Either is correct for any layout of tokens (the decode kernel relies on each
// slot_mapping entry being the slot block_tables gives for the token's sequence and
// position, as the engine lays them out); the choice is only about speed.
//
// Indices are checked on the device: a slot_mapping entry outside the cache's NB*BS slots, a
// token_seq entry outside block_tables' N rows, a position that is negative or at or past
// M*BS, or a block_tables entry (of a block some token reads) outside the cache's NB blocks
// is skipped and reported by the next Sync or Download, with the bad value. A token whose
// context cannot be read gives NaN. Entries of block_tables past a sequence's last position
// (padding such as -1) are never read.
func PagedAttention(d *Device, out *Tensor, in []*Tensor, ws *Tensor, scale float32, window int, tokenMajor bool) error {
	return d.do(func() error { return pagedAttention(d, out, in, ws, scale, window, tokenMajor) })
}

func is64(t *Tensor) int32 {
	if t.DType == tensor.I64 {
		return 1
	}
	return 0
}

// decodeTargetWarps is the number of warps the decode kernel aims for: as many as an
// H100/H200 (132 SMs) keeps resident at 128 registers per thread (16 per SM). A constant
// rather than the device's count, so that the plan and the workspace are functions of
// shapes alone.
const decodeTargetWarps = 16 * 132

// maxDecodeSplits bounds the splits of one token's context.
const maxDecodeSplits = 64

// decodeSplitWarps bounds the warps of all blocks when the context splits, twice that
// for contexts of at least decodeLongKeys positions (the block tables' width).
const (
	decodeSplitWarps = 1024
	decodeLongKeys   = 32768
)

// Warps per block of the decode kernel: 4, 8 or 16 (DEC_MAX_WARPS in paged.cu);
// decodeMaxShared bounds the shared memory of a block with more than 4 warps.
const (
	decodeMinWarps  = 4
	decodeMaxWarps  = 16
	decodeMaxShared = 48 << 10
)

// decodeFusedWrite has the decode kernel write the step's keys and values into the caches
// itself (see paged_decode in paged.cu) instead of a paged_write launch before it. A
// variable so that tests can time and check both.
var decodeFusedWrite = true

// decodeForce, when its warps are set (tests only), replaces the warps and splits of every
// decode plan (splits at most M), and its u, when set, the keys per lane group and step.
var decodeForce struct{ warps, splits, u int }

// How the decode kernel merges a context's splits (DEC_MERGE_* in paged.cu): a second
// kernel (paged_combine) over partials in the workspace; the last block of the splits to
// finish, counted by tickets the kernel keeps (at most decodeTickets (token, head group)
// pairs); or a thread-block cluster of the splits through distributed shared memory (at most
// decodeClusterMax splits, compute capability 9.0 and cuLaunchKernelEx).
const (
	mergeCombine = 0
	mergeTicket  = 1
	mergeCluster = 2

	decodeTickets    = 4096
	decodeClusterMax = 8
)

// decodeMerge, when not -1 (tests only), replaces the merge of every decode plan with splits
// (a cluster falls back to tickets, and tickets to the combine kernel, where they do not
// apply).
var decodeMerge = -1

// decodePlan is the launch configuration of the decode kernel, from shapes only.
type decodePlan struct {
	vec, lpr, cpl, gp, u int // template parameters, see paged.cu
	hgroups, splits      int
	warps                int // warps per block
	merge                int // mergeCombine, mergeTicket or mergeCluster, with splits
	maxb                 int // table entries a split reads at most
	shared               int // dynamic shared memory in bytes
}

// nextPow2 is the smallest power of two >= n (n >= 1).
func nextPow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

// vecElems is the elements of one vector load of a row of D elements of esize bytes: the
// most that fit 16 bytes and divide D.
func vecElems(D, esize int) int {
	v := max(16/esize, 1)
	for v > 1 && D%v != 0 {
		v /= 2
	}
	return v
}

// planDecode plans the decode kernel for H query and KV key heads of size D, S tokens
// (one block-table row each, S <= N), block tables of M entries of blocks of BS positions
// and cache elements of esize bytes.
//
// A lane holds GP*VEC*CPL query and accumulator elements, at most 32 of each (registers):
// vectors are narrowed (more lanes per row) and then head groups split until they fit.
// Each warp step covers (32/LPR)*U positions. The context of a token is at most M*BS
// positions (the block tables' width bounds it: the plan depends on shapes only). Blocks
// have 8 warps when the GPU has room for them (decodeTargetWarps) and each gets a step of
// that bound, else 4. The context splits (a power of two, at most one table block each)
// while the splits' warps stay within decodeSplitWarps and each warp keeps two steps of
// the bound, or one while that makes at most 4 splits: an H200 run of
// TestPagedDecodeTimings (LOOM_PAGED_SWEEP=1) found these the fastest for 1 to 16
// sequences, where a step of latency, not bandwidth, is what a warp costs; splitting
// costs a second kernel (paged_combine) and the workspace. A block that does not split
// takes 16 warps when the GPU has room and each warp gets 4 steps of the bound. Two
// splits merge in a cluster (within decodeMaxShared), more in paged_combine.
func planDecode(H, KV, S, D, M, BS, esize int) decodePlan {
	var p decodePlan
	G := H / KV
	p.gp = min(8, nextPow2(G))
	p.vec = vecElems(D, esize)
	for {
		nch := D / p.vec
		if nch <= 32 {
			p.lpr, p.cpl = nextPow2(nch), 1
		} else {
			p.lpr, p.cpl = 32, (nch+31)/32
		}
		if p.gp*p.vec*p.cpl <= 32 || p.gp == 1 {
			break
		}
		if p.lpr < 32 && p.vec > 1 {
			p.vec /= 2
		} else {
			p.gp /= 2
		}
	}
	p.hgroups = (G + p.gp - 1) / p.gp
	// Four keys per lane group and step, unless the accumulators, the scores and about three
	// steps' worth of key and value vectors in flight would not fit in registers.
	p.u = 4
	words := max(p.vec*esize/4, 1)
	if p.cpl > 1 || p.gp*p.vec+4*p.gp+12*words > 96 {
		p.u = 2
	}
	step := (32 / p.lpr) * p.u
	pairs := max(S*KV*p.hgroups, 1)
	keys := M * BS
	p.warps = decodeMinWarps
	if pairs*8 <= decodeTargetWarps && keys >= 8*step && p.sharedFor(8, D, M) <= decodeMaxShared {
		p.warps = 8
	}
	p.splits = 1
	lim := min(maxDecodeSplits, M, max(1, decodeSplitWarps/(pairs*p.warps)))
	steps := keys / (p.warps * step) // the splits at which each warp has one step of the bound
	want := min(lim, max(steps/2, min(4, steps)))
	for p.splits*2 <= want {
		p.splits *= 2
	}
	if p.splits == 1 && pairs*decodeMaxWarps <= decodeTargetWarps && keys >= 4*decodeMaxWarps*step &&
		p.sharedFor(decodeMaxWarps, D, M) <= decodeMaxShared {
		p.warps = decodeMaxWarps
	}
	// Long contexts split over blocks of 16 warps, twice the warps in all: an H200 sweep of
	// 1 sequence of 32,768 positions (Llama-3.1-8B heads, and its tp=2 half) found 16 warps
	// with 16 (32) splits 1.40x (1.30x) faster than 8 warps with 16 (32).
	if long := min(maxDecodeSplits, M, max(1, 2*decodeSplitWarps/(pairs*decodeMaxWarps))); p.splits > 1 && keys >= decodeLongKeys && long > 1 &&
		p.sharedFor(decodeMaxWarps, D, (M+long-1)/long) <= decodeMaxShared {
		p.warps, p.splits = decodeMaxWarps, 1
		for p.splits*2 <= long {
			p.splits *= 2
		}
	}
	if decodeForce.warps > 0 {
		p.warps, p.splits = decodeForce.warps, max(1, min(decodeForce.splits, M))
	}
	if decodeForce.u > 0 {
		p.u = decodeForce.u
	}
	// Two splits merge through a cluster (H200: 16 sequences at tp=2 heads, 140 positions
	// 10.2 -> 9.4 µs, 1,024 positions 19.3 -> 18.2); more merge faster in paged_combine (the
	// cluster's barrier waits for its slowest block, and its blocks must be co-scheduled),
	// and the tickets measured slower than paged_combine everywhere.
	p.maxb = (M + p.splits - 1) / p.splits
	p.merge = mergeCombine
	if p.splits == 2 {
		p.merge = mergeCluster
		if p.sharedFor(p.warps, D, p.maxb) > decodeMaxShared {
			p.merge = mergeCombine
		}
	}
	if decodeMerge >= 0 && p.splits > 1 {
		p.merge = decodeMerge
		if p.merge == mergeCluster && p.splits > decodeClusterMax {
			p.merge = mergeTicket
		}
		if p.merge == mergeTicket && S*KV*p.hgroups > decodeTickets {
			p.merge = mergeCombine
		}
	}
	p.shared = p.sharedFor(p.warps, D, p.maxb)
	return p
}

// sharedFor is the decode kernel's shared memory for blocks of warps warps reading up to
// maxb table entries (see paged_decode in paged.cu): the entries, the queries [GP][Dq], the
// warps' work areas and their merge records [GP][D+2], and with a cluster merge the block's
// partials [GP][D+2].
func (p decodePlan) sharedFor(warps, D, maxb int) int {
	ns := (32 / p.lpr) * p.u * p.gp
	work := (p.gp+3)/4*4 + (ns+3)/4*4
	dq := max((D+3)/4*4, p.lpr*p.cpl*p.vec)
	recs := warps
	if p.merge == mergeCluster {
		recs++
	}
	return (maxb+3)/4*4*4 + (p.gp*dq+warps*work+recs*p.gp*(D+2))*4
}

// pfWarps, pfRows and pfCols mirror PF_WARPS, PF_BR and PF_BC in paged.cu.
const (
	pfWarps = 4
	pfRows  = 32
	pfCols  = 32
)

// workspace is the scratch bytes the plan needs: the splits' partials [S][H][splits][D+2]
// f32 when there is more than one split (a cluster merge needs none, but the workspace of a
// shape does not depend on the device, which may not have clusters).
func (p decodePlan) workspace(H, S, D int) int64 {
	if p.splits <= 1 {
		return 0
	}
	return int64(S) * int64(H) * int64(p.splits) * int64(D+2) * 4
}

// PagedAttentionWorkspace returns the bytes of scratch memory PagedAttention needs for the
// given input shapes (as in: q, k, v, positions, k_cache, v_cache, slot_mapping, token_seq,
// block_tables); 0 when it needs none. Cache dtypes do not matter: it covers both bf16 and
// f32 caches.
func PagedAttentionWorkspace(in [][]int) int64 {
	if len(in) != 9 || len(in[0]) != 4 || len(in[1]) != 4 || len(in[8]) != 2 {
		return 0
	}
	H, S, D, KV := in[0][1], in[0][2], in[0][3], in[1][1]
	N, M := in[8][0], in[8][1]
	if KV == 0 || H%KV != 0 || S == 0 || len(in[4]) != 4 {
		return 0
	}
	BS := in[4][1]
	if S > N { // a prefill: the tensor-core kernel's splits
		return flashWorkspace(H, KV, S, D, M, BS)
	}
	return max(planDecode(H, KV, S, D, M, BS, 2).workspace(H, S, D), planDecode(H, KV, S, D, M, BS, 4).workspace(H, S, D))
}

// prefillDL is the accumulators per lane and row of the prefill kernel: ceil(D/32), with
// 5..8 rounded up to 8.
func prefillDL(D int) int {
	dl := (D + 31) / 32
	if dl > 4 {
		dl = 8
	}
	return dl
}

func pagedAttention(d *Device, out *Tensor, in []*Tensor, ws *Tensor, scale float32, window int, tokenMajor bool) error {
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
	if D > attMaxD || D == 0 {
		return fmt.Errorf("cuda: paged_attention: head size %d is outside the kernel's range 1..%d", D, attMaxD)
	}
	oshape, tm := q.Shape, int32(0)
	if tokenMajor {
		oshape, tm = []int{1, q.Shape[2], q.Shape[1], q.Shape[3]}, 1
	}
	if err := checkOut("output", out, q.DType, oshape); err != nil {
		return fmt.Errorf("cuda: paged_attention: %w", err)
	}
	if S == 0 || H == 0 {
		return nil
	}
	NB, BS, N, M := kc.Shape[0], kc.Shape[1], tables.Shape[0], tables.Shape[1]
	if N == 0 || M == 0 {
		return fmt.Errorf("cuda: paged_attention: block_tables %v has no entries for %d tokens", tables.Shape, S)
	}
	if int64(NB)*int64(BS) > math.MaxInt32 || int64(M)*int64(BS) > math.MaxInt32 {
		return fmt.Errorf("cuda: paged_attention: cache of %d blocks of %d or tables of %d blocks exceed 2^31 positions", NB, BS, M)
	}
	X, C := strings.ToUpper(xn), strings.ToUpper(cn)
	fail := func(err error) error { return fmt.Errorf("cuda: paged_attention: %w", err) }
	decode := S <= N
	fused := decode && decodeFusedWrite
	if !fused {
		wvec := writeVec(D, operand{k.ptr, k.DType}, operand{v.ptr, v.DType}, operand{kc.ptr, kc.DType}, operand{vc.ptr, vc.DType})
		wblock := cubind.Dim3{X: min(1024, max(32, (KV*D/wvec+31)/32*32)), Y: 1, Z: 1}
		err = d.launchX("paged.cu", fmt.Sprintf("PAGED_WRITE(%s, %s, %s, %s)", X, xn, C, cn), "paged_write_"+xn+"_"+cn,
			cubind.Dim3{X: S, Y: 1, Z: 1}, wblock, 0, func(a *cubind.Args) {
				a.Ptr(kc.ptr).Ptr(vc.ptr).Ptr(k.ptr).Ptr(v.ptr).Ptr(slots.ptr).I32(is64(slots)).I32(int32(KV)).I32(int32(S)).
					I32(int32(D)).I64(int64(NB) * int64(BS)).I32(int32(wvec)).Ptr(d.errWord)
			})
		if err != nil {
			return fail(err)
		}
	}
	idx := func(a *cubind.Args) {
		a.Ptr(pos.ptr).I32(is64(pos)).Ptr(seqs.ptr).I32(is64(seqs)).Ptr(tables.ptr).I32(is64(tables)).
			I32(int32(H)).I32(int32(KV)).I32(int32(S)).I32(int32(D)).I32(int32(NB)).I32(int32(BS)).I32(int32(N)).I32(int32(M)).
			F32(scale).I32(int32(window))
	}
	if decode {
		p := planDecode(H, KV, S, D, M, BS, kc.DType.Size())
		need := p.workspace(H, S, D)
		var part cubind.DevicePtr
		if need > 0 {
			if ws == nil || int64(ws.Bytes()) < need {
				return fail(fmt.Errorf("workspace of %d bytes is below the %d this call needs", wsBytes(ws), need))
			}
			part = ws.ptr
		}
		if p.merge == mergeCluster && !d.pdl {
			// No cuLaunchKernelEx or an older GPU (d.pdl needs both; with LOOM_CUDA_PDL=0
			// too): paged_combine merges the splits.
			p.merge = mergeCombine
			p.shared = p.sharedFor(p.warps, D, p.maxb)
		}
		inst, name := decodeKernel(xn, cn, p)
		grid, block := cubind.Dim3{X: p.splits, Y: KV * p.hgroups, Z: S}, cubind.Dim3{X: p.warps * 32, Y: 1, Z: 1}
		args := func(a *cubind.Args) {
			fw := int32(0)
			if fused {
				fw = 1
			}
			a.Ptr(out.ptr).Ptr(part).Ptr(q.ptr).Ptr(kc.ptr).Ptr(vc.ptr).Ptr(k.ptr).Ptr(v.ptr).Ptr(slots.ptr).I32(is64(slots))
			idx(a)
			a.I32(int32(p.maxb)).I32(fw).Ptr(d.errWord).I32(tm).I32(int32(p.merge))
		}
		if p.merge == mergeCluster {
			err = d.launchCluster("paged.cu", inst, name, grid, block, cubind.Dim3{X: p.splits, Y: 1, Z: 1}, p.shared, args)
		} else {
			err = d.launchX("paged.cu", inst, name, grid, block, p.shared, args)
		}
		if err != nil {
			return fail(err)
		}
		if p.splits > 1 && p.merge == mergeCombine {
			err = d.launchX("paged.cu", fmt.Sprintf("PAGED_COMBINE(%s, %s)", X, xn), "paged_combine_"+xn,
				cubind.Dim3{X: H, Y: S, Z: 1}, cubind.Dim3{X: min(128, (D+31)/32*32), Y: 1, Z: 1}, 0, func(a *cubind.Args) {
					a.Ptr(out.ptr).Ptr(part).I32(int32(H)).I32(int32(S)).I32(int32(D)).I32(int32(p.splits)).I32(tm)
				})
			if err != nil {
				return fail(err)
			}
		}
		return nil
	}
	if useFlashPrefill(d, out, in) {
		if err := flashPrefill(d, out, in, ws, scale, window, tm); err != nil {
			return fail(err)
		}
		return nil
	}
	inst, name, shared := prefillKernel(xn, cn, D, kc.DType.Size())
	G := H / KV
	err = d.launchX("paged.cu", inst, name, cubind.Dim3{X: (S*G + pfRows - 1) / pfRows, Y: KV, Z: 1}, cubind.Dim3{X: pfWarps * 32, Y: 1, Z: 1}, shared, func(a *cubind.Args) {
		a.Ptr(out.ptr).Ptr(q.ptr).Ptr(kc.ptr).Ptr(vc.ptr)
		idx(a)
		a.Ptr(d.errWord).I32(tm)
	})
	if err != nil {
		return fail(err)
	}
	return nil
}

// launchCluster is launchX for a kernel of pdlFiles launched in thread-block clusters of
// cluster blocks, with programmatic dependent launch where the device uses it.
func (d *Device) launchCluster(file, extra, name string, grid, block, cluster cubind.Dim3, shared int, args func(a *cubind.Args)) error {
	f, pdl, err := d.prepare(file, extra, name, shared, args)
	if err != nil {
		return err
	}
	if err := cubind.LaunchKernelCluster(f, grid, block, cluster, shared, d.stream, &d.args, pdl); err != nil {
		return fmt.Errorf("cuda: kernel %s: %w", name, err)
	}
	return nil
}

// writeVec is the vector of paged_write, in elements: 16 bytes of the widest operand dtype,
// halved until it divides D and every operand is aligned to it.
func writeVec(D int, ops ...operand) int {
	size := 1
	for _, o := range ops {
		size = max(size, o.dt.Size())
	}
	v := max(16/size, 1)
	for ; v > 1; v /= 2 {
		ok := D%v == 0
		for _, o := range ops {
			ok = ok && uint64(o.ptr)%uint64(v*o.dt.Size()) == 0
		}
		if ok {
			break
		}
	}
	return v
}

func wsBytes(ws *Tensor) int {
	if ws == nil {
		return 0
	}
	return ws.Bytes()
}

// decodeKernel returns the instantiation and the name of the decode kernel of a plan.
func decodeKernel(xn, cn string, p decodePlan) (inst, name string) {
	inst = fmt.Sprintf("PAGED_DECODE(%s, %s, %s, %s, %d, %d, %d, %d, %d)", strings.ToUpper(xn), xn, strings.ToUpper(cn), cn, p.vec, p.lpr, p.cpl, p.gp, p.u)
	name = fmt.Sprintf("paged_decode_%s_%s_v%d_l%d_c%d_g%d_u%d", xn, cn, p.vec, p.lpr, p.cpl, p.gp, p.u)
	return inst, name
}

// prefillKernel returns the instantiation, name and shared memory of the prefill kernel.
func prefillKernel(xn, cn string, D, esize int) (inst, name string, shared int) {
	dl, vec := prefillDL(D), vecElems(D, esize)
	inst = fmt.Sprintf("PAGED_PREFILL(%s, %s, %s, %s, %d, %d)", strings.ToUpper(xn), xn, strings.ToUpper(cn), cn, dl, vec)
	name = fmt.Sprintf("paged_prefill_%s_%s_d%d_v%d", xn, cn, dl, vec)
	dp := (D + 3) / 4 * 4
	shared = (pfRows*dp+pfCols*(dp+4)+pfCols*dp+pfRows*pfCols)*4 + pfCols*8
	return inst, name, shared
}

// pagedError is the error of a device error word a paged_attention kernel set (see
// paged.cu), or nil for another code.
func pagedError(w [4]int32) error {
	switch w[0] {
	case 2:
		return fmt.Errorf("cuda: paged_attention: slot_mapping entry %d (token %d) outside the cache's %d slots", w[1], w[2], w[3])
	case 3:
		return fmt.Errorf("cuda: paged_attention: block table entry %d (sequence %d) outside the cache's %d blocks", w[1], w[2], w[3])
	case 4:
		return fmt.Errorf("cuda: paged_attention: token_seq entry %d (token %d) outside block_tables' %d rows", w[1], w[2], w[3])
	case 5:
		return fmt.Errorf("cuda: paged_attention: position %d (token %d) outside the %d positions block_tables covers", w[1], w[2], w[3])
	}
	return nil
}

// Gather selects entries of x along axis by the integer indices idx (i32 or i64) into out,
// as graph op gather. An index outside the axis gives zeros, not an error.
func Gather(d *Device, out, x, idx *Tensor, axis int) error {
	return d.do(func() error { return gather(d, out, x, idx, axis) })
}

func gather(d *Device, out, x, idx *Tensor, axis int) error {
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
	return d.launchX("paged.cu", fmt.Sprintf("GATHER(%s, %s)", ct, tn), "gather_"+tn, gridStride(d, total), block256, 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).Ptr(x.ptr).Ptr(idx.ptr).I32(is64(idx)).I64(outer).I64(A).I64(n).I64(inner)
	})
}
