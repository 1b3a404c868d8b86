package cuda

import (
	"fmt"
	"log/slog"
	"math/bits"
	"slices"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// FP8 weights (graph/catalog_quant.go; kernels/fp8.cu): dequantize_fp8 and linear_fp8 on the
// GPU. A weight w[N,K] is f8e4m3 or f8e5m2 (one byte a value) with a scale of the tensor,
// channel or block scheme, stored f32, bf16 or f16.
//
//	DequantizeFP8  decode(w) * scale in f32, rounded to the output's dtype (f32, bf16 or f16):
//	               bit for bit backend/cpu's reference kernel.
//	LinearFP8      x[...,K] · dequantize(w, scale)ᵀ -> [...,N] of x's dtype (bf16 or f32):
//	               for at most fp8GemvMaxM rows of x the FP8 GEMV (half the bytes of the bf16
//	               GEMV's weights; the scale applied to its f32 sums, see kernels/fp8.cu), its
//	               exact per-weight form where K, the alignment or the block do not fit the
//	               16-byte loads; for more rows the weight is dequantized to x's dtype into the
//	               step's workspace and multiplied as linear does (cuBLAS).
//
// The decode GEMV takes the bf16 GEMV's tiling (gemvTilingFor), but for one row of x: two
// rows per warp (each x value read and widened serves two weight rows), and for N <= 2048
// one row per warp in blocks of 4 warps (a k or v projection of 1024 rows still fills the
// GPU). Not measured against other tilings yet.

// fp8GemvMaxM is the most rows of x the FP8 GEMV takes; more go through a dequantized
// weight and cuBLAS.
const fp8GemvMaxM = 8

// fp8Scheme is a weight's scaling: graph.QuantTensor (0), QuantChannel (1) or QuantBlock (2)
// with bn x bk blocks.
type fp8Scheme struct {
	kind   int
	bn, bk int
}

// newFP8Scheme reads a scheme and its block ([rows, cols], block scheme only).
func newFP8Scheme(scheme string, block []int) (fp8Scheme, error) {
	switch scheme {
	case graph.QuantTensor:
		return fp8Scheme{kind: 0, bn: 1, bk: 1}, nil
	case graph.QuantChannel:
		return fp8Scheme{kind: 1, bn: 1, bk: 1}, nil
	case graph.QuantBlock:
		if len(block) != 2 || block[0] < 1 || block[1] < 1 {
			return fp8Scheme{}, fmt.Errorf("the block scheme needs block = [rows, cols], both positive, got %v", block)
		}
		return fp8Scheme{kind: 2, bn: block[0], bk: block[1]}, nil
	}
	return fp8Scheme{}, fmt.Errorf("unknown fp8 scheme %q (want tensor, channel or block)", scheme)
}

func fp8SchemeOf(n *graph.Node) (fp8Scheme, error) {
	return newFP8Scheme(n.Attrs.String("scheme"), n.Attrs.Ints("block"))
}

func (s fp8Scheme) name() string { return [...]string{"tensor", "channel", "block"}[s.kind] }

// kb is the number of block columns of a weight of K columns.
func (s fp8Scheme) kb(K int) int { return (K + s.bk - 1) / s.bk }

// fp8Names returns the kernel suffixes of a weight dtype and scale dtype, checking both.
func fp8Names(w, scale *Tensor) (wn, sn string, err error) {
	if !w.DType.IsFloat8() || len(w.Shape) != 2 {
		return "", "", fmt.Errorf("the weight must be a 2-D f8e4m3 or f8e5m2 matrix, got %s%v", w.DType, w.Shape)
	}
	switch scale.DType {
	case tensor.F32, tensor.BF16, tensor.F16:
	default:
		return "", "", fmt.Errorf("the scale must be f32, bf16 or f16, got %s", scale.DType)
	}
	return map[tensor.DType]string{tensor.F8E4M3: "e4m3", tensor.F8E5M2: "e5m2"}[w.DType], dtypeName(scale.DType), nil
}

// checkFP8Scale checks that scale has the number of values scheme s wants for w[N,K].
func checkFP8Scale(s fp8Scheme, w, scale *Tensor) error {
	N, K := w.Shape[0], w.Shape[1]
	want, err := graph.FP8ScaleShape(s.name(), N, K, []int{s.bn, s.bk})
	if err != nil {
		return err
	}
	if scale.Numel() != tensor.Numel(want) {
		return fmt.Errorf("scale %v does not fit weight %v under the %s scheme (want %v)", scale.Shape, w.Shape, s.name(), want)
	}
	return nil
}

// fp8Trait is the kernel trait of an element dtype (common.cuh, fp8.cu).
func fp8Trait(dt tensor.DType) string {
	switch dt {
	case tensor.BF16:
		return "BF16"
	case tensor.F16:
		return "Half16"
	}
	return "F32"
}

func fp8IsE4M3(dt tensor.DType) string {
	if dt == tensor.F8E4M3 {
		return "true"
	}
	return "false"
}

func init() {
	opKernels["dequantize_fp8"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		s, err := fp8SchemeOf(n)
		if err != nil {
			return fmt.Errorf("cuda: dequantize_fp8: %w", err)
		}
		return dequantizeFP8(d, out[0], in[0], in[1], s)
	}}
	opKernels["linear_fp8"] = &opKernel{
		supports: func(n *graph.Node) error {
			if dt := n.Inputs[0].Type.DType; dt != tensor.BF16 && dt != tensor.F32 {
				return fmt.Errorf("x is %s; the FP8 kernels take bf16 or f32", dt)
			}
			return nil
		},
		workspace: linearFP8Workspace,
		run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
			s, err := fp8SchemeOf(n)
			if err != nil {
				return fmt.Errorf("cuda: linear_fp8: %w", err)
			}
			var ws *Tensor
			if len(out) > len(n.Outputs) {
				ws = out[len(n.Outputs)]
			}
			return linearFP8(d, out[0], in[0], in[1], in[2], ws, s, n.Attrs.String("activation_scheme"))
		},
	}
}

// linearFP8Workspace is, when x has more rows than the FP8 GEMV takes, the bytes of the
// dequantized weight [N,K] in x's dtype, or the FP8 GEMM's if more (the GEMM falls back to
// dequantizing where cuBLASLt has no algorithm); else none.
func linearFP8Workspace(n *graph.Node, in [][]int) int64 {
	x, w := in[0], in[1]
	if len(x) < 1 || len(w) != 2 || x[len(x)-1] == 0 {
		return 0
	}
	M := tensor.Numel(x) / x[len(x)-1]
	if M <= fp8GemvMaxM {
		return 0
	}
	return max(int64(w[0])*int64(w[1])*int64(n.Inputs[0].Type.DType.Size()), fp8GemmWorkspace(M, w[0], w[1]))
}

// DequantizeFP8 runs graph op dequantize_fp8: out[N,K] (f32, bf16 or f16) = decode(w[N,K]) *
// scale under scheme ("tensor", "channel" or "block" with block = [bn, bk]); scale is f32,
// bf16 or f16 of the shape graph.FP8ScaleShape gives.
func DequantizeFP8(d *Device, out, w, scale *Tensor, scheme string, block []int) error {
	s, err := newFP8Scheme(scheme, block)
	if err != nil {
		return fmt.Errorf("cuda: dequantize_fp8: %w", err)
	}
	return d.do(func() error { return dequantizeFP8(d, out, w, scale, s) })
}

func dequantizeFP8(d *Device, out, w, scale *Tensor, s fp8Scheme) error {
	if err := checkLive(out, w, scale); err != nil {
		return fmt.Errorf("cuda: dequantize_fp8: %w", err)
	}
	wn, sn, err := fp8Names(w, scale)
	if err != nil {
		return fmt.Errorf("cuda: dequantize_fp8: %w", err)
	}
	if err := checkFP8Scale(s, w, scale); err != nil {
		return fmt.Errorf("cuda: dequantize_fp8: %w", err)
	}
	switch out.DType {
	case tensor.F32, tensor.BF16, tensor.F16:
	default:
		return fmt.Errorf("cuda: dequantize_fp8: the output is %s; want f32, bf16 or f16", out.DType)
	}
	if err := checkOut("dequantize_fp8 output", out, out.DType, w.Shape); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	N, K := w.Shape[0], w.Shape[1]
	if N == 0 || K == 0 {
		return nil
	}
	if N > 1<<31-1 || K > 1<<31-1 {
		return fmt.Errorf("cuda: dequantize_fp8: weight %v exceeds 32-bit sizes", w.Shape)
	}
	on := dtypeName(out.DType)
	name := fmt.Sprintf("dequant_fp8_%s_%s_%s", wn, sn, on)
	inst := fmt.Sprintf("DEQUANT_FP8(%s, %s, %s, %s)", name, fp8IsE4M3(w.DType), fp8Trait(out.DType), fp8Trait(scale.DType))
	grid := cubind.Dim3{X: (K + 255) / 256, Y: min(N, 65535), Z: 1}
	err = d.launchX("fp8.cu", inst, name, grid, block256, 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).Ptr(w.ptr).Ptr(scale.ptr).I32(int32(N)).I32(int32(K)).I32(int32(s.kind)).
			I32(int32(s.bn)).I32(int32(s.bk)).I32(int32(s.kb(K)))
	})
	return wrap("cuda: dequantize_fp8", err)
}

// LinearFP8 runs graph op linear_fp8: out[...,N] = x[...,K] · dequantize_fp8(w[N,K], scale)ᵀ
// in x's dtype (bf16 or f32), scheme and block as for DequantizeFP8, activation its
// activation_scheme (none, dynamic or static: see fp8_gemm.go for what the GPU makes of
// the last two). ws is the workspace for more than fp8GemvMaxM rows of x: at least
// linearFP8Workspace's bytes (nil otherwise).
func LinearFP8(d *Device, out, x, w, scale, ws *Tensor, scheme string, block []int, activation string) error {
	s, err := newFP8Scheme(scheme, block)
	if err != nil {
		return fmt.Errorf("cuda: linear_fp8: %w", err)
	}
	return d.do(func() error { return linearFP8(d, out, x, w, scale, ws, s, activation) })
}

// warnFP8Batches logs fp8BatchWarning's warning, if any, for graph g on a GPU of compute
// capability major.minor.
func warnFP8Batches(g *graph.Graph, major, minor int) {
	if msg, attrs := fp8BatchWarning(g, major, minor); msg != "" {
		slog.Warn(msg, attrs...)
	}
}

// fp8BatchWarning says what steps of more than fp8GemvMaxM rows cost a graph with FP8
// linears that the FP8 GEMM cannot take, on a GPU of compute capability major.minor: on a
// GPU without FP8 tensor cores (before sm_89) every such linear, and elsewhere those whose
// checkpoint keeps activations unquantized or whose weights are e5m2 or in blocks other
// than 128x128, dequantize their whole weight into the workspace at every step before
// cuBLAS, slower than bf16 weights. It returns "" when there is nothing to say.
func fp8BatchWarning(g *graph.Graph, major, minor int) (string, []any) {
	for _, n := range g.Nodes {
		if n.Op != "linear_fp8" {
			continue
		}
		attrs := []any{"gemv_max_rows", fp8GemvMaxM, "example", n.Inputs[1].Name, "scheme", n.Attrs.String("scheme"),
			"activation_scheme", n.Attrs.String("activation_scheme")}
		if major*10+minor < 89 {
			return fmt.Sprintf("cuda: sm_%d%d has no FP8 tensor cores: FP8 linears run a GEMV up to a few rows a step and dequantize their weight at larger steps, slower than bf16 weights", major, minor), attrs
		}
		s, err := fp8SchemeOf(n)
		act := n.Attrs.String("activation_scheme")
		if err != nil || (s.kind == 2 && (s.bn != 128 || s.bk != 128)) || n.Inputs[1].Type.DType != tensor.F8E4M3 || (act != "dynamic" && act != "static") {
			return "cuda: some FP8 linears run a GEMV up to a few rows a step and dequantize their weight at larger steps, slower than bf16 weights (the FP8 GEMM takes e4m3 weights with tensor, channel or 128x128 block scales whose checkpoint asks for FP8 activations)", attrs
		}
	}
	return "", nil
}

func linearFP8(d *Device, out, x, w, scale, ws *Tensor, s fp8Scheme, act string) error {
	if err := checkLive(out, x, w, scale); err != nil {
		return fmt.Errorf("cuda: linear_fp8: %w", err)
	}
	if _, _, err := fp8Names(w, scale); err != nil {
		return fmt.Errorf("cuda: linear_fp8: %w", err)
	}
	if err := checkFP8Scale(s, w, scale); err != nil {
		return fmt.Errorf("cuda: linear_fp8: %w", err)
	}
	if x.DType != tensor.BF16 && x.DType != tensor.F32 {
		return fmt.Errorf("cuda: linear_fp8: x is %s; want bf16 or f32", x.DType)
	}
	if len(x.Shape) < 1 || x.Shape[len(x.Shape)-1] != w.Shape[1] {
		return fmt.Errorf("cuda: linear_fp8: x %v does not fit weight %v ([N,K])", x.Shape, w.Shape)
	}
	N, K := w.Shape[0], w.Shape[1]
	M := tensor.Numel(x.Shape[:len(x.Shape)-1])
	if err := checkOut("linear_fp8 output", out, x.DType, append(slices.Clone(x.Shape[:len(x.Shape)-1]), N)); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if M == 0 || N == 0 {
		return nil
	}
	if K == 0 {
		return wrap("cuda: linear_fp8", d.memset8(out.ptr, 0, uint64(out.Bytes())))
	}
	if max(M, N, K) > 1<<31-1 {
		return fmt.Errorf("cuda: linear_fp8: %dx%dx%d exceeds 32-bit sizes", M, N, K)
	}
	if M <= fp8GemvMaxM {
		return fp8Gemv(d, out, x, w, scale, s, M)
	}
	if fp8GemmFits(x, w, s, act, M, N, K) == nil {
		if ws == nil || int64(ws.Bytes()) < fp8GemmWorkspace(M, N, K) {
			return fmt.Errorf("cuda: linear_fp8: %d rows of x need %d bytes of workspace for the FP8 GEMM", M, fp8GemmWorkspace(M, N, K))
		}
		if done, err := fp8Gemm(d, out, x, w, scale, ws, s, M, N, K); done || err != nil {
			return err
		}
	}
	need := N * K * x.DType.Size()
	if ws == nil || ws.Bytes() < need {
		return fmt.Errorf("cuda: linear_fp8: %d rows of x need %d bytes of workspace for the dequantized weight", M, need)
	}
	wd := workspaceTensor(ws, x.DType, []int{N, K})
	if err := dequantizeFP8(d, wd, w, scale, s); err != nil {
		return err
	}
	return linear(d, out, x, wd)
}

// fp8GemvPlan is one product on the FP8 GEMV: the fast kernel with tiling cfg, or (generic)
// the exact per-weight one.
type fp8GemvPlan struct {
	generic bool
	cfg     gemvConfig
	bkshift int // block scheme: log2(bk)
}

// planFP8Gemv picks the kernel for M rows of x: the fast one when K is a multiple of 16,
// x and w are 16-byte aligned, and a block scheme's bk is a power of two of at least 16 (a
// 16-byte chunk then lies in one block).
func planFP8Gemv(x, w *Tensor, s fp8Scheme, M int) fp8GemvPlan {
	N, K := w.Shape[0], w.Shape[1]
	if K%16 != 0 || x.ptr%16 != 0 || w.ptr%16 != 0 || (s.kind == 2 && (s.bk < 16 || s.bk&(s.bk-1) != 0)) {
		return fp8GemvPlan{generic: true}
	}
	cfg := gemvTilingFor(M, N)
	switch {
	case M == 1 && N <= 2048:
		cfg = gemvConfig{rows: 1, unroll: 8, warps: 4}
	case M == 1 && cfg.rows == 1:
		cfg = gemvConfig{rows: 2, unroll: 4, warps: 8}
	}
	return fp8GemvPlan{cfg: cfg, bkshift: bits.TrailingZeros(uint(s.bk))}
}

// fp8Gemv queues the FP8 GEMV for M <= fp8GemvMaxM rows of x (shapes checked by linearFP8).
func fp8Gemv(d *Device, out, x, w, scale *Tensor, s fp8Scheme, M int) error {
	return launchFP8Gemv(d, out, x, w, scale, s, M, planFP8Gemv(x, w, s, M))
}

// launchFP8Gemv queues the FP8 GEMV of plan p.
func launchFP8Gemv(d *Device, out, x, w, scale *Tensor, s fp8Scheme, M int, p fp8GemvPlan) error {
	wn, sn, _ := fp8Names(w, scale)
	xn := dtypeName(x.DType)
	N, K := w.Shape[0], w.Shape[1]
	if p.generic {
		name := fmt.Sprintf("fp8_gemv_generic_%s_%s_%s_m%d", xn, wn, sn, M)
		inst := fmt.Sprintf("FP8_GEMV_GENERIC(%s, %d, %s, %s, %s)", name, M, fp8Trait(x.DType), fp8IsE4M3(w.DType), fp8Trait(scale.DType))
		grid := cubind.Dim3{X: (N + 7) / 8, Y: 1, Z: 1}
		err := d.launchX("fp8.cu", inst, name, grid, block256, 0, func(a *cubind.Args) {
			a.Ptr(out.ptr).Ptr(x.ptr).Ptr(w.ptr).Ptr(scale.ptr).I32(int32(N)).I32(int32(K)).I32(int32(s.kind)).
				I32(int32(s.bn)).I32(int32(s.bk)).I32(int32(s.kb(K)))
		})
		return wrap("cuda: linear_fp8 (gemv)", err)
	}
	c := p.cfg
	if c.rows < 1 || c.unroll < 1 || c.warps < 1 || c.warps > gemvMaxWarps {
		return fmt.Errorf("cuda: linear_fp8 (gemv): bad tiling %+v", c)
	}
	block := s.kind == 2
	kind := map[bool]string{false: "c", true: "b"}[block]
	name := fmt.Sprintf("fp8_gemv_%s_%s_%s_%s_m%d_r%d_u%d", xn, wn, sn, kind, M, c.rows, c.unroll)
	inst := fmt.Sprintf("FP8_GEMV(%s, %d, %d, %d, %s, %s, %s, %v)", name, M, c.rows, c.unroll, fp8Trait(x.DType),
		fp8IsE4M3(w.DType), fp8Trait(scale.DType), block)
	perBlock := c.rows * c.warps
	grid := cubind.Dim3{X: (N + perBlock - 1) / perBlock, Y: 1, Z: 1}
	err := d.launchX("fp8.cu", inst, name, grid, cubind.Dim3{X: 32 * c.warps, Y: 1, Z: 1}, 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).Ptr(x.ptr).Ptr(w.ptr).Ptr(scale.ptr).I32(int32(N)).I32(int32(K)).I32(int32(s.kind)).
			I32(int32(s.bn)).I32(int32(p.bkshift)).I32(int32(s.kb(K)))
	})
	return wrap("cuda: linear_fp8 (gemv)", err)
}
