package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

// A scalar model of the avx512bf16 kernel set's arithmetic (kernels_avx512_amd64.go), as
// Intel defines VCVTNEPS2BF16 and VDPBF16PS: x rounded to bf16 (nearest even, denormals to
// signed zero, NaNs quieted), each output 16 lanes, lane l adding the products of the pair
// (2l+1, 2l) of every block of 32 with two fused multiply-adds (round to nearest even,
// denormal inputs and results taken as zero), the last block padded with zeros, then the
// lanes added pairwise. bf16ModelKernels runs it as a kernel set, in Go, so that the
// fast-kernel tests and their tolerances run with the set's numerics on any CPU.

// roundBF16Model is VCVTNEPS2BF16 on one float32.
func roundBF16Model(f float32) uint16 {
	u := math.Float32bits(f)
	switch {
	case u&0x7f800000 == 0: // zero or denormal: signed zero
		return uint16(u>>16) & 0x8000
	case u&0x7fffffff > 0x7f800000: // NaN: quieted
		return uint16(u>>16) | 0x40
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

// dazF32 takes a denormal float32 as a zero of its sign.
func dazF32(f float32) float32 {
	if u := math.Float32bits(f); u&0x7f800000 == 0 {
		return math.Float32frombits(u & 0x80000000)
	}
	return f
}

// fmaBF16Model is one of VDPBF16PS's steps: acc + a*b for bf16 a and b, rounded once to
// nearest even, denormal inputs and result taken as zero. The product is exact in float64
// and the sum of two float32-precision numbers rounded to float64 and then to float32 is
// rounded correctly (53 >= 2*24+2).
func fmaBF16Model(acc float32, a, b uint16) float32 {
	p := float64(dazF32(bf16(a))) * float64(dazF32(bf16(b)))
	return dazF32(float32(float64(dazF32(acc)) + p))
}

// dpEvenFirst, set by a diagnostic only, makes the model add the even product of each pair
// first (Intel's pseudo-code adds the odd one first).
var dpEvenFirst bool

// dotBF16Model is one output of the set: x (rounded, zero-padded to a multiple of 32) · w
// (K bf16 elements).
func dotBF16Model(x, w []uint16, K int) float32 {
	at := func(k int) uint16 {
		if k < K {
			return w[k]
		}
		return 0
	}
	var l [16]float32
	for b := 0; b < len(x); b += 32 {
		for i := range 16 {
			k := b + 2*i
			if dpEvenFirst {
				l[i] = fmaBF16Model(l[i], x[k], at(k))
				l[i] = fmaBF16Model(l[i], x[k+1], at(k+1))
				continue
			}
			l[i] = fmaBF16Model(l[i], x[k+1], at(k+1))
			l[i] = fmaBF16Model(l[i], x[k], at(k))
		}
	}
	return sum16(&l)
}

// roundRowsModel is roundRowsBF16 in Go.
func roundRowsModel(xs []float32, M, K int) *[]uint16 {
	kp := bf16Stride(K)
	p := getU16(M * kp)
	clear(*p)
	for m := range M {
		for k := range K {
			(*p)[m*kp+k] = roundBF16Model(xs[m*K+k])
		}
	}
	return p
}

// rowsModel is avx512bf16Rows in Go.
func rowsModel(res []float32, xb, w []uint16, M, N, K, lo, hi int) {
	kp := bf16Stride(K)
	for m := range M {
		for j := lo; j < hi; j++ {
			res[m*N+j] = dotBF16Model(xb[m*kp:(m+1)*kp], w[j*K:(j+1)*K], K)
		}
	}
}

// groupModel is avx512bf16Group in Go.
func groupModel(res, xs []float32, rows [][]uint16, M, N, K, j int) {
	xb := roundRowsModel(xs, M, K)
	defer putU16(xb)
	kp := bf16Stride(K)
	for m := range M {
		for r, w := range rows {
			res[m*N+j+r] = dotBF16Model((*xb)[m*kp:(m+1)*kp], w, K)
		}
	}
}

// bf16ModelKernels is the model as a kernel set (f32 weights: the portable kernels).
var bf16ModelKernels = kernelSet{
	name:      "bf16-model",
	groupBF16: groupModel,
	groupF32:  gemmGroupF32,
	bf16:      &bf16Path{round: roundRowsModel, rows: rowsModel, relErr: 1.0 / 256},
}

// lanes16Linear is the avx512 set's arithmetic in scalar Go (kernels_avx512_amd64.go): 16
// fused multiply-add lanes over K padded with zeros to a multiple of 16, added pairwise as
// the bf16 model adds its lanes.
func lanes16Linear(x, w *tensor.Tensor, M, N, K int) []float32 {
	wf := make([]float32, N*K)
	widen(wf, w, 0)
	res := make([]float32, M*N)
	kp := (K + 15) &^ 15
	for m := range M {
		for j := range N {
			var l [16]float32
			for k := range kp {
				var a, b float64
				if k < K {
					a, b = float64(x.F32[m*K+k]), float64(wf[j*K+k])
				}
				l[k%16] = float32(math.FMA(a, b, float64(l[k%16])))
			}
			res[m*N+j] = sum16(&l)
		}
	}
	return res
}

// sum16 adds 16 lanes pairwise as both AVX-512 sets do: v8[i] = l[i]+l[i+8], v4[i] =
// v8[i]+v8[i+4], v2[i] = v4[i]+v4[i+2], v2[0]+v2[1].
func sum16(l *[16]float32) float32 {
	var v8 [8]float32
	for i := range 8 {
		v8[i] = l[i] + l[i+8]
	}
	var v4 [4]float32
	for i := range 4 {
		v4[i] = v8[i] + v8[i+4]
	}
	return (v4[0] + v4[2]) + (v4[1] + v4[3])
}

// bf16LinearModel is the model's linear: x f32 [M,K] @ w bf16 [N,K]^T.
func bf16LinearModel(x, w *tensor.Tensor, M, N, K int) []float32 {
	res := make([]float32, M*N)
	xb := roundRowsModel(x.F32, M, K)
	defer putU16(xb)
	rowsModel(res, *xb, w.Half, M, N, K, 0, N)
	return res
}

// linearRelErr is the error the active kernel set's linear may add to the reference's,
// relative to the sum of the absolute products (0 for the f32 sets).
func linearRelErr() float64 {
	if activeKernels.bf16 != nil {
		return activeKernels.bf16.relErr
	}
	return 0
}

// linearTol is productTol widened by what the active set's conversion of x adds (bf16
// weights only: the sets convert x for those).
func linearTol(sums []float64, dx, dw tensor.DType) func(o, i int, r float64) float64 {
	rel := 0.0
	if dw == tensor.BF16 {
		rel = linearRelErr()
	}
	return func(o, i int, r float64) float64 {
		return (1e-5+rel)*sums[i] + ulp(dx)*math.Abs(r) + 1e-30
	}
}

// TestBF16ModelSet runs the fast-kernel and MoE tests with the avx512bf16 set's arithmetic
// computed in Go (bf16ModelKernels), on any CPU: the tolerances of those tests must hold the
// numerics of that set (x rounded to bf16), and its structure (round once, rows per chunk)
// must give the reference kernels' results within them.
func TestBF16ModelSet(t *testing.T) {
	withKernelSet(bf16ModelKernels, func() { runKernelTests(t) })
}

// TestRoundBF16Model holds the model's rounding to the rule it states, on edge cases.
func TestRoundBF16Model(t *testing.T) {
	for _, tc := range []struct {
		in   uint32
		want uint16
	}{
		{0x3f800000, 0x3f80}, // 1
		{0x3f808000, 0x3f80}, // a tie, even below
		{0x3f818000, 0x3f82}, // a tie, even above
		{0x3f808001, 0x3f81}, // above the tie
		{0x00400000, 0x0000}, // denormal: +0
		{0x807fffff, 0x8000}, // denormal: -0
		{0x7f7fffff, 0x7f80}, // rounds to +Inf
		{0x7f800000, 0x7f80}, // +Inf
		{0x7f800001, 0x7fc0}, // a signalling NaN, quieted
		{0xff812345, 0xffc1},
	} {
		if got := roundBF16Model(math.Float32frombits(tc.in)); got != tc.want {
			t.Errorf("round(%#08x) = %#04x, want %#04x", tc.in, got, tc.want)
		}
	}
	if got := tensor.F32ToBF16(1.00390625); got != roundBF16Model(1.00390625) { // normal numbers: the tensor package's rounding
		t.Errorf("1+2^-8: %#04x, tensor.F32ToBF16 %#04x", roundBF16Model(1.00390625), got)
	}
}

// TestKernelSetsRowwise holds every set to its determinism: the outputs of a batch equal,
// bit for bit, those of each row of x run alone and those of one chunk on one goroutine
// (no split over workers), so that batching and the worker count never change results.
func TestKernelSetsRowwise(t *testing.T) {
	for _, s := range append(kernelSets[:len(kernelSets):len(kernelSets)], bf16ModelKernels) {
		t.Run(s.name, func(t *testing.T) {
			withKernelSet(s, func() {
				for _, dw := range []tensor.DType{tensor.BF16, tensor.F32} {
					for _, sh := range [][3]int{{5, 13, 67}, {9, 11, 129}, {18, 701, 1024}, {19, 37, 203}} {
						M, N, K := sh[0], sh[1], sh[2]
						x, w := linearInputs(rand.New(rand.NewPCG(91, uint64(M*N*K))), M, N, K, dw)
						got := runLinear(t, fastLinear, x, w)
						one := make([]float32, M*N)
						gemmRange(one, x.F32, w, M, N, K, 0, N)
						if i := firstF32BitDiff(got, one); i >= 0 {
							t.Errorf("%s %v: element %d is %v split over workers, %v in one chunk", dw, sh, i, got[i], one[i])
						}
						for m := range M {
							row := tensor.New(tensor.F32, 1, K)
							copy(row.F32, x.F32[m*K:(m+1)*K])
							alone := runLinear(t, fastLinear, row, w)
							if i := firstF32BitDiff(got[m*N:(m+1)*N], alone); i >= 0 {
								t.Errorf("%s %v: row %d element %d is %v in the batch, %v alone", dw, sh, m, i, got[m*N+i], alone[i])
								break
							}
						}
					}
				}
			})
		})
	}
}

// cpuVendor returns the vendor_id of /proc/cpuinfo ("" where there is none).
func cpuVendor() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(data)) {
		if key, val, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(key) == "vendor_id" {
			return strings.TrimSpace(val)
		}
	}
	return ""
}

// BenchmarkLinearBatchSets is BenchmarkLinearBatch (Qwen2.5-0.5B's gate/up shape, bf16
// w[9728,896], 1 to 16 rows of x) on every kernel set ("speedup" over the first listed, the
// default); the bytes are the weight bytes.
func BenchmarkLinearBatchSets(b *testing.B) {
	const N, K = 9728, 896
	rng := rand.New(rand.NewPCG(65, 66))
	w := randBF16(rng, N, K)
	for _, M := range []int{1, 4, 8, 16} {
		b.Run(fmt.Sprintf("M=%d", M), func(b *testing.B) {
			f := kernelFn(b, fastLinear, "linear", nil, randF32(rng, M, K), w)
			var names []string
			var fns []func() error
			for _, s := range kernelSets {
				names = append(names, s.name)
				fns = append(fns, func() error {
					var err error
					withKernelSet(s, func() { err = f() })
					return err
				})
			}
			benchVariants(b, int64(N*K*2), names, fns)
		})
	}
}
