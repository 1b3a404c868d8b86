package cuda

import (
	"fmt"
	"strings"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/tensor"
)

// The decode GEMV (kernels/gemv.cu): out[M,N] = x[M,K] · w[N,K]ᵀ for M <= gemvMaxM rows of
// activations and a bf16 weight, streaming the weight with 16-byte loads, for the products
// where cuBLAS's kernels for so few rows stay under HBM bandwidth.

// gemvMaxM is the most rows of x the kernel takes (it is instantiated per M); gemvMaxWarps
// is the kernel's launch bound (256 threads).
const (
	gemvMaxM     = 8
	gemvMaxWarps = 8
)

// gemvConfig is the tiling of one gemv kernel: each warp owns rows weight rows (output
// columns), each lane keeps unroll 16-byte loads per row in flight, and a block has warps
// warps.
type gemvConfig struct {
	rows, unroll, warps int
}

// gemvPlan is one product on the gemv: M rows of x, N weight rows of K, and the tiling.
type gemvPlan struct {
	M, N, K int
	cfg     gemvConfig
}

// Test switches: gemvOff sends every linear to cuBLAS; gemvTiling, when set, replaces
// gemvTilingFor's choice (the tests and the timing sweep).
var (
	gemvOff    bool
	gemvTiling func(M, N int) gemvConfig
)

// gemvTilingFor is the tiling for M rows of x and N weight rows. Measured on an H200
// (TestGemvTimings with LOOM_GEMV_SWEEP=1, graph-replayed µs) on the Llama-3.1-8B decode
// shapes at tp=1 and per GPU at tp=2; what matters most is that the grid fills the GPU in one
// wave of enough warps:
//
//	M=1, N < 8192: one row per warp, 8 loads in flight per lane (qkv 4096->6144 13.9 against
//	  14.7 with 4 loads, o_proj 9.7/10.2, down 14336->4096 28.3/33.4; tp=2: qkv 4096->3072
//	  7.7/9.3, o_proj 2048->4096 5.0/5.2, down 7168->4096 14.8/16.7).
//	M=1, 8192 <= N < 16384: two rows per warp (tp=2 gate_up 4096->14336 27.8 against 29.8).
//	N >= 16384: 4 rows per warp and 4 warps per block (lm_head 4096->128256 233.9, gate_up
//	  4096->28672 54.5; other tilings within 1-2%); at M=2 4 loads in flight per lane
//	  (lm_head 238.8, tp=2 lm_head 4096->64128 120.6, gate_up 55.9).
//	M=2, N <= 4096: one row per warp (o_proj 9.2 against 11.7 with two, down 28.1/36.8;
//	  tp=2: o_proj 5.1/5.8, down 14.6/18.9, qkv 8.0/9.1): 512 blocks or fewer are resident at
//	  once; N 6144 needs 768 and two rows per warp do better (qkv 13.1 against 14.7).
//	M=2, 8192 <= N < 16384: 4 rows per warp, 4 warps (tp=2 gate_up 28.3 against 30.4).
//	M >= 3: two rows per warp (N < 16384), which halves the reads of x.
func gemvTilingFor(M, N int) gemvConfig {
	if gemvTiling != nil {
		return gemvTiling(M, N)
	}
	switch {
	case M == 1 && N < 8192:
		return gemvConfig{rows: 1, unroll: 8, warps: 8}
	case M == 1 && N < 16384:
		return gemvConfig{rows: 2, unroll: 4, warps: 8}
	case M == 2 && N >= 8192:
		return gemvConfig{rows: 4, unroll: 4, warps: 4}
	case N >= 16384:
		return gemvConfig{rows: 4, unroll: 2, warps: 4}
	case M == 2 && N <= 4096:
		return gemvConfig{rows: 1, unroll: 4, warps: 8}
	}
	return gemvConfig{rows: 2, unroll: 4, warps: 8}
}

// gemvFits returns the gemv plan of linear's out[...,N] = x[...,K] · w[N,K]ᵀ (shapes already
// checked, M, N, K > 0) when the kernel can run it: w bf16, x bf16 or f32 with at most
// gemvMaxM rows, K a multiple of 8, and x and w 16-byte aligned (the kernel reads whole
// 16-byte chunks).
func gemvFits(x, w *Tensor) (gemvPlan, bool) {
	if w.DType != tensor.BF16 || (x.DType != tensor.BF16 && x.DType != tensor.F32) {
		return gemvPlan{}, false
	}
	N, K := w.Shape[0], w.Shape[1]
	if K == 0 || N == 0 || K%8 != 0 || x.ptr%16 != 0 || w.ptr%16 != 0 {
		return gemvPlan{}, false
	}
	M := x.Numel() / K
	if M < 1 || M > gemvMaxM || N > 1<<31-1 || K > 1<<31-1 {
		return gemvPlan{}, false
	}
	return gemvPlan{M: M, N: N, K: K, cfg: gemvTilingFor(M, N)}, true
}

// planGemv decides whether linear runs its product on the gemv kernel: when it fits and was
// measured faster than cuBLAS. Measured on an H200 (TestGemvTimings: CUDA-graph replay of
// back-to-back calls, weights rotated beyond L2) on the Llama-3.1-8B decode shapes, at tp=1
// and per GPU at tp=2 (/2), in µs, gemv (gemvTilingFor's tiling) against cuBLAS:
//
//	bf16 x, M=1: qkv 4096->6144 13.9/15.8, o_proj 4096->4096 9.7/12.3, gate_up 4096->28672
//	  54.5/55.6, down 14336->4096 28.3/31.1, lm_head 4096->128256 233.9/246.4; qkv/2
//	  4096->3072 7.7/10.7, o_proj/2 2048->4096 5.0/6.7, gate_up/2 4096->14336 27.8/29.9,
//	  down/2 7168->4096 14.8/18.8, lm_head/2 4096->64128 118.4/129.7: taken.
//	bf16 x, M=2: qkv 13.1/15.1, o_proj 9.2/12.4, down 28.1/31.2, lm_head 238.8/247.3, qkv/2
//	  8.0/10.9, o_proj/2 5.1/6.7, gate_up/2 28.3/29.7, down/2 14.6/19.0, lm_head/2
//	  120.6/129.4: taken; gate_up 55.9/55.7 (16384 <= N < 32768): cuBLAS's.
//	bf16 x, M=4: down/2 17.4/19.4 and o_proj 11.9/12.4 are taken (N <= 4096, 4096 <= K <=
//	  8192); elsewhere cuBLAS's tensor-core kernels, which take 8 rows in the time of one,
//	  win or tie (down 31.3/31.3, o_proj/2 6.9/6.7, qkv 19.7/15.2, lm_head 254.4/248.5).
//	bf16 x, M=8: cuBLAS's everywhere (the gemv at 0.4-0.7x).
//	f32 x, M=1: gate_up 55.5/57.2 and lm_head 233.1/241.2 are taken (N >= 16384, 4 rows per
//	  warp share the rounding of x to bf16); with one row per warp the rounding costs more
//	  than cuBLAS's separate cast: qkv 18.1/16.1, down 38.6/32.3 (o_proj 12.5/13.9 is the
//	  exception, left to cuBLAS).
//
// cuBLAS's small-M kernels stay under HBM bandwidth mostly on the small projections (o_proj
// 2.7 TB/s); both pay about 1 µs per call in a graph (a 4 KB product: gemv 0.8 µs, cuBLAS
// 2.1 µs) plus the ramp and drain of the memory pipeline.
func planGemv(x, w *Tensor) (gemvPlan, bool) {
	if gemvOff {
		return gemvPlan{}, false
	}
	p, ok := gemvFits(x, w)
	if !ok {
		return gemvPlan{}, false
	}
	switch {
	case x.DType == tensor.F32:
		ok = p.M == 1 && p.N >= 16384
	case p.M == 1:
		ok = true
	case p.M == 2:
		ok = p.N < 16384 || p.N >= 32768
	case p.M == 4:
		ok = p.N <= 4096 && p.K >= 4096 && p.K <= 8192
	default:
		ok = false
	}
	return p, ok
}

// gemv runs linear's out[...,N] = x[...,K] · w[N,K]ᵀ on the gemv kernel when planGemv takes
// it and reports whether it did; when it did not, linear goes on to cuBLAS. The shapes must
// have been checked by linear. The device must be locked with its context current.
func gemv(d *Device, out, x, w *Tensor) (bool, error) {
	p, ok := planGemv(x, w)
	if !ok {
		return false, nil
	}
	return true, launchGemv(d, out, x, w, p)
}

// launchGemv queues the gemv kernel of plan p. The launch depends only on the shapes.
func launchGemv(d *Device, out, x, w *Tensor, p gemvPlan) error {
	c := p.cfg
	if c.rows < 1 || c.unroll < 1 || c.warps < 1 || c.warps > gemvMaxWarps {
		return fmt.Errorf("cuda: linear (gemv): bad tiling %+v", c)
	}
	xn := dtypeName(x.DType)
	name := fmt.Sprintf("gemv_%s_m%d_r%d_u%d", xn, p.M, c.rows, c.unroll)
	inst := fmt.Sprintf("GEMV(%s, %d, %d, %d, %s)", name, p.M, c.rows, c.unroll, strings.ToUpper(xn))
	perBlock := c.rows * c.warps
	grid := cubind.Dim3{X: (p.N + perBlock - 1) / perBlock, Y: 1, Z: 1}
	err := d.launchX("gemv.cu", inst, name, grid, cubind.Dim3{X: 32 * c.warps, Y: 1, Z: 1}, 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).Ptr(x.ptr).Ptr(w.ptr).I32(int32(p.N)).I32(int32(p.K))
	})
	return wrap("cuda: linear (gemv)", err)
}
