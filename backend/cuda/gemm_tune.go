package cuda

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/tensor"
)

// GEMM tuning. cuBLAS's default algorithm for a product is a heuristic's first guess, and
// for the few-row products of batched decode it can leave SMs idle: on an H200 (132 SMs),
// bf16, M=64 rows, cublasGemmEx streams the weights of K=4096 -> N=6144 at 3.2 TB/s (15.7
// µs), of 14336 -> 4096 at 3.4 TB/s (34.8 µs), of the ~4.3 the memory gives.
//
// With tuning on (GemmTuneEnv, gemmTuneDefault), linear times bf16 x bf16 products (with
// a bf16 or an f32 result) the first time it meets a shape: cublasGemmEx, the algorithms
// cuBLASLt's heuristic proposes (up to gemmTuneAlgos) and, for M <= gemvMaxM, the gemv
// kernel, on the real operands; it keeps the fastest for that shape (Device.gemmTune).
// Later calls of the shape, eager or captured into a CUDA graph, run the kept choice: a
// cuBLASLt matmul with a fixed algorithm and the device's cuBLAS workspace allocates
// nothing and captures like cublasGemmEx. Tuning never runs during a capture (a shape
// first met while capturing runs on cublasGemmEx, untuned, and is tuned at its next eager
// call).
//
// Each candidate's first run is checked against cublasGemmEx's result (a candidate that
// fails a call or disagrees beyond bf16 rounding is dropped); then gemmTuneRounds rounds
// time every candidate between two events, each run after a read of twice the L2 cache
// (so that the weights come from HBM, as in a decode step whose other layers evicted
// them). A candidate replaces cublasGemmEx only when its median is gemmTuneMinGain
// faster. Tuning a shape took 16 to 584 ms on an H200 (TestGemmTuneTimings, the most for
// M=256 and for the first shapes); timed rounds stop near gemmTuneShapeBudget per shape,
// and a device stops tuning new shapes after gemmTuneBudget in all or gemmTuneMaxShapes
// shapes. Products of more than gemmTuneMaxM rows, which fill the GPU anyway, are not
// tuned.
//
// Split-K candidates for a bf16 result must keep their partial sums in f32 (the reduction
// scheme mask): the tuned path accumulates in f32 throughout, rounding once at the end.
//
// LOOM_CUDA_GEMM_TUNE=1 turns tuning on, LOOM_CUDA_GEMM_TUNE=0 off (every product on
// cublasGemmEx, as before); unset, gemmTuneDefault decides (off for now).

// GemmTuneEnv names the environment variable that turns GEMM tuning off ("0") or on ("1").
const GemmTuneEnv = "LOOM_CUDA_GEMM_TUNE"

// gemmTuneDefault is whether GEMMs are tuned when GemmTuneEnv is unset: not yet. Measured
// on an H200 (TestGemmTuneTimings: graph replay, weights beyond L2; cublasGemmEx -> tuned
// µs), the gain is modest and on few shapes: M=64 gate_up 4096->28672 63.2 -> 57.9
// (1.09x), M=16 gate_up 61.0 -> 58.1, M=256 o_proj 16.8 -> 15.4; qkv, o_proj and down at
// M=16 and 64, and qkv, gate_up and down at M=256, stay equal (cuBLASLt's heuristic
// proposed 8 algorithms, none faster there). In that run two candidates cuBLASLt proposed
// for M=3, K=520 (not chosen) erred beyond cublasGemmEx's bound, most likely split-K
// algorithms that round partial sums to bf16; gemmLtAlgos now excludes those reduction
// schemes, a change not yet run on a GPU. Set it once TestGemmTuneLinear passes there.
const gemmTuneDefault = false

// Switches: gemmTuneOff sends every product to cublasGemmEx untuned (GemmTuneEnv; tests
// set it too); gemmTunePick, when set, overrides the choice among the measured candidates
// with the index it returns (-1: no override), so that tests can make a shape run on a
// given kind.
var (
	gemmTuneOff  = gemmTuneDisabled(os.Getenv(GemmTuneEnv))
	gemmTunePick func(cands []gemmCandidate) int
)

// gemmTuneDisabled interprets the value of GemmTuneEnv.
func gemmTuneDisabled(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "0", "off", "false", "no":
		return true
	case "1", "on", "true", "yes":
		return false
	}
	return !gemmTuneDefault
}

// Bounds of the tuning.
const (
	gemmTuneAlgos       = 32                     // cuBLASLt heuristic candidates asked for
	gemmTuneRounds      = 5                      // timed runs of each candidate (the median counts)
	gemmTuneMaxM        = 512                    // products with more rows are not tuned
	gemmTuneMaxShapes   = 1024                   // shapes tuned per device, at most
	gemmTuneShapeBudget = 250 * time.Millisecond // timed rounds per shape stop near this
	gemmTuneBudget      = 60 * time.Second       // total tuning time per device; later shapes are not tuned
	gemmTuneMinGain     = 0.03                   // a candidate must beat cublasGemmEx by 3%
	gemmTunePrune       = 1.5                    // slower than this × the fastest in round 1: not timed further
	gemmTuneCheckElems  = 1 << 22                // result elements compared per candidate, at most
)

// gemmKey identifies a tuned product: out[M,N] (type c) = x[M,K]·w[N,K]ᵀ (both type a), the
// pointers' common alignment (capped at 256 bytes: the algorithms chosen need no more) and
// whether the gemv was a candidate.
type gemmKey struct {
	M, N, K int
	a, c    cubind.DataType
	align   uint32
	gemv    bool
}

func (k gemmKey) String() string {
	out := "bf16"
	if k.c == cubind.R32F {
		out = "f32"
	}
	return fmt.Sprintf("M=%d K=%d N=%d %s out, %d-byte aligned", k.M, k.K, k.N, out, k.align)
}

// gemmKind is how a product runs.
type gemmKind uint8

const (
	gemmKindEx   gemmKind = iota // cublasGemmEx, default algorithm
	gemmKindLt                   // cublasLtMatmul with a chosen algorithm
	gemmKindGemv                 // the gemv kernel
)

// gemmCandidate is one way to run a product, with its measured time.
type gemmCandidate struct {
	kind  gemmKind
	name  string
	algo  cubind.MatmulAlgo // gemmKindLt
	ws    uint64            // gemmKindLt: workspace bytes it needs
	waves float32           // gemmKindLt: the heuristic's waves count
	gemv  gemvPlan          // gemmKindGemv
	us    float64           // median µs per run; +Inf when dropped or not timed
	first float64           // µs of the first timed run (0 when not timed)
	note  string            // why it was dropped
}

// gemmProblem is the cuBLASLt description of one shape: the matmul descriptor and the
// layouts of A (w), B (x) and C = D (out).
type gemmProblem struct {
	desc    cubind.MatmulDesc
	a, b, c cubind.MatrixLayout
}

func (p *gemmProblem) destroy() error {
	if p == nil {
		return nil
	}
	return errors.Join(p.desc.Destroy(), p.a.Destroy(), p.b.Destroy(), p.c.Destroy())
}

// gemmPlan is the tuning result of one shape: the chosen candidate and what was measured.
type gemmPlan struct {
	gemmCandidate
	prob  *gemmProblem    // the descriptors, when the choice is a cuBLASLt algorithm
	tried []gemmCandidate // every candidate, cublasGemmEx first
	took  time.Duration   // tuning time
	ltErr string          // why cuBLASLt offered no candidate, when it did not
}

// defaultUs is cublasGemmEx's measured µs per run (NaN when not measured).
func (p *gemmPlan) defaultUs() float64 {
	if len(p.tried) == 0 || math.IsInf(p.tried[0].us, 0) {
		return math.NaN()
	}
	return p.tried[0].us
}

// gemmTuner is a device's tuning state.
type gemmTuner struct {
	lt    *cubind.Lt
	ltErr error // cuBLASLt cannot be used: every product runs on cublasGemmEx
	l2    int   // the L2 cache's size in bytes (0 until queried)
	plans map[gemmKey]*gemmPlan
	fp8   map[fp8GemmKey]*fp8GemmPlan // the FP8 GEMM's shapes (fp8_gemm.go)
	// fp8Refused is set once a shape found no FP8 algorithm (logged at Info once).
	fp8Refused bool
	spent      time.Duration
}

// tuner returns the device's tuning state, creating it (and the cuBLASLt handle) on first
// use. The device must be locked with its context current.
func tuner(d *Device) *gemmTuner {
	if d.gemmTune == nil {
		t := &gemmTuner{plans: map[gemmKey]*gemmPlan{}, fp8: map[fp8GemmKey]*fp8GemmPlan{}}
		t.lt, t.ltErr = cubind.NewLt()
		if t.ltErr != nil {
			slog.Debug("cuda: cuBLASLt unavailable; GEMMs run on cublasGemmEx", "err", t.ltErr)
		}
		if l2, err := d.dev.Attribute(cubind.AttrL2CacheSize); err == nil {
			t.l2 = l2
		}
		d.gemmTune = t
	}
	return d.gemmTune
}

// releaseGemmTune frees the cuBLASLt handle and descriptors (Device.release).
func releaseGemmTune(d *Device) error {
	t := d.gemmTune
	if t == nil {
		return nil
	}
	var errs []error
	for _, p := range t.plans {
		errs = append(errs, p.prob.destroy())
	}
	for _, p := range t.fp8 {
		errs = append(errs, p.prob.destroy())
	}
	errs = append(errs, t.lt.Destroy())
	d.gemmTune = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cuBLASLt: %w", err)
	}
	return nil
}

// ptrAlign is the largest power of two, at most 256, that divides every pointer.
func ptrAlign(ps ...cubind.DevicePtr) uint32 {
	a := uint64(256)
	for _, p := range ps {
		if p != 0 {
			a = min(a, uint64(p)&-uint64(p))
		}
	}
	return uint32(a)
}

// gemm runs linear's out[M,N] = x[M,K]·w[N,K]ᵀ on cuBLAS: linear has checked the shapes (M,
// N, K > 0 and within 32 bits) and the gemv did not take the product. bf16 x and w run
// tuned (gemmTuned); f32 x with a bf16 w is rounded to bf16 first and runs as a bf16
// product with an f32 result; f32 x and w run on cublasGemmEx. The device must be locked
// with its context current.
func gemm(d *Device, out, x, w *Tensor, M, N, K int) error {
	xt := x
	var at, ct cubind.DataType
	switch {
	case x.DType == tensor.BF16 && w.DType == tensor.BF16:
		at, ct = cubind.R16BF, cubind.R16BF
	case x.DType == tensor.F32 && w.DType == tensor.F32:
		at, ct = cubind.R32F, cubind.R32F
	case x.DType == tensor.F32 && w.DType == tensor.BF16:
		tmp, err := d.allocTensor(tensor.BF16, x.Shape)
		if err != nil {
			return fmt.Errorf("cuda: linear: %w", err)
		}
		defer d.Free(tmp) // safe: the GEMM that reads it is queued before any reuse
		if err := cast(d, tmp, x); err != nil {
			return fmt.Errorf("cuda: linear: %w", err)
		}
		xt, at, ct = tmp, cubind.R16BF, cubind.R32F
	default:
		return fmt.Errorf("cuda: linear: x %s with weight %s is not supported", x.DType, w.DType)
	}
	if at == cubind.R16BF {
		return gemmTuned(d, out, xt, w, M, N, K, ct)
	}
	return gemmEx(d, out, xt, w, M, N, K, at, ct)
}

// gemmEx runs the product on cublasGemmEx with cuBLAS's default algorithm. Row-major
// out[M,N] = x[M,K]·wᵀ is column-major outᵀ[N,M] = op(A)·B with A the column-major K×N view
// of w (transposed) and B the column-major K×M view of x.
func gemmEx(d *Device, out, x, w *Tensor, M, N, K int, at, ct cubind.DataType) error {
	err := d.blas.GemmEx(cubind.OpT, cubind.OpN, N, M, K, 1,
		cubind.Matrix{Ptr: w.ptr, Type: at, LD: K}, cubind.Matrix{Ptr: x.ptr, Type: at, LD: K},
		0, cubind.Matrix{Ptr: out.ptr, Type: ct, LD: N}, cubind.Compute32F)
	return wrap("cuda: linear", err)
}

// gemmTuned runs the bf16 product out = x·wᵀ (out of type ct) the way tuned fastest for its
// shape, tuning the shape first when it is new and the device is not capturing.
func gemmTuned(d *Device, out, x, w *Tensor, M, N, K int, ct cubind.DataType) error {
	if gemmTuneOff || M > gemmTuneMaxM {
		return gemmEx(d, out, x, w, M, N, K, cubind.R16BF, ct)
	}
	key := gemmKey{M: M, N: N, K: K, a: cubind.R16BF, c: ct, align: ptrAlign(out.ptr, x.ptr, w.ptr),
		gemv: !gemvOff && ct == cubind.R16BF && M <= gemvMaxM}
	t := tuner(d)
	p, ok := t.plans[key]
	if !ok {
		if d.capturing || len(t.plans) >= gemmTuneMaxShapes || t.spent >= gemmTuneBudget {
			return gemmEx(d, out, x, w, M, N, K, cubind.R16BF, ct)
		}
		var err error
		if p, err = tuneGemm(d, key, out, x, w); err != nil {
			return err
		}
		t.plans[key] = p
	}
	return runGemm(d, &p.gemmCandidate, p.prob, key, out, x, w)
}

// runGemm queues candidate c of shape key (prob: its cuBLASLt descriptors).
func runGemm(d *Device, c *gemmCandidate, prob *gemmProblem, key gemmKey, out, x, w *Tensor) error {
	switch c.kind {
	case gemmKindLt:
		err := d.gemmTune.lt.Matmul(prob.desc, 1, w.ptr, prob.a, x.ptr, prob.b, 0, out.ptr, prob.c, out.ptr, prob.c,
			&c.algo, d.blasWork.ptr, blasWorkspaceBytes, d.stream)
		if err != nil {
			return fmt.Errorf("cuda: linear (cuBLASLt %s, %s): %w", c.name, key, err)
		}
		return nil
	case gemmKindGemv:
		// The key's alignment is the smallest of three pointers: check that this x and w
		// suit the kernel too.
		if p, ok := gemvFits(x, w); ok && p.M == c.gemv.M && p.N == c.gemv.N && p.K == c.gemv.K {
			return launchGemv(d, out, x, w, c.gemv)
		}
	}
	return gemmEx(d, out, x, w, key.M, key.N, key.K, key.a, key.c)
}

// tuneGemm measures the candidates for shape key on the operands out, x and w and returns
// the plan. out is overwritten; the caller runs the chosen candidate afterwards. Failures
// of cuBLASLt's setup or of single candidates only drop candidates; an error is returned
// for a failure of the device (queued work that failed).
func tuneGemm(d *Device, key gemmKey, out, x, w *Tensor) (*gemmPlan, error) {
	start := time.Now()
	t := d.gemmTune
	plan := &gemmPlan{}
	defer func() {
		plan.took = time.Since(start)
		t.spent += plan.took
	}()
	cands := []gemmCandidate{{kind: gemmKindEx, name: "cublasGemmEx"}}
	if key.gemv {
		if p, ok := gemvFits(x, w); ok {
			cands = append(cands, gemmCandidate{kind: gemmKindGemv, name: fmt.Sprintf("gemv%v", p.cfg), gemv: p})
		}
	}
	prob, algos, err := gemmLtAlgos(d, key)
	if err != nil {
		plan.ltErr = err.Error()
		slog.Debug("cuda: cuBLASLt offers no algorithm", "shape", key.String(), "err", err)
	}
	for i, r := range algos {
		cands = append(cands, gemmCandidate{kind: gemmKindLt, name: fmt.Sprintf("lt%d", i), algo: r.Algo,
			ws: uint64(r.WorkspaceSize), waves: r.WavesCount})
	}
	for i := range cands {
		cands[i].us = math.Inf(1)
	}
	if len(cands) > 1 {
		if err := timeGemms(d, key, prob, cands, out, x, w); err != nil {
			prob.destroy()
			return nil, err
		}
	}
	best := 0
	for i, c := range cands {
		if c.us < cands[best].us {
			best = i
		}
	}
	if best != 0 && !math.IsInf(cands[0].us, 0) && cands[best].us > cands[0].us*(1-gemmTuneMinGain) {
		best = 0 // not faster enough to leave cublasGemmEx
	}
	if gemmTunePick != nil {
		if i := gemmTunePick(cands); i >= 0 && i < len(cands) {
			best = i
		}
	}
	plan.gemmCandidate = cands[best]
	plan.tried = cands
	if cands[best].kind == gemmKindLt {
		plan.prob = prob
	} else if err := prob.destroy(); err != nil {
		slog.Debug("cuda: cuBLASLt", "err", err)
	}
	slog.Debug("cuda: tuned GEMM", "shape", key.String(), "choice", plan.name, "us", plan.us, "cublasGemmEx_us", plan.defaultUs(),
		"candidates", len(cands), "took", time.Since(start))
	return plan, nil
}

// gemmLtAlgos describes shape key to cuBLASLt and returns the descriptors with the
// algorithms its heuristic proposes (within the device's cuBLAS workspace and the key's
// alignment). Without cuBLASLt, or without an algorithm, both are nil.
func gemmLtAlgos(d *Device, key gemmKey) (*gemmProblem, []cubind.MatmulHeuristicResult, error) {
	t := d.gemmTune
	if t.ltErr != nil {
		return nil, nil, t.ltErr
	}
	p, err := newLtProblem(key.a, key.c, key.M, key.N, key.K)
	if err != nil {
		return nil, nil, fmt.Errorf("cuBLASLt %s: %w", key, err)
	}
	fail := func(err error) (*gemmProblem, []cubind.MatmulHeuristicResult, error) {
		return nil, nil, errors.Join(fmt.Errorf("cuBLASLt %s: %w", key, err), p.destroy())
	}
	pref, err := ltPreference(key.align)
	if err != nil {
		return fail(err)
	}
	defer pref.Destroy()
	if key.c == cubind.R16BF {
		// Split-K algorithms that add bf16-rounded partial sums (in place in the output or
		// through the workspace) err by up to 2^-9 of each partial: an H200 run found two
		// such candidates beyond cublasGemmEx's error at K=520. Partial sums stay f32.
		if err := pref.SetReductionSchemes(cubind.ReductionComputeType); err != nil {
			return fail(err)
		}
	}
	algos, err := t.lt.AlgoGetHeuristic(p.desc, p.a, p.b, p.c, p.c, pref, gemmTuneAlgos)
	if err != nil {
		return fail(err)
	}
	algos = slices.DeleteFunc(algos, func(r cubind.MatmulHeuristicResult) bool { return uint64(r.WorkspaceSize) > blasWorkspaceBytes })
	if len(algos) == 0 {
		return nil, nil, errors.Join(fmt.Errorf("cuBLASLt %s: the heuristic proposes no algorithm", key), p.destroy())
	}
	return p, algos, nil
}

// newLtProblem describes out[M,N] (type c) = x[M,K]·w[N,K]ᵀ (x and w of type a) to
// cuBLASLt, f32 accumulation and scales: A the column-major K×N view of w (transposed), B
// the K×M view of x, C = D the N×M view of out.
func newLtProblem(a, c cubind.DataType, M, N, K int) (*gemmProblem, error) {
	p := &gemmProblem{}
	fail := func(err error) (*gemmProblem, error) { return nil, errors.Join(err, p.destroy()) }
	var err error
	if p.desc, err = cubind.NewMatmulDesc(cubind.Compute32F, cubind.R32F); err != nil {
		return fail(err)
	}
	if err := p.desc.SetTranspose(cubind.OpT, cubind.OpN); err != nil {
		return fail(err)
	}
	m, n, k := uint64(M), uint64(N), uint64(K)
	if p.a, err = cubind.NewMatrixLayout(a, k, n, int64(k)); err != nil {
		return fail(err)
	}
	if p.b, err = cubind.NewMatrixLayout(a, k, m, int64(k)); err != nil {
		return fail(err)
	}
	if p.c, err = cubind.NewMatrixLayout(c, n, m, int64(n)); err != nil {
		return fail(err)
	}
	return p, nil
}

// ltPreference bounds a heuristic search to the device's cuBLAS workspace and operands
// aligned to align bytes. The caller destroys it.
func ltPreference(align uint32) (cubind.MatmulPreference, error) {
	pref, err := cubind.NewMatmulPreference()
	if err != nil {
		return 0, err
	}
	if err := pref.SetMaxWorkspace(blasWorkspaceBytes); err != nil {
		return 0, errors.Join(err, pref.Destroy())
	}
	if err := pref.SetMinAlignment(align); err != nil {
		return 0, errors.Join(err, pref.Destroy())
	}
	return pref, nil
}

// gemmFlush is device memory read between timed runs so that L2 holds none of the
// operands: rows×gemmFlushK bf16 that a GEMV reads with x into out (zeros, at the end of
// the same allocation).
type gemmFlush struct {
	ptr, x, out cubind.DevicePtr
	rows        int
}

const gemmFlushK = 4096

// newGemmFlush allocates a flush buffer of about 2×L2, or returns nil (the timings then
// run with whatever L2 holds) when the weights alone are far larger than L2 or the memory
// is short.
func newGemmFlush(d *Device, weightBytes int) *gemmFlush {
	l2 := d.gemmTune.l2
	if l2 <= 0 || weightBytes >= 4*l2 {
		return nil
	}
	rows := (2*l2 + 2*gemmFlushK - 1) / (2 * gemmFlushK)
	n := uint64(rows*gemmFlushK*2 + 2*gemmFlushK + 2*rows)
	p, err := cubind.MemAlloc(n)
	if err != nil {
		return nil
	}
	if err := d.memset8(p, 0, n); err != nil {
		cubind.MemFree(p)
		return nil
	}
	x := p + cubind.DevicePtr(rows*gemmFlushK*2)
	return &gemmFlush{ptr: p, x: x, out: x + 2*gemmFlushK, rows: rows}
}

// run queues the read of the flush buffer.
func (f *gemmFlush) run(d *Device) error {
	if f == nil {
		return nil
	}
	return d.blas.GemmEx(cubind.OpT, cubind.OpN, f.rows, 1, gemmFlushK, 1,
		cubind.Matrix{Ptr: f.ptr, Type: cubind.R16BF, LD: gemmFlushK}, cubind.Matrix{Ptr: f.x, Type: cubind.R16BF, LD: gemmFlushK},
		0, cubind.Matrix{Ptr: f.out, Type: cubind.R16BF, LD: f.rows}, cubind.Compute32F)
}

// free releases the buffer once the stream is idle.
func (f *gemmFlush) free() error {
	if f == nil {
		return nil
	}
	return cubind.MemFree(f.ptr)
}

// timeGemms checks every candidate's result against cublasGemmEx's (cands[0]) and times
// the ones that agree, setting their us; see the comment at the top of the file.
func timeGemms(d *Device, key gemmKey, prob *gemmProblem, cands []gemmCandidate, out, x, w *Tensor) (err error) {
	fail := func(what string, err error) error {
		return fmt.Errorf("cuda: linear: tuning %s: %s: %w", key, what, err)
	}
	if err := d.stream.Synchronize(); err != nil {
		return fail("earlier work", err)
	}
	flush := newGemmFlush(d, 2*key.N*key.K)
	defer func() {
		if e := d.stream.Synchronize(); e != nil && err == nil {
			err = fail("sync", e)
		}
		if e := flush.free(); e != nil && err == nil {
			err = fail("free the flush buffer", e)
		}
	}()
	// The reference: cublasGemmEx's result, a sample of it on the host.
	n := key.M * key.N
	if err := runGemm(d, &cands[0], prob, key, out, x, w); err != nil {
		return err
	}
	ref, err := gemmSample(d, out, key.c, n)
	if err != nil {
		return fail("read the reference", err)
	}
	alive := []int{0}
	for i := 1; i < len(cands); i++ {
		c := &cands[i]
		// Poison the output (all ones: NaN in bf16 and f32) so that a candidate that writes
		// nothing cannot pass.
		if err := d.memset8(out.ptr, 0xff, uint64(out.Bytes())); err != nil {
			return fail("memset", err)
		}
		if err := runGemm(d, c, prob, key, out, x, w); err != nil {
			c.note = err.Error()
			continue
		}
		got, err := gemmSample(d, out, key.c, n)
		if err != nil {
			return fail(c.name, err)
		}
		if bad := gemmMismatch(got, ref); bad != "" {
			c.note = bad
			slog.Debug("cuda: GEMM candidate disagrees with cublasGemmEx; dropped", "shape", key.String(), "candidate", c.name, "mismatch", bad)
			continue
		}
		alive = append(alive, i)
	}
	if len(alive) == 1 {
		return nil
	}
	events := make([]cubind.Event, 2*len(cands))
	defer func() {
		for _, e := range events {
			if e != 0 {
				e.Destroy()
			}
		}
	}()
	for i := range events {
		if events[i], err = cubind.EventCreate(cubind.EventDefault); err != nil {
			return fail("events", err)
		}
	}
	times := make([][]float64, len(cands))
	rounds := gemmTuneRounds
	for r := 0; r < rounds; r++ {
		t0 := time.Now()
		for j := range alive {
			i := alive[(j+r)%len(alive)] // rotate the order: no candidate always follows the same one
			if err := flush.run(d); err != nil {
				return fail("flush L2", err)
			}
			if err := events[2*i].Record(d.stream); err != nil {
				return fail("event", err)
			}
			if err := runGemm(d, &cands[i], prob, key, out, x, w); err != nil {
				return err
			}
			if err := events[2*i+1].Record(d.stream); err != nil {
				return fail("event", err)
			}
		}
		if err := d.stream.Synchronize(); err != nil {
			return fail(fmt.Sprintf("round %d", r), err)
		}
		for _, i := range alive {
			el, err := cubind.Elapsed(events[2*i], events[2*i+1])
			if err != nil {
				return fail("elapsed time", err)
			}
			times[i] = append(times[i], el.Seconds()*1e6)
			if r == 0 {
				cands[i].first = times[i][0]
			}
		}
		if r == 0 {
			// Later rounds time only the candidates within gemmTunePrune of the fastest (and
			// cublasGemmEx, the baseline), in at most gemmTuneShapeBudget.
			fastest := math.Inf(1)
			for _, i := range alive {
				fastest = min(fastest, times[i][0])
			}
			alive = slices.DeleteFunc(alive, func(i int) bool {
				if i != 0 && times[i][0] > gemmTunePrune*fastest {
					cands[i].note = "slow in the first round"
					return true
				}
				return false
			})
			if wall := time.Since(t0); wall*time.Duration(rounds) > gemmTuneShapeBudget {
				rounds = max(2, int(gemmTuneShapeBudget/max(wall, 1)))
			}
		}
	}
	for _, i := range alive {
		slices.Sort(times[i])
		cands[i].us = times[i][len(times[i])/2]
	}
	return nil
}

// gemmSample downloads a sample of a product's n-element result of type ct as f32: all of
// it up to gemmTuneCheckElems elements, else that many from the start and 1/16 of that
// from the end.
func gemmSample(d *Device, out *Tensor, ct cubind.DataType, n int) ([]float32, error) {
	size := 2
	if ct == cubind.R32F {
		size = 4
	}
	type span struct{ off, n int }
	spans := []span{{0, n}}
	if n > gemmTuneCheckElems {
		tail := gemmTuneCheckElems / 16
		spans = []span{{0, gemmTuneCheckElems}, {n - tail, tail}}
	}
	var res []float32
	for _, s := range spans {
		p := out.ptr + cubind.DevicePtr(s.off*size)
		if ct == cubind.R32F {
			buf := make([]float32, s.n)
			if err := cubind.MemcpyDtoHAsync(buf, p, d.stream); err != nil {
				return nil, err
			}
			if err := d.stream.Synchronize(); err != nil {
				return nil, err
			}
			res = append(res, buf...)
			continue
		}
		buf := make([]uint16, s.n)
		if err := cubind.MemcpyDtoHAsync(buf, p, d.stream); err != nil {
			return nil, err
		}
		if err := d.stream.Synchronize(); err != nil {
			return nil, err
		}
		for _, b := range buf {
			res = append(res, tensor.BF16ToF32(b))
		}
	}
	return res, nil
}

// gemmMismatch compares a candidate's result with the reference's and describes the first
// disagreement ("" when none). Two correct results differ by the rounding of the output
// (a bf16 step: 2^-8 relative) and by the order of the f32 sums (split-K variants may add
// bf16-rounded partial sums): |got - ref| <= |ref|/64 + rms(ref)/16 passes, which a wrong
// or missing result does not.
func gemmMismatch(got, ref []float32) string {
	if len(got) != len(ref) {
		return fmt.Sprintf("%d elements, want %d", len(got), len(ref))
	}
	var ss float64
	finite := 0
	for _, r := range ref {
		if v := float64(r); !math.IsNaN(v) && !math.IsInf(v, 0) {
			ss += v * v
			finite++
		}
	}
	rms := 0.0
	if finite > 0 {
		rms = math.Sqrt(ss / float64(finite))
	}
	for i, r := range ref {
		g, rv := float64(got[i]), float64(r)
		gFinite, rFinite := !math.IsNaN(g) && !math.IsInf(g, 0), !math.IsNaN(rv) && !math.IsInf(rv, 0)
		if gFinite != rFinite {
			return fmt.Sprintf("element %d = %v, cublasGemmEx gives %v", i, g, rv)
		}
		if !rFinite {
			continue
		}
		if math.Abs(g-rv) > math.Abs(rv)/64+rms/16 {
			return fmt.Sprintf("element %d = %v, cublasGemmEx gives %v (rms %.3g)", i, g, rv, rms)
		}
	}
	return ""
}
