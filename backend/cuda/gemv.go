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
// (TestGemvTimings with LOOM_GEMV_SWEEP=1): for N of 16384 and more, 4 rows per warp and 4
// warps per block stream best (M=1: lm_head 128256x4096 230.6 µs against 239.7 with one row
// per warp, gate_up 54.3 against 58.2); below that the grid needs more warps: one row per
// warp at M=1 (o_proj 4096x4096 10.7 µs against 12.8 with 4 rows), two rows per warp from
// M=2, which halves the reads of x (M=2: qkv 6144x4096 14.4 µs against 19.5 with one row).
func gemvTilingFor(M, N int) gemvConfig {
	if gemvTiling != nil {
		return gemvTiling(M, N)
	}
	switch {
	case N >= 16384:
		return gemvConfig{rows: 4, unroll: 2, warps: 4}
	case M >= 2:
		return gemvConfig{rows: 2, unroll: 4, warps: 8}
	}
	return gemvConfig{rows: 1, unroll: 4, warps: 8}
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
// back-to-back calls, weights rotated beyond L2) on the Llama-3.1-8B decode shapes, in µs,
// gemv against cuBLAS:
//
//	bf16 x, M=1: qkv 4096->6144 14.2/14.3, o_proj 4096->4096 10.7/12.3, gate_up 4096->28672
//	  54.4/55.3, down 14336->4096 30.5/30.4, lm_head 4096->128256 230.6/239.2: taken.
//	bf16 x, M=2: qkv 14.4/15.2, o_proj 11.0/12.3: taken (N < 16384, K <= 4096); gate_up
//	  57.9/54.4, down 31.7/30.4: cuBLAS's; lm_head 236.2/241.3 is within the noise: cuBLAS's.
//	f32 x, M=1: gate_up 55.5/57.2 and lm_head 233.1/241.2 are taken (N >= 16384, 4 rows per
//	  warp share the rounding of x to bf16); with one row per warp the rounding costs more
//	  than cuBLAS's separate cast: qkv 18.1/16.1, down 38.6/32.3 (o_proj 12.5/13.9 is the
//	  exception, left to cuBLAS).
//	M >= 4: the gemv does M FMAs per weight on the CUDA cores and falls behind cuBLAS's
//	  tensor-core kernels, which take 8 rows in the time of one (M=4: 0.68-1.00x of cuBLAS,
//	  M=8: 0.54-0.66x).
//
// cuBLAS's small-M kernels stay under HBM bandwidth mostly on the small projections (o_proj
// 2.7 TB/s); both pay about 1 µs per call in a graph (a 4 KB product: gemv 1.1 µs, cuBLAS
// 2.0 µs) plus the ramp and drain of the memory pipeline.
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
		ok = p.N < 16384 && p.K <= 4096
	default:
		ok = false
	}
	return p, ok
}

// gemv runs linear's out[...,N] = x[...,K] · w[N,K]ᵀ on the gemv kernel when planGemv takes
// it and reports whether it did; when it did not, linear goes on to cuBLAS. The shapes must
// have been checked by linear. The device must be locked with its context current.
func (d *Device) gemv(out, x, w *Tensor) (bool, error) {
	p, ok := planGemv(x, w)
	if !ok {
		return false, nil
	}
	return true, d.launchGemv(out, x, w, p)
}

// launchGemv queues the gemv kernel of plan p. The launch depends only on the shapes.
func (d *Device) launchGemv(out, x, w *Tensor, p gemvPlan) error {
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
