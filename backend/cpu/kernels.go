package cpu

import (
	"log/slog"
	"os"
	"strings"
	"sync"
)

// Kernel sets: the implementations of linear's group kernels (groupBF16, groupF32) that this
// build and this CPU can run, chosen once at start-up by CPU feature detection:
//
//	portable  the Go loops of fast_linear.go: one accumulator per output, k order, the
//	          reference kernels' bits on amd64 (no fused multiply-add)
//	avx2      Go assembly (kernels_amd64.s) for CPUs with AVX2 and FMA: eight lanes per
//	          output, fused multiply-adds; in every amd64 build, GOEXPERIMENT=simd or not
//	          (not with the purego tag)
//	avx512    Go assembly (kernels_avx512_amd64.s) for CPUs with AVX-512F and AVX-512BW: avx2's
//	          arithmetic with 16 lanes (other rounding); the default where the CPU has them
//	avx512bf16  Go assembly (kernels_avx512_amd64.s) for CPUs with AVX-512F, AVX-512BW and
//	          AVX512_BF16: bf16 weights meet x rounded to bf16 in VDPBF16PS, 16 lanes per
//	          output (kernels_avx512_amd64.go); changes numerics (x's rounding: past the HF
//	          parity tolerances), so it runs only when LOOM_CPU_KERNELS names it; f32 and f16
//	          weights as avx2
//
// The best set the CPU supports runs unless LOOM_CPU_KERNELS names another; a name this
// build lacks or this CPU cannot run is reported and the default runs instead. The first
// backend start logs the set in use (logKernelSet).
type kernelSet struct {
	name      string
	groupBF16 func(res, xs []float32, rows [][]uint16, M, N, K, j int)
	groupF32  func(res, xs []float32, rows [][]float32, M, N, K, j int)
	// gemvBF16, if set, computes res[j] = x·w[j,:] for lo <= j < hi: one row of x (decode)
	// and bf16 weights [N,K], as groupBF16 would, in one call per worker chunk.
	gemvBF16 func(res, x []float32, w []uint16, N, K, lo, hi int)
	// blockBF16, if set, computes res[m*N+j] = x[m,:]·w[j,:] for every m < M and lo <= j <
	// hi (lo a multiple of 4), x f32 [M,K] and bf16 weights [N,K], as groupBF16 would group
	// by group, in fewer calls.
	blockBF16 func(res, xs []float32, w []uint16, M, N, K, lo, hi int)
	// bf16, if set, replaces groupBF16 and gemvBF16 in gemmRows and gemmRange: the set
	// converts x once per call (see bf16Path).
	bf16 *bf16Path
	// features names the CPU features the set needs (for the log line).
	features string
}

// bf16Path is a kernel set's own path for bf16 weights, for sets that read x converted
// (the avx512bf16 set: rounded to bf16). gemmRows calls round once per linear and rows on
// every worker's chunk.
type bf16Path struct {
	// round returns x f32 [M,K] converted, in a buffer from getU16 (the caller gives it back
	// with putU16).
	round func(xs []float32, M, K int) *[]uint16
	// rows sets res[m*N+j] = x[m,:]·w[j,:] for every m < M and lo <= j < hi, from xb (round's
	// result) and bf16 weights w [N,K].
	rows func(res []float32, xb, w []uint16, M, N, K, lo, hi int)
	// relErr bounds the error the conversion adds to an output, relative to the sum of the
	// absolute products behind it (for the tests' tolerances).
	relErr float64
}

// bf16Stride is the length of a row of x rounded to bf16 (bf16Path.round of the avx512bf16
// set): K rounded up to the 32 elements of a VDPBF16PS block.
func bf16Stride(K int) int { return (K + 31) &^ 31 }

// u16Pool recycles uint16 scratch buffers (x rounded to bf16).
var u16Pool sync.Pool

// getU16 returns a scratch slice of n uint16s (contents undefined); give it back with putU16.
func getU16(n int) *[]uint16 {
	if p, ok := u16Pool.Get().(*[]uint16); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	s := make([]uint16, n)
	return &s
}

func putU16(p *[]uint16) { u16Pool.Put(p) }

// kernelEnv names the environment variable that forces a kernel set.
const kernelEnv = "LOOM_CPU_KERNELS"

var portableKernels = kernelSet{name: "portable", groupBF16: gemmGroupBF16, groupF32: gemmGroupF32}

// kernelSets lists the sets this build has and this CPU supports, best first: the
// platform's (platformKernels) and then the portable one.
var kernelSets []kernelSet

// kernelNotes holds why a set of this build was left out (for the log line).
var kernelNotes []string

func init() {
	kernelSets = append(platformKernels(), portableKernels)
	selectKernels()
}

// activeKernels is the set linear runs (see useKernelSet); forcedNote says why a forced
// name was not honoured, if it was not.
var (
	activeKernels = portableKernels
	forcedNote    string
)

// selectKernels picks the set: LOOM_CPU_KERNELS if it names a listed set, else the best.
func selectKernels() {
	want := strings.TrimSpace(os.Getenv(kernelEnv))
	if want != "" {
		if s, ok := kernelSetNamed(want); ok {
			useKernelSet(s)
			return
		}
		forcedNote = want + " is not available on this build and CPU"
	}
	useKernelSet(kernelSets[0])
}

// kernelSetNamed returns the listed set called name.
func kernelSetNamed(name string) (kernelSet, bool) {
	for _, s := range kernelSets {
		if s.name == name {
			return s, true
		}
	}
	return kernelSet{}, false
}

// useKernelSet makes s the set that linear runs. Not safe while kernels run: tests switch
// sets between runs.
func useKernelSet(s kernelSet) {
	activeKernels = s
	groupBF16, groupF32, gemvBF16, bf16Rows, blockBF16 = s.groupBF16, s.groupF32, s.gemvBF16, s.bf16, s.blockBF16
}

var logKernelsOnce sync.Once

// logKernelSet logs, once per process, the kernel set in use and the sets available.
func logKernelSet() {
	logKernelsOnce.Do(func() {
		names := make([]string, len(kernelSets))
		for i, s := range kernelSets {
			names[i] = s.name
		}
		args := []any{"set", activeKernels.name, "available", strings.Join(names, ",")}
		if activeKernels.features != "" {
			args = append(args, "features", activeKernels.features)
		}
		if forcedNote != "" {
			args = append(args, kernelEnv, forcedNote)
		}
		if len(kernelNotes) > 0 {
			args = append(args, "note", strings.Join(kernelNotes, "; "))
		}
		slog.Info("cpu: kernels", args...)
	})
}

// readHalfGo folds the elements of h four at a time: the portable read-bandwidth probe.
func readHalfGo(h []uint16) uint64 {
	var s0, s1, s2, s3 uint64
	i := 0
	for ; i+4 <= len(h); i += 4 {
		s0 ^= uint64(h[i])
		s1 ^= uint64(h[i+1])
		s2 ^= uint64(h[i+2])
		s3 ^= uint64(h[i+3])
	}
	for ; i < len(h); i++ {
		s0 ^= uint64(h[i])
	}
	return s0 ^ s1 ^ s2 ^ s3
}
