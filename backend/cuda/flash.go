package cuda

import (
	"fmt"
	"math"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/tensor"
)

// The tensor-core prefill of paged_attention (kernels/flash.cu): FlashAttention-2 on
// mma.sync for bf16 q and a bf16 paged cache, used by pagedAttention in place of
// paged_prefill when flashApplies.

// flashWarps is the kernel's W, the warps of a block (4 or 8), and flashMT its MT, the m16
// row tiles of a warp (1 or 2): a block covers 16*W*MT rows of (token, query head) and
// loads each K/V tile once for all of them. Tests change them to compare. On an H200
// (TestFlashPrefillTimings, Llama-3.1-8B heads, two device calls) 8 warps of one tile ran
// 1.00-1.26x faster than 4; 4 warps of two tiles were 1.05x faster than 8 of one on whole
// prompts but 1.10x slower on 512-token chunks after 31,744 positions.
var flashWarps, flashMT = 8, 1

// flashRows is the rows of one block of the kernel.
func flashRows(D int) int { return 16 * flashWarps * flashTiles(D) }

// flashPrefillEnabled selects the tensor-core prefill where it applies; when false every
// prefill runs paged_prefill.
var flashPrefillEnabled = true

// flashPSplit is the kernel's PS: 2 multiplies the values by P split into two bf16 terms
// (hi and the rounded remainder), 1 by P rounded once to bf16 (see flash.cu's numerics).
// Tests change it to compare the two.
var flashPSplit = 1

// flashCols is the key positions of one K/V tile of the kernel for head size D: 64, or 32
// where the scores of 64 would not fit in registers beside the accumulators (D above 128,
// or two row tiles a warp).
func flashCols(D int) int {
	if D <= 128 && flashTiles(D) == 1 {
		return 64
	}
	return 32
}

// flashTiles is the kernel's MT for head size D: flashMT up to D = 128, else 1 (the
// accumulators of two row tiles of 256 columns do not fit in registers).
func flashTiles(D int) int {
	if D > 128 {
		return 1
	}
	return flashMT
}

// flashShared is the dynamic shared memory of the kernel for head size D: Q [rows][D+8],
// K and V [2][BC][D+8] bf16, tile slots [3][BC] and the tokens' sequence, lo and hi
// [rows] int32.
func flashShared(D int) int {
	sd, bc, br := D+8, flashCols(D), flashRows(D)
	return (br*sd+4*bc*sd)*2 + (3*bc+3*br)*4
}

// flashKernel returns the instantiation and the name of the kernel for head size D and
// split ps (with flashWarps warps of flashMT row tiles).
func flashKernel(D, ps int) (inst, name string) {
	bc, w, mt := flashCols(D), flashWarps, flashTiles(D)
	return fmt.Sprintf("FLASH_PREFILL(%d, %d, %d, %d, %d)", D, bc, ps, w, mt), fmt.Sprintf("flash_prefill_bf16_d%d_c%d_p%d_w%d_m%d", D, bc, ps, w, mt)
}

// flashApplies reports whether the tensor-core kernel can serve a prefill of q[1,H,S,D]
// (qdt) over caches of cdt, [NB,BS,KV,D], with block_tables of M columns, on a device of
// compute capability major with sharedOptin bytes of shared memory per block: bf16 q and
// caches, D a multiple of 16 up to 256, the row tiles within the grid's y limit and
// positions with room to spare in int32.
func flashApplies(qdt, cdt tensor.DType, H, KV, S, D, BS, M, major, sharedOptin int) bool {
	if !flashPrefillEnabled || qdt != tensor.BF16 || cdt != tensor.BF16 || major < 8 {
		return false
	}
	if D%16 != 0 || D == 0 || D > 256 || KV == 0 || H%KV != 0 {
		return false
	}
	tiles := (int64(S)*int64(H/KV) + int64(flashRows(D)) - 1) / int64(flashRows(D))
	return tiles <= 65535 && int64(M)*int64(BS) <= math.MaxInt32-1024 && flashShared(D) <= sharedOptin
}

// useFlashPrefill reports whether pagedAttention's prefill of out [1,H,S,D] from in (as
// pagedAttention takes them, already checked) runs the tensor-core kernel: flashApplies, and
// q, out and the caches 16-byte aligned.
func useFlashPrefill(d *Device, out *Tensor, in []*Tensor) bool {
	q, kc, tables := in[0], in[4], in[8]
	H, S, D, KV := q.Shape[1], q.Shape[2], q.Shape[3], in[1].Shape[1]
	if !flashApplies(q.DType, kc.DType, H, KV, S, D, kc.Shape[1], tables.Shape[1], d.info.Major, d.info.SharedOptin) {
		return false
	}
	for _, t := range []*Tensor{out, q, kc, in[5]} {
		if t.ptr%16 != 0 {
			return false
		}
	}
	return true
}

// flashSplitTarget is the blocks a split launch aims for: two per SM of an H100/H200 (132
// SMs). A constant rather than the device's count, so that the plan and the workspace are
// functions of shapes alone (as decodeTargetWarps).
const flashSplitTarget = 2 * 132

// flashMinSplitKeys is the fewest positions of the block tables' width per split: a split
// then runs at least 16 tiles of 64 keys, enough to amortise writing its partials.
const flashMinSplitKeys = 1024

// flashMaxSplits bounds the splits of a launch.
const flashMaxSplits = 64

// flashSplits is how many parts the tensor-core kernel cuts each run's positions into for
// q[1,H,S,D] over block tables of M entries of BS positions: 1 when its row blocks fill the
// GPU, else enough splits that the blocks reach flashSplitTarget, each covering at least
// flashMinSplitKeys of the tables' width (a chunk of a few tokens after a long prefix: a
// request whose prompt extends a cached prefix, a short chunk of a long prompt).
func flashSplits(H, KV, S, D, M, BS int) int {
	if !flashSplitEnabled || KV == 0 || H%KV != 0 {
		return 1
	}
	blocks := KV * ((S*(H/KV) + flashRows(D) - 1) / flashRows(D))
	if blocks >= flashSplitTarget/2 {
		return 1
	}
	return max(1, min(flashMaxSplits, (flashSplitTarget+blocks-1)/blocks, M*BS/flashMinSplitKeys))
}

// flashSplitEnabled lets the kernel split long contexts; tests turn it off to compare.
var flashSplitEnabled = true

// flashWorkspace is the scratch bytes of the tensor-core kernel for these shapes: the
// partials [S][H][splits][D+2] f32 when it splits.
func flashWorkspace(H, KV, S, D, M, BS int) int64 {
	sp := flashSplits(H, KV, S, D, M, BS)
	if sp <= 1 {
		return 0
	}
	return int64(S) * int64(H) * int64(sp) * int64(D+2) * 4
}

// flashPrefill attends every token of in (q[1,H,S,D], k, v[1,KV,S,D], positions[1,S],
// k_cache, v_cache[NB,BS,KV,D], slot_mapping[S], token_seq[S], block_tables[N,M], checked by
// pagedAttention, the caches already holding this step's keys and values) into out
// [1,H,S,D], or [1,S,H,D] with tm 1, with the tensor-core kernel; when it splits the
// contexts (flashSplits), into partials in ws that paged_combine merges. Bad indices are
// reported through the device's error word as paged_prefill reports them.
func flashPrefill(d *Device, out *Tensor, in []*Tensor, ws *Tensor, scale float32, window int, tm int32) error {
	q, kc, vc, pos, seqs, tables := in[0], in[4], in[5], in[3], in[7], in[8]
	H, S, D, KV := q.Shape[1], q.Shape[2], q.Shape[3], in[1].Shape[1]
	NB, BS, N, M := kc.Shape[0], kc.Shape[1], tables.Shape[0], tables.Shape[1]
	inst, name := flashKernel(D, flashPSplit)
	tiles := (S*(H/KV) + flashRows(D) - 1) / flashRows(D)
	splits := flashSplits(H, KV, S, D, M, BS)
	var part cubind.DevicePtr
	if splits > 1 {
		need := flashWorkspace(H, KV, S, D, M, BS)
		if ws == nil || int64(ws.Bytes()) < need {
			return fmt.Errorf("flash prefill: workspace of %d bytes is below the %d its %d splits need", wsBytes(ws), need, splits)
		}
		part = ws.ptr
	}
	err := d.launchX("flash.cu", inst, name, cubind.Dim3{X: KV, Y: tiles, Z: splits}, cubind.Dim3{X: flashWarps * 32, Y: 1, Z: 1}, flashShared(D), func(a *cubind.Args) {
		a.Ptr(out.ptr).Ptr(part).Ptr(q.ptr).Ptr(kc.ptr).Ptr(vc.ptr).
			Ptr(pos.ptr).I32(is64(pos)).Ptr(seqs.ptr).I32(is64(seqs)).Ptr(tables.ptr).I32(is64(tables)).
			I32(int32(H)).I32(int32(KV)).I32(int32(S)).I32(int32(NB)).I32(int32(BS)).I32(int32(N)).I32(int32(M)).
			F32(scale).I32(int32(window)).Ptr(d.errWord).I32(tm)
	})
	if err != nil {
		return fmt.Errorf("flash prefill: %w", err)
	}
	if splits > 1 {
		err = d.launchX("paged.cu", "PAGED_COMBINE(BF16, bf16)", "paged_combine_bf16",
			cubind.Dim3{X: H, Y: S, Z: 1}, cubind.Dim3{X: min(128, (D+31)/32*32), Y: 1, Z: 1}, 0, func(a *cubind.Args) {
				a.Ptr(out.ptr).Ptr(part).I32(int32(H)).I32(int32(S)).I32(int32(D)).I32(int32(splits)).I32(tm)
			})
		if err != nil {
			return fmt.Errorf("flash prefill: merge %d splits: %w", splits, err)
		}
	}
	return nil
}
