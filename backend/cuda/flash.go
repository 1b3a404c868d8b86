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

// flashWarps is the kernel's W, the warps of a block (4 or 8): a block covers 16*W rows of
// (token, query head) and loads each K/V tile once for all of them. Tests change it to
// compare the two.
var flashWarps = 8

// flashRows is the rows of one block of the kernel.
func flashRows() int { return 16 * flashWarps }

// flashPrefillEnabled selects the tensor-core prefill where it applies; when false every
// prefill runs paged_prefill.
var flashPrefillEnabled = true

// flashPSplit is the kernel's PS: 2 multiplies the values by P split into two bf16 terms
// (hi and the rounded remainder), 1 by P rounded once to bf16 (see flash.cu's numerics).
// Tests change it to compare the two.
var flashPSplit = 1

// flashCols is the key positions of one K/V tile of the kernel for head size D.
func flashCols(D int) int {
	if D <= 128 {
		return 64
	}
	return 32
}

// flashShared is the dynamic shared memory of the kernel for head size D: Q [rows][D+8],
// K and V [2][BC][D+8] bf16, tile slots [3][BC] and the tokens' sequence, lo and hi
// [rows] int32.
func flashShared(D int) int {
	sd, bc, br := D+8, flashCols(D), flashRows()
	return (br*sd+4*bc*sd)*2 + (3*bc+3*br)*4
}

// flashKernel returns the instantiation and the name of the kernel for head size D and
// split ps (with flashWarps warps).
func flashKernel(D, ps int) (inst, name string) {
	bc, w := flashCols(D), flashWarps
	return fmt.Sprintf("FLASH_PREFILL(%d, %d, %d, %d)", D, bc, ps, w), fmt.Sprintf("flash_prefill_bf16_d%d_c%d_p%d_w%d", D, bc, ps, w)
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
	tiles := (int64(S)*int64(H/KV) + int64(flashRows()) - 1) / int64(flashRows())
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

// flashPrefill attends every token of in (q[1,H,S,D], k, v[1,KV,S,D], positions[1,S],
// k_cache, v_cache[NB,BS,KV,D], slot_mapping[S], token_seq[S], block_tables[N,M], checked by
// pagedAttention, the caches already holding this step's keys and values) into out
// [1,H,S,D], or [1,S,H,D] with tm 1, with the tensor-core kernel. Bad indices are reported through the device's
// error word as paged_prefill reports them.
func flashPrefill(d *Device, out *Tensor, in []*Tensor, scale float32, window int, tm int32) error {
	q, kc, vc, pos, seqs, tables := in[0], in[4], in[5], in[3], in[7], in[8]
	H, S, D, KV := q.Shape[1], q.Shape[2], q.Shape[3], in[1].Shape[1]
	NB, BS, N, M := kc.Shape[0], kc.Shape[1], tables.Shape[0], tables.Shape[1]
	inst, name := flashKernel(D, flashPSplit)
	tiles := (S*(H/KV) + flashRows() - 1) / flashRows()
	err := d.launchX("flash.cu", inst, name, cubind.Dim3{X: KV, Y: tiles, Z: 1}, cubind.Dim3{X: flashWarps * 32, Y: 1, Z: 1}, flashShared(D), func(a *cubind.Args) {
		a.Ptr(out.ptr).Ptr(q.ptr).Ptr(kc.ptr).Ptr(vc.ptr).
			Ptr(pos.ptr).I32(is64(pos)).Ptr(seqs.ptr).I32(is64(seqs)).Ptr(tables.ptr).I32(is64(tables)).
			I32(int32(H)).I32(int32(KV)).I32(int32(S)).I32(int32(NB)).I32(int32(BS)).I32(int32(N)).I32(int32(M)).
			F32(scale).I32(int32(window)).Ptr(d.errWord).I32(tm)
	})
	if err != nil {
		return fmt.Errorf("flash prefill: %w", err)
	}
	return nil
}
