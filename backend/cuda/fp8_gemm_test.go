package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// TestFP8Gemm checks linear_fp8's FP8 GEMM (fp8_gemm.go) three ways, for tensor and
// channel scales in f32, f16 and bf16 and 128x128 block scales, on shapes of 9 to 200 rows:
//   - fp8_quant_rows bit for bit against the same quantization on the host (q, x's scales,
//     the weight's f32 scales);
//   - the product against Σ sx·q · sw·w computed exactly in float64 from those bytes: within
//     2^-8 of the result (its rounding to bf16) plus 2^-11 of Σ|sx·q·sw·w| (the tensor
//     cores' f32 sums, promoted every few k-steps, in their own order);
//   - the product against the CPU's linear_fp8 (x unquantized, the weight dequantized),
//     within the error of rounding x to e4m3: 2^-4 of each |x_k·w_k| (2^-10·sx of |w_k|
//     absolutely for values below e4m3's normal range), 2^-7 of the CPU's bf16 result and
//     2^-11 of Σ|x·w| for the sums.
//
// Rows of x include one of zeros (scale 1) and one with a single large value (the others
// fall to e4m3's subnormals). The test fails when cuBLASLt offers no FP8 algorithm.
func TestFP8Gemm(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(83, 83))
	blk := func(n, k int) []int { return []int{(n + 127) / 128, (k + 127) / 128} }
	cases := []fp8SchemeCase{
		{"tensor", nil, tensor.F32, func(int, int) []int { return []int{1} }},
		{"tensor", nil, tensor.F16, func(int, int) []int { return []int{} }},
		{"channel", nil, tensor.F32, func(n, _ int) []int { return []int{n, 1} }},
		{"channel", nil, tensor.BF16, func(n, _ int) []int { return []int{n} }},
		{"block", []int{128, 128}, tensor.F32, blk},
		{"block", []int{128, 128}, tensor.BF16, blk},
	}
	for _, sc := range cases {
		for _, mnk := range [][3]int{{9, 64, 128}, {17, 256, 512}, {64, 1024, 4096}, {200, 48, 1280}, {33, 400, 384}, {64, 256, 768}, {20, 48, 80}} {
			if sc.scheme == "block" && mnk[2]%128 != 0 {
				continue // dequantizes (TestFP8GemmFits, TestLinearFP8)
			}
			checkFP8Gemm(t, d, rng, sc, mnk[0], mnk[1], mnk[2])
		}
	}
}

// checkFP8Gemm runs one product through LinearFP8 with activation_scheme dynamic and checks
// it as TestFP8Gemm describes.
func checkFP8Gemm(t *testing.T, d *Device, rng *rand.Rand, sc fp8SchemeCase, M, N, K int) {
	t.Helper()
	name := fmt.Sprintf("M=%d N=%d K=%d %s", M, N, K, sc)
	wh := randFP8(rng, tensor.F8E4M3, []int{N, K}, true)
	sh := randScale(rng, sc.sdt, sc.shape(N, K))
	xf := randTensor(rng, tensor.F32, []int{M, K}, -1, 1).Float32s()
	for k := range K {
		xf[K+k] = 0 // row 1: zeros
	}
	xf[2*K+K/2] = 1e4 // row 2: one outlier
	xh := tensor.FromF32(xf, M, K).Cast(tensor.BF16)
	dev := up(t, d, xh, wh, sh)
	ws := like(t, d, tensor.New(tensor.Bool, int(fp8GemmWorkspace(M, N, K))))[0]
	attrs := fp8Attrs(sc)
	attrs["activation_scheme"] = "dynamic"
	want := cpuOp(t, "linear_fp8", attrs, xh, wh, sh)[0]
	out := like(t, d, want)[0]
	if err := LinearFP8(d, out, dev[0], dev[1], dev[2], ws, sc.scheme, sc.block, "dynamic"); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	mode := fp8ScalesFor(mustScheme(t, sc), K)
	rows := M
	if mode != fp8ScalesOuter {
		rows = fp8BlockRows(M)
	}
	ran := false
	for k, p := range d.gemmTune.fp8 {
		if k.M == rows && k.N == N && k.K == K && k.scales == mode {
			if p.prob == nil {
				t.Fatalf("%s: cuBLASLt offers no FP8 algorithm: %s", name, p.why)
			}
			ran = true
		}
	}
	if !ran {
		t.Fatalf("%s: the FP8 GEMM did not run", name)
	}
	got := down(t, d, out)

	// The quantization, bit for bit.
	group := K
	if mode != fp8ScalesOuter {
		group = 128
	}
	G := K / group
	q, sx := hostQuantRows(xh, group)
	wsh := tensor.Bytes(down(t, d, ws))
	nsx, _ := fp8ScaleCounts(M, N, K)
	sxOff := int(roundUp256(int64(fp8BlockRows(M) * K)))
	swOff := sxOff + int(roundUp256(int64(4*nsx)))
	for i := range M * K {
		if wsh[i] != q[i] {
			t.Fatalf("%s: q[%d,%d] = %#x, want %#x (x %g, sx %g)", name, i/K, i%K, wsh[i], q[i], xh.At(i), sx[i/K*G+i%K/group])
		}
	}
	for i := M * K; i < rows*K; i++ {
		if wsh[i] != 0 {
			t.Fatalf("%s: q's padding row %d holds %#x", name, i/K, wsh[i])
		}
	}
	gotSX, err := tensor.FromBytes(tensor.F32, wsh[sxOff:sxOff+4*rows*G], rows*G)
	if err != nil {
		t.Fatal(err)
	}
	for m := range M {
		for g := range G {
			at := m*G + g
			if mode != fp8ScalesOuter {
				at = g*rows + m
			}
			if gotSX.F32[at] != sx[m*G+g] {
				t.Fatalf("%s: x's scale (%d, group %d) = %g, want %g", name, m, g, gotSX.F32[at], sx[m*G+g])
			}
		}
	}
	sf := sh.Float32s()
	swant := make([]float32, N*G)
	switch sc.scheme {
	case "tensor":
		for n := range swant {
			swant[n] = sf[0]
		}
	case "channel":
		for g := range G {
			copy(swant[g*N:], sf)
		}
	case "block":
		nb, kb, ld := (N+127)/128, K/128, fp8BlockScaleLD(K)
		swant = make([]float32, nb*ld)
		for r := range nb {
			copy(swant[r*ld:r*ld+kb], sf[r*kb:(r+1)*kb])
		}
	}
	gotSW, err := tensor.FromBytes(tensor.F32, wsh[swOff:swOff+4*len(swant)], len(swant))
	if err != nil {
		t.Fatal(err)
	}
	for i := range swant {
		if gotSW.F32[i] != swant[i] {
			t.Fatalf("%s: the weight's f32 scale %d = %g, want %g", name, i, gotSW.F32[i], swant[i])
		}
	}

	// The product against the exact one of the quantized operands, and against the CPU.
	wscale := func(n, k int) float64 {
		switch sc.scheme {
		case "tensor":
			return float64(sf[0])
		case "channel":
			return float64(sf[n])
		}
		return float64(sf[(n/128)*(K/128)+k/128])
	}
	exactRef := tensor.New(tensor.F32, M, N)
	tight := make([]float64, M*N)
	loose := make([]float64, M*N)
	for m := range M {
		for n := range N {
			var s, abs, xw, sub float64
			for k := range K {
				sxk, swk := float64(sx[m*G+k/group]), wscale(n, k)
				qv := float64(tensor.F8E4M3ToF32(q[m*K+k])) * sxk
				wv := float64(tensor.F8E4M3ToF32(wh.U8[n*K+k])) * swk
				s += qv * wv
				abs += math.Abs(qv * wv)
				xw += math.Abs(xh.At(m*K+k) * wv)
				sub += math.Abs(wv) * sxk
			}
			exactRef.F32[m*N+n] = float32(s)
			tight[m*N+n] = math.Abs(s)/256 + abs/2048
			loose[m*N+n] = xw/16 + sub/1024 + xw/2048 + math.Abs(want.At(m*N+n))/128
		}
	}
	compare(t, "linear_fp8 (fp8 gemm)", name+" vs exact", got.Cast(tensor.F32), exactRef, tol{rtol: 1, scale: tight})
	compare(t, "linear_fp8 (fp8 gemm)", name+" vs cpu", got, want, tol{rtol: 1, scale: loose})
}

// hostQuantRows is fp8_quant_rows on the host: x[M,K] bf16 to e4m3 bytes per group of
// group values of a row (K for whole rows), with scales amax/448 (1 for a group of zeros),
// sx[m*G + g].
func hostQuantRows(x *tensor.Tensor, group int) (q []byte, sx []float32) {
	M, K := x.Shape[0], x.Shape[1]
	G := K / group
	xf := x.Float32s()
	q, sx = make([]byte, M*K), make([]float32, M*G)
	for m := range M {
		for g := range G {
			lo := m*K + g*group
			var amax float32
			for _, v := range xf[lo : lo+group] {
				amax = max(amax, float32(math.Abs(float64(v))))
			}
			inv := float32(1)
			sx[m*G+g] = 1
			if amax > 0 {
				inv, sx[m*G+g] = 448/amax, amax/448
			}
			for k := lo; k < lo+group; k++ {
				q[k] = tensor.F32ToF8E4M3(xf[k] * inv)
			}
		}
	}
	return q, sx
}

// TestFP8GemmFits checks which products the FP8 GEMM takes (no GPU needed).
func TestFP8GemmFits(t *testing.T) {
	x := &Tensor{DType: tensor.BF16, Shape: []int{64, 4096}, ptr: 1 << 20}
	w := &Tensor{DType: tensor.F8E4M3, Shape: []int{1024, 4096}, ptr: 1 << 30}
	ch := fp8Scheme{kind: 1, bn: 1, bk: 1}
	for _, tc := range []struct {
		name      string
		x, w      *Tensor
		s         fp8Scheme
		act       string
		M, N, K   int
		takes     bool
		errSubstr string
	}{
		{"dynamic channel", x, w, ch, "dynamic", 64, 1024, 4096, true, ""},
		{"static tensor", x, w, fp8Scheme{bn: 1, bk: 1}, "static", 64, 1024, 4096, true, ""},
		{"activations kept", x, w, ch, "none", 64, 1024, 4096, false, "unquantized"},
		{"few rows", x, w, ch, "dynamic", 8, 1024, 4096, false, "GEMV"},
		{"f32 x", &Tensor{DType: tensor.F32, Shape: []int{64, 4096}, ptr: 1 << 20}, w, ch, "dynamic", 64, 1024, 4096, false, "f32"},
		{"e5m2", x, &Tensor{DType: tensor.F8E5M2, Shape: []int{1024, 4096}, ptr: 1 << 30}, ch, "dynamic", 64, 1024, 4096, false, "e5m2"},
		{"block 128", x, w, fp8Scheme{kind: 2, bn: 128, bk: 128}, "dynamic", 64, 1024, 4096, true, ""},
		{"block 64", x, w, fp8Scheme{kind: 2, bn: 64, bk: 64}, "dynamic", 64, 1024, 4096, false, "128x128"},
		{"block K 16 mod 128", x, w, fp8Scheme{kind: 2, bn: 128, bk: 128}, "dynamic", 64, 1024, 4112, false, "multiple of 128"},
		{"K 8 mod 16", x, w, ch, "dynamic", 64, 1024, 4104, false, "multiples of 16"},
		{"unaligned x", &Tensor{DType: tensor.BF16, Shape: []int{64, 4096}, ptr: 1<<20 + 8}, w, ch, "dynamic", 64, 1024, 4096, false, "aligned"},
	} {
		err := fp8GemmFits(tc.x, tc.w, tc.s, tc.act, tc.M, tc.N, tc.K)
		if (err == nil) != tc.takes {
			t.Errorf("%s: takes = %v (%v), want %v", tc.name, err == nil, err, tc.takes)
		}
		if err != nil && !strings.Contains(err.Error(), tc.errSubstr) {
			t.Errorf("%s: %v, want it to say %q", tc.name, err, tc.errSubstr)
		}
	}
	// The workspace covers the GEMM's q, sx and sw, and the dequantized weight it falls back to.
	n := &graph.Node{Inputs: []*graph.Value{{Type: graph.Type{DType: tensor.BF16}}}}
	if got, want := linearFP8Workspace(n, [][]int{{64, 4096}, {1024, 4096}}), int64(1024*4096*2); got != want {
		t.Errorf("workspace %d, want %d (the dequantized weight)", got, want)
	}
	if got, want := linearFP8Workspace(n, [][]int{{4096, 4096}, {16, 4096}}), fp8GemmWorkspace(4096, 16, 4096); got != want || want < 4096*4096+4*4096*32 {
		t.Errorf("workspace %d, want %d (the GEMM's)", got, want)
	}
}

// TestFP8BatchWarning checks when loading an FP8 graph warns that batches dequantize (no
// GPU needed): always before sm_89, and elsewhere for the linears the FP8 GEMM cannot take.
func TestFP8BatchWarning(t *testing.T) {
	x := tensor.New(tensor.BF16, 16, 256)
	graphOf := func(wdt tensor.DType, scheme string, block []int, act string) *graph.Graph {
		sc := fp8SchemeCase{scheme: scheme, block: block, sdt: tensor.F32}
		shape := map[string][]int{"tensor": {1}, "channel": {128, 1}}[scheme]
		if scheme == "block" {
			shape = []int{(128 + block[0] - 1) / block[0], (256 + block[1] - 1) / block[1]}
		}
		attrs := fp8Attrs(sc)
		attrs["activation_scheme"] = act
		g, _ := opGraph(t, "linear_fp8", attrs, x, tensor.New(wdt, 128, 256), tensor.New(tensor.F32, shape...))
		return g
	}
	for _, tc := range []struct {
		name         string
		g            *graph.Graph
		major, minor int
		want         string // in the warning; "" for none
	}{
		{"channel dynamic, H200", graphOf(tensor.F8E4M3, "channel", nil, "dynamic"), 9, 0, ""},
		{"block 128 dynamic, H200", graphOf(tensor.F8E4M3, "block", []int{128, 128}, "dynamic"), 9, 0, ""},
		{"channel dynamic, A100", graphOf(tensor.F8E4M3, "channel", nil, "dynamic"), 8, 0, "sm_80 has no FP8 tensor cores"},
		{"channel dynamic, L40S", graphOf(tensor.F8E4M3, "channel", nil, "dynamic"), 8, 9, ""},
		{"weight-only", graphOf(tensor.F8E4M3, "channel", nil, "none"), 9, 0, "some FP8 linears"},
		{"e5m2", graphOf(tensor.F8E5M2, "tensor", nil, "dynamic"), 9, 0, "some FP8 linears"},
		{"block 16", graphOf(tensor.F8E4M3, "block", []int{16, 16}, "dynamic"), 9, 0, "some FP8 linears"},
	} {
		msg, _ := fp8BatchWarning(tc.g, tc.major, tc.minor)
		if (msg == "") != (tc.want == "") || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: warning %q, want one containing %q", tc.name, msg, tc.want)
		}
	}
}

// TestFP8ScalesFor checks the scale modes products take and the workspace they need (no GPU
// needed): VEC128 on both operands for tensor and channel scales when K is a multiple of
// 128 (outer vectors otherwise, or with LOOM_CUDA_FP8_SCALES=outer), VEC128 with BLK128x128
// for block scales; rows padded to 4 under VEC128, the padded product staged.
func TestFP8ScalesFor(t *testing.T) {
	defer func(v bool) { fp8OuterScales = v }(fp8OuterScales)
	ch, blk := fp8Scheme{kind: 1, bn: 1, bk: 1}, fp8Scheme{kind: 2, bn: 128, bk: 128}
	for _, tc := range []struct {
		s     fp8Scheme
		K     int
		outer bool
		want  fp8Scales
	}{
		{ch, 4096, false, fp8ScalesGroups},
		{fp8Scheme{bn: 1, bk: 1}, 4096, false, fp8ScalesGroups},
		{ch, 4112, false, fp8ScalesOuter},
		{ch, 4096, true, fp8ScalesOuter},
		{blk, 4096, false, fp8ScalesBlocks},
		{blk, 4096, true, fp8ScalesBlocks},
	} {
		fp8OuterScales = tc.outer
		if got := fp8ScalesFor(tc.s, tc.K); got != tc.want {
			t.Errorf("%+v K=%d outer=%v: %s, want %s", tc.s, tc.K, tc.outer, got, tc.want)
		}
	}
	// 13 rows of K=384 and N=400: q for 16 rows, x's scales 16x3, the weight's max(400x3,
	// 4 row blocks x 4), the staged 16x400 bf16 product.
	want := roundUp256(16*384) + roundUp256(4*16*3) + roundUp256(4*400*3) + roundUp256(2*16*400)
	if got := fp8GemmWorkspace(13, 400, 384); got != want {
		t.Errorf("workspace for 13x384 -> 400: %d, want %d", got, want)
	}
	if got, want := fp8GemmWorkspace(16, 400, 384), want-roundUp256(2*16*400); got != want {
		t.Errorf("workspace for 16x384 -> 400 (no staging): %d, want %d", got, want)
	}
	if got := fp8BlockScaleLD(768); got != 8 {
		t.Errorf("block-scale row of K=768: %d floats, want 8 (6 padded to 4s)", got)
	}
}
