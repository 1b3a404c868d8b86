package cuda

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/tensor"
)

// The FP8 GEMM of linear_fp8: more than fp8GemvMaxM rows of bf16 x through the H200's FP8
// tensor cores, where the checkpoint asks for FP8 activations (activation_scheme dynamic or
// static) and the weight is float8_e4m3fn with a tensor or channel scale, or 128x128 block
// scales (Hugging Face fp8, DeepSeek-V3 and Qwen3-FP8's format):
//
//	fp8_quant_rows  x[M,K] -> q[M,K] e4m3 and its f32 scales sx, amax/448 of each group of
//	                128 values of a row (token) of x, or of the whole row where K is no
//	                multiple of 128; the weight's scales widened to f32 in sw (kernels/fp8.cu)
//	cublasLtMatmul  out[M,N] (bf16) = Σ_k sx·q[m,k] · sw·w[n,k], f32 sums, in the scale
//	                modes of fp8Scales: VEC128 on both operands (tensor and channel scales,
//	                repeated over the weight's groups of 128 k), VEC128 with BLK128x128
//	                (block scales), or outer vectors (one scale per token and per output row,
//	                where K is no multiple of 128); FAST_ACCUM left off: the tensor cores'
//	                partial sums are promoted to f32
//
// This is what FP8 serving engines run for such checkpoints (dynamic activation scales per
// token, or per token and group of 128 as DeepSeek-V3's): the product reads each weight byte
// once and runs at the FP8 tensor-core rate, where the fallback (dequantize the whole weight
// to bf16 at every step, then cuBLAS) writes and reads it again at twice the size. A static
// activation scheme runs with dynamic scales too: Loom does not load the checkpoint's
// input_scale, and a scale per token or group is never coarser than one per tensor. The
// result differs from linear_fp8's decomposition (which the CPU runs: x in its own dtype
// times the dequantized weight) by the rounding of x to e4m3, at most 2^-4 of each |x_k·w_k|
// (2^-10·sx absolutely for values below e4m3's normal range), and by one rounding of the
// result to bf16. Per 128 k rather than per token: 10,433-10,583 against 9,793 output tok/s
// at 64 concurrent on Llama-3.1-8B --quantize fp8 (H200, docs/PERFORMANCE.md, session 12).
//
// Products the GEMM does not take (f32 x, e5m2 weights, blocks other than 128x128, K or N
// not a multiple of 16 (of 128 for block scales), no cuBLASLt algorithm for the shape)
// dequantize the weight as before. LOOM_CUDA_FP8_GEMM=0 turns the GEMM off.

// fp8GemmOff sends every product of more than fp8GemvMaxM rows to the dequantizing path.
var fp8GemmOff = os.Getenv("LOOM_CUDA_FP8_GEMM") == "0"

// fp8OuterScales keeps tensor- and channel-scaled weights on outer-vector scales (one per
// token of x) where fp8ScalesGroups would take them (LOOM_CUDA_FP8_SCALES=outer).
var fp8OuterScales = os.Getenv("LOOM_CUDA_FP8_SCALES") == "outer"

// fp8Scales is how a product's scales reach cuBLASLt.
type fp8Scales uint8

const (
	// fp8ScalesOuter: one scale per token of x and per output row of the weight (outer
	// vectors).
	fp8ScalesOuter fp8Scales = iota
	// fp8ScalesGroups: one scale per token and group of 128 k of x, the weight's tensor or
	// channel scale repeated over its groups of 128 k (VEC128 on both operands).
	fp8ScalesGroups
	// fp8ScalesBlocks: x's groups as above, one scale per 128x128 block of the weight
	// (VEC128 with BLK128x128).
	fp8ScalesBlocks
)

func (m fp8Scales) String() string {
	return [...]string{"per token and channel", "per 128 k", "128x128 blocks"}[m]
}

// fp8ScalesFor picks the scales of a product with K columns under scheme s.
func fp8ScalesFor(s fp8Scheme, K int) fp8Scales {
	switch {
	case s.kind == 2:
		return fp8ScalesBlocks
	case K%128 == 0 && !fp8OuterScales:
		return fp8ScalesGroups
	}
	return fp8ScalesOuter
}

// fp8GemmKey identifies an FP8 GEMM shape: out[M,N] = q[M,K]·w[N,K]ᵀ, the operands'
// common pointer alignment and the scales.
type fp8GemmKey struct {
	M, N, K int
	align   uint32
	scales  fp8Scales
}

func (k fp8GemmKey) String() string {
	return fmt.Sprintf("fp8 M=%d K=%d N=%d, %d-byte aligned, scales %s", k.M, k.K, k.N, k.align, k.scales)
}

// fp8GemmPlan is a shape's cuBLASLt descriptors and algorithm; prob is nil when cuBLASLt
// offers none (the shape then dequantizes).
type fp8GemmPlan struct {
	prob *gemmProblem
	algo cubind.MatmulAlgo
	why  string // why prob is nil
}

// fp8GemmFits tells whether the GEMM takes a product of M rows of x (shapes already
// checked by linearFP8), and if not, why.
func fp8GemmFits(x, w *Tensor, s fp8Scheme, act string, M, N, K int) error {
	switch {
	case fp8GemmOff:
		return errors.New("LOOM_CUDA_FP8_GEMM=0")
	case act != "dynamic" && act != "static":
		return fmt.Errorf("activation_scheme %q: the checkpoint keeps activations unquantized", act)
	case M <= fp8GemvMaxM:
		return fmt.Errorf("%d rows take the GEMV", M)
	case x.DType != tensor.BF16:
		return fmt.Errorf("x is %s, not bf16", x.DType)
	case w.DType != tensor.F8E4M3:
		return fmt.Errorf("the weight is %s, not f8e4m3", w.DType)
	case s.kind == 2 && (s.bn != 128 || s.bk != 128):
		return fmt.Errorf("blocks of %dx%d (the GEMM takes 128x128)", s.bn, s.bk)
	case s.kind == 2 && K%128 != 0:
		return fmt.Errorf("under block scales the inner dimension K=%d must be a multiple of 128", K)
	case K%16 != 0 || N%16 != 0:
		return fmt.Errorf("the dimensions K=%d and N=%d must be multiples of 16", K, N)
	case x.ptr%16 != 0 || w.ptr%16 != 0:
		return errors.New("x or the weight is not 16-byte aligned")
	}
	return nil
}

// fp8GemmWorkspace is the bytes the GEMM needs for M rows of K and N outputs: q, then x's
// scales and the weight's f32 scales (room for both schemes: one per row or per group of
// 128 of a row, one per output row or per 128x128 block), then, where VEC128 scales of x
// pad its rows, the padded product; each from a 256-byte boundary.
func fp8GemmWorkspace(M, N, K int) int64 {
	rows := fp8BlockRows(M)
	sx, sw := fp8ScaleCounts(M, N, K)
	n := roundUp256(int64(rows)*int64(K)) + roundUp256(4*int64(sx)) + roundUp256(4*int64(sw))
	if rows != M {
		n += roundUp256(2 * int64(rows) * int64(N))
	}
	return n
}

// fp8BlockRows is the rows of a product of M rows of x with VEC128 scales of x (groups or
// blocks): cuBLASLt's heuristic offers those only for a multiple of 4 rows (H200, cuBLAS
// 13.1), so the product runs on zero rows up to one and its first M rows are copied out.
func fp8BlockRows(M int) int { return (M + 3) &^ 3 }

// fp8ScaleCounts is the most f32 scales of x and of the weight a product can need.
func fp8ScaleCounts(M, N, K int) (sx, sw int) {
	groups, blocks := (K+127)/128, (N+127)/128
	return fp8BlockRows(M) * max(1, groups), max(N*max(1, groups), blocks*fp8BlockScaleLD(K))
}

// fp8BlockScaleLD is the distance between two rows of a weight's block scales as cuBLASLt's
// BLK128x128 mode reads them: ceil(K/128) rounded up to a multiple of 4 (16 bytes). An H200
// run gave wrong products for N=400, K=384 (3 blocks a row) with unpadded rows.
func fp8BlockScaleLD(K int) int { return ((K+127)/128 + 3) &^ 3 }

func roundUp256(n int64) int64 { return (n + 255) &^ 255 }

// fp8Gemm queues linear_fp8's product through the FP8 GEMM, or reports false (no error)
// when cuBLASLt has no algorithm for the shape. ws holds at least fp8GemmWorkspace bytes.
func fp8Gemm(d *Device, out, x, w, scale, ws *Tensor, s fp8Scheme, M, N, K int) (bool, error) {
	mode := fp8ScalesFor(s, K)
	rows := M
	if mode != fp8ScalesOuter {
		rows = fp8BlockRows(M)
	}
	nsx, nsw := fp8ScaleCounts(M, N, K)
	q := ws.ptr
	sx := q + cubind.DevicePtr(roundUp256(int64(fp8BlockRows(M))*int64(K)))
	sw := sx + cubind.DevicePtr(roundUp256(4*int64(nsx)))
	dst := out.ptr
	if rows != M {
		dst = sw + cubind.DevicePtr(roundUp256(4*int64(nsw)))
	}
	key := fp8GemmKey{M: rows, N: N, K: K, align: ptrAlign(dst, q, w.ptr), scales: mode}
	t := tuner(d)
	if t.ltErr != nil {
		return false, nil
	}
	p, ok := t.fp8[key]
	if !ok {
		p = newFP8GemmPlan(d, key)
		if p.prob == nil {
			// Said once a device at Info (a shape a bucket follows), then at Debug.
			level := slog.LevelDebug
			if !t.fp8Refused {
				level, t.fp8Refused = slog.LevelInfo, true
			}
			slog.Log(context.Background(), level, "cuda: no cuBLASLt FP8 algorithm; the product dequantizes its weight", "shape", key, "why", p.why)
		}
		t.fp8[key] = p
	}
	if p.prob == nil {
		return false, nil
	}
	if err := fp8QuantRows(d, q, sx, sw, x, scale, s, mode, M, rows, N, K); err != nil {
		return false, err
	}
	desc := p.prob.desc
	if err := desc.SetPointer(cubind.MatmulDescAScalePtr, sw); err != nil {
		return false, fmt.Errorf("cuda: linear_fp8 (%s): %w", key, err)
	}
	if err := desc.SetPointer(cubind.MatmulDescBScalePtr, sx); err != nil {
		return false, fmt.Errorf("cuda: linear_fp8 (%s): %w", key, err)
	}
	err := t.lt.Matmul(desc, 1, w.ptr, p.prob.a, q, p.prob.b, 0, dst, p.prob.c, dst, p.prob.c,
		&p.algo, d.blasWork.ptr, blasWorkspaceBytes, d.stream)
	if err != nil {
		return false, fmt.Errorf("cuda: linear_fp8 (cuBLASLt %s): %w", key, err)
	}
	if dst != out.ptr {
		if err := d.copyDtoD(out.ptr, dst, uint64(2*M*N)); err != nil {
			return false, fmt.Errorf("cuda: linear_fp8 (%s): %w", key, err)
		}
	}
	return true, nil
}

// fp8QuantRows queues fp8_quant_rows: q[rows,K] (rows from M on zero), x's scales sx and
// the weight's f32 scales sw (see fp8GemmWorkspace) from x[M,K] and the weight's scale.
func fp8QuantRows(d *Device, q, sx, sw cubind.DevicePtr, x, scale *Tensor, s fp8Scheme, mode fp8Scales, M, rows, N, K int) error {
	groups := mode != fp8ScalesOuter
	name := "fp8_quant_rows_" + dtypeName(scale.DType)
	if groups {
		name += "_g128"
	}
	inst := fmt.Sprintf("FP8_QUANT_ROWS(%s, %s, %v)", name, fp8Trait(scale.DType), groups)
	// Group scales: the rows' scales of one group of 128 k side by side (sx[g*rows + m]);
	// the weight's as many times over (sw[g*N + n]); block scales as the checkpoint stores
	// them ([ceil(N/128), ceil(K/128)] row-major), each row padded to fp8BlockScaleLD.
	// These are the orders cuBLASLt's VEC128 and BLK128x128 modes read for this A (K×N,
	// transposed) and B (K×rows): of the four combinations of x's and the blocks' orders and
	// their transposes, only this one gave TestFP8Gemm's exact product on an H200.
	ms, gs, nsw, ld := 1, 0, N, N
	switch mode {
	case fp8ScalesGroups:
		gs, nsw = rows, K/128*N
	case fp8ScalesBlocks:
		ld = fp8BlockScaleLD(K)
		gs, nsw = rows, (N+127)/128*ld
	}
	grid := cubind.Dim3{X: rows + (nsw+255)/256, Y: 1, Z: 1}
	err := d.launchX("fp8.cu", inst, name, grid, block256, 0, func(a *cubind.Args) {
		a.Ptr(q).Ptr(sx).Ptr(sw).Ptr(x.ptr).Ptr(scale.ptr).I32(int32(M)).I32(int32(rows)).I32(int32(K)).
			I32(int32(ms)).I32(int32(gs)).I32(int32(nsw)).I32(int32(s.kind)).I32(int32(ld))
	})
	return wrap("cuda: linear_fp8 (quantize x)", err)
}

// newFP8GemmPlan describes shape key to cuBLASLt: A the column-major K×N view of the e4m3
// weight (transposed), B the K×M view of q, C = D the N×M bf16 view of out, the scale
// modes of the key's scheme, and takes the heuristic's first algorithm.
func newFP8GemmPlan(d *Device, key fp8GemmKey) *fp8GemmPlan {
	t := d.gemmTune
	p, err := newLtProblem(cubind.R8E4M3, cubind.R16BF, key.M, key.N, key.K)
	if err != nil {
		return &fp8GemmPlan{why: err.Error()}
	}
	fail := func(err error) *fp8GemmPlan {
		return &fp8GemmPlan{why: errors.Join(err, p.destroy()).Error()}
	}
	aMode, bMode := cubind.ScaleOuterVec32F, cubind.ScaleOuterVec32F
	switch key.scales {
	case fp8ScalesGroups:
		aMode, bMode = cubind.ScaleVec128_32F, cubind.ScaleVec128_32F
	case fp8ScalesBlocks:
		aMode, bMode = cubind.ScaleBlk128x128_32F, cubind.ScaleVec128_32F
	}
	if err := p.desc.SetInt32(cubind.MatmulDescAScaleMode, int32(aMode)); err != nil {
		return fail(err)
	}
	if err := p.desc.SetInt32(cubind.MatmulDescBScaleMode, int32(bMode)); err != nil {
		return fail(err)
	}
	// The heuristic refuses vector and block scale modes (CUBLAS_STATUS_INVALID_VALUE, H200,
	// cuBLAS 13.1) until both scale pointers are set: any device address serves here, and
	// fp8Gemm sets the real ones before each product.
	for _, a := range []cubind.MatmulDescAttribute{cubind.MatmulDescAScalePtr, cubind.MatmulDescBScalePtr} {
		if err := p.desc.SetPointer(a, d.blasWork.ptr); err != nil {
			return fail(err)
		}
	}
	pref, err := ltPreference(key.align)
	if err != nil {
		return fail(err)
	}
	defer pref.Destroy()
	algos, err := t.lt.AlgoGetHeuristic(p.desc, p.a, p.b, p.c, p.c, pref, 1)
	if err != nil {
		return fail(err)
	}
	if len(algos) == 0 {
		return fail(errors.New("the heuristic proposes no algorithm"))
	}
	return &fp8GemmPlan{prob: p, algo: algos[0].Algo}
}
