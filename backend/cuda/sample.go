package cuda

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

// SampleRow holds the sampling parameters of one row of logits for SampleRows: the engine's
// sample.DeviceDraw. Packed, it is 32 bytes (see SampleParams.Tensor). The parameters mean
// what they mean in package sample (temperature, then top-k, top-p and min-p each on what
// the previous one left, then one draw), with these conventions:
//
//   - Temperature <= 0 (or NaN) is greedy: the argmax, ties to the lowest index, NaN never
//     chosen, as the argmax kernel.
//   - TopK <= 0 or >= V keeps every token; TopP <= 0 or >= 1 keeps every token; MinP <= 0
//     keeps every token.
//   - Seed and Counter make the draw reproducible: the same logits, parameters, seed and
//     counter give the same token, whatever the row's position in the batch or the launch.
//     The engine passes a request's seed and the index of the token it samples.
type SampleRow = sample.DeviceDraw

// sampleRowWords is the i32 words of one packed SampleRow.
const sampleRowWords = 8

// SampleParams are the rows of one SampleRows call.
type SampleParams []SampleRow

// Tensor packs the rows into a host tensor i32 [N,8] to upload for SampleRows: per row the
// bits of Temperature, TopP and MinP, TopK, then Seed and Counter as little-endian pairs of
// words (low word first), which is the layout of struct SampleParams in kernels/sample.cu.
func (p SampleParams) Tensor() *tensor.Tensor {
	t := tensor.New(tensor.I32, len(p), sampleRowWords)
	for i, r := range p {
		w := t.I32[i*sampleRowWords : (i+1)*sampleRowWords]
		w[0] = int32(math.Float32bits(r.Temperature))
		w[1] = int32(math.Float32bits(r.TopP))
		w[2] = int32(math.Float32bits(r.MinP))
		w[3] = r.TopK
		var b [16]byte
		binary.LittleEndian.PutUint64(b[:8], r.Seed)
		binary.LittleEndian.PutUint64(b[8:], r.Counter)
		for j := range 4 {
			w[4+j] = int32(binary.LittleEndian.Uint32(b[4*j:]))
		}
	}
	return t
}

// sampleCap is the candidates per row the workspace holds (see kernels/sample.cu).
func sampleCap(V int) int { return min(V, 16384) }

// SampleWorkspace returns the bytes of scratch memory SampleRows needs for N rows of V
// logits: per row room for 16384 candidates (key and index, 8 bytes each).
func SampleWorkspace(N, V int) int64 {
	if N <= 0 || V <= 0 {
		return 0
	}
	return int64(N) * int64(sampleCap(V)) * 8
}

// SampleRows chooses one token per row of logits f32 [N,V] into ids i32 [N], by the
// parameters params (i32 [N,8] on the device, from SampleParams.Tensor), using ws (at least
// SampleWorkspace(N, V) bytes) as scratch. See SampleRow for the semantics and
// kernels/sample.cu for the method: one block per row, no full sort, weights summed in fixed
// point, and a draw by an exponential race over a counter-based hash of (seed, counter,
// token), so the result is deterministic. The call allocates nothing and never waits for the
// device; its launch depends only on N, so it can be captured in a CUDA graph.
func SampleRows(d *Device, ids, logits, params, ws *Tensor) error {
	return d.do(func() error { return sampleRows(d, ids, logits, params, ws) })
}

// rowsShape checks the operands SampleRows and GreedyRows share, logits f32 [N,V] and ids
// i32 [N], and returns N and V.
func rowsShape(ids, logits *Tensor) (N, V int, err error) {
	if logits.DType != tensor.F32 || len(logits.Shape) != 2 {
		return 0, 0, fmt.Errorf("logits must be f32 [N,V], got %s%v", logits.DType, logits.Shape)
	}
	N, V = logits.Shape[0], logits.Shape[1]
	if V <= 0 || V > math.MaxInt32/2 {
		return 0, 0, fmt.Errorf("vocabulary size %d is outside 1..%d", V, math.MaxInt32/2)
	}
	if err := checkOut("ids", ids, tensor.I32, []int{N}); err != nil {
		return 0, 0, err
	}
	return N, V, nil
}

func sampleRows(d *Device, ids, logits, params, ws *Tensor) error {
	if err := checkLive(ids, logits, params); err != nil {
		return fmt.Errorf("cuda: sample: %w", err)
	}
	N, V, err := rowsShape(ids, logits)
	if err != nil {
		return fmt.Errorf("cuda: sample: %w", err)
	}
	if err := checkOut("params", params, tensor.I32, []int{N, sampleRowWords}); err != nil {
		return fmt.Errorf("cuda: sample: %w (pack rows with SampleParams.Tensor)", err)
	}
	need := SampleWorkspace(N, V)
	if ws == nil || ws.ptr == 0 || int64(ws.Bytes()) < need {
		return fmt.Errorf("cuda: sample: workspace of %d bytes is below the %d SampleWorkspace(%d, %d) gives", wsBytes(ws), need, N, V)
	}
	if N == 0 {
		return nil
	}
	return d.launch("sample.cu", "sample_rows", cubind.Dim3{X: N, Y: 1, Z: 1}, cubind.Dim3{X: 1024, Y: 1, Z: 1}, 0, func(a *cubind.Args) {
		a.Ptr(ids.ptr).Ptr(logits.ptr).Ptr(params.ptr).Ptr(ws.ptr).I32(int32(V)).I32(int32(sampleCap(V)))
	})
}

// greedyChunks is the chunks per row GreedyRows splits N rows of V logits into: about two
// blocks per SM in all (132 SMs, a constant so that the launch depends on shapes only), at
// least 1024 logits each, at most 256 chunks.
func greedyChunks(N, V int) int {
	c := (2*132 + N - 1) / N
	c = min(c, (V+1023)/1024, 256)
	return max(c, 1)
}

// GreedyRows writes the argmax of each row of logits f32 [N,V] to ids i32 [N], exactly as
// SampleRows does for greedy rows (the lowest index of the largest logit, NaN never chosen,
// 0 when the first logit is NaN), over many blocks per row: two kernels, the first taking a
// chunk of a row per block, the second merging. ws must hold SampleWorkspace(N, V) bytes.
// Like SampleRows it allocates nothing and never waits.
func GreedyRows(d *Device, ids, logits, ws *Tensor) error {
	return d.do(func() error { return greedyRows(d, ids, logits, ws) })
}

func greedyRows(d *Device, ids, logits, ws *Tensor) error {
	if err := checkLive(ids, logits); err != nil {
		return fmt.Errorf("cuda: greedy: %w", err)
	}
	N, V, err := rowsShape(ids, logits)
	if err != nil {
		return fmt.Errorf("cuda: greedy: %w", err)
	}
	chunks := greedyChunks(N, V)
	if need := int64(N) * int64(chunks) * 8; ws == nil || ws.ptr == 0 || int64(ws.Bytes()) < need {
		return fmt.Errorf("cuda: greedy: workspace of %d bytes is below the %d it needs", wsBytes(ws), need)
	}
	if N == 0 {
		return nil
	}
	chunk := (V + chunks - 1) / chunks
	err = d.launch("sample.cu", "greedy_partial", cubind.Dim3{X: chunks, Y: N, Z: 1}, cubind.Dim3{X: 256, Y: 1, Z: 1}, 0, func(a *cubind.Args) {
		a.Ptr(ws.ptr).Ptr(logits.ptr).I32(int32(V)).I32(int32(chunk))
	})
	if err != nil {
		return err
	}
	return d.launch("sample.cu", "greedy_merge", cubind.Dim3{X: N, Y: 1, Z: 1}, cubind.Dim3{X: 32, Y: 1, Z: 1}, 0, func(a *cubind.Args) {
		a.Ptr(ids.ptr).Ptr(ws.ptr).Ptr(logits.ptr).I32(int32(V)).I32(int32(chunks))
	})
}
