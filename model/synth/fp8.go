package synth

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// FP8 checkpoints. With Options.FP8 = FP8Block, synth writes Hugging Face's "fp8" format as
// Qwen3-*-FP8 and DeepSeek-V3 ship it: every linear weight of the decoder layers (attention
// q/k/v/o, MLP gate/up/down, each expert's projections) is stored as float8_e4m3fn
// (safetensors F8_E4M3) with <module>.weight_scale_inv, f32 [ceil(N/128), ceil(K/128)], one
// multiplier per 128x128 block (real weight = fp8 value * its block's scale); the embeddings,
// the LM head, the norms, the biases and the MoE routers stay bf16. config.json gets
//
//	"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
//	                        "weight_block_size": [128, 128]}
//
// and, for a mixture-of-experts shape, "modules_to_not_convert" listing each layer's router
// (transformers and Loom match those entries as substrings of a module's name, so the full
// names leave the experts' gate_proj quantized). Loom loads both: the MoE shapes' experts
// are dequantized to bf16 as they are read (model/quant_dequantize.go).

// The FP8 formats of Options.FP8.
const (
	// FP8Block is Hugging Face fp8 with 128x128 block scales (weight_scale_inv).
	FP8Block = "block"
)

// FP8Formats lists the values Options.FP8 accepts besides "" (bf16).
var FP8Formats = []string{FP8Block}

// fp8BlockSize is the rows and the columns of one block of a scale.
const fp8BlockSize = 128

// fp8ScaleSuffix names a quantized weight's scale: "<module>.weight_scale_inv".
const fp8ScaleSuffix = "weight_scale_inv"

// Validate checks the options before anything is written.
func (o Options) Validate() error {
	switch o.FP8 {
	case "", FP8Block:
	default:
		return fmt.Errorf("--fp8 %q is not supported (want %s)", o.FP8, strings.Join(FP8Formats, " or "))
	}
	return nil
}

// fp8QuantConfig is the quantization_config that FP8Block writes; routers lists the modules
// left unquantized beyond the LM head (the MoE routers).
func fp8QuantConfig(routers []string) map[string]any {
	q := map[string]any{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
		"weight_block_size": []int{fp8BlockSize, fp8BlockSize}}
	if len(routers) > 0 {
		q["modules_to_not_convert"] = routers
	}
	return q
}

// layerLinear returns the module of a param that is a linear weight [N,K] of a decoder layer
// ("model.layers.3.mlp.up_proj"), and whether it is one. Norms and biases are 1-D; the
// embeddings and the LM head are outside the layers.
func layerLinear(ref graph.ParamRef) (string, bool) {
	module, ok := strings.CutSuffix(ref.Key, ".weight")
	return module, ok && len(ref.Shape) == 2 && strings.HasPrefix(ref.Key, "model.layers.")
}

// isRouter reports whether a layer's linear module is a mixture-of-experts router
// (mlp.gate, block_sparse_moe.gate), which FP8 checkpoints keep in bf16.
func isRouter(module string) bool { return strings.HasSuffix(module, ".gate") }

// routers lists the router modules among g's params, in graph order.
func routers(g *graph.Graph) ([]string, error) {
	var out []string
	for _, n := range g.Params() {
		ref, err := graph.ParamOf(n)
		if err != nil {
			return nil, err
		}
		if m, ok := layerLinear(ref); ok && isRouter(m) {
			out = append(out, m)
		}
	}
	return out, nil
}

// quantizeBlocks quantizes the weight w [n,k] (elements of dt: bf16, f16 or f32, in
// little-endian order) to float8_e4m3fn q [n,k] with one f32 scale per block of 128x128
// (the last blocks of a row or column partial), written to scale as the little-endian bytes of
// an f32 [ceil(n/128), ceil(k/128)] in row-major order. As FP8 checkpoints are made, a block's
// scale is amax/448 in f32 and each value becomes e4m3(w/scale) rounded to nearest even,
// saturating at ±448 (an all-zero block gets scale 1). The blocks are shared among
// GOMAXPROCS workers; each holds one block in f32 at a time.
func quantizeBlocks(w []byte, dt tensor.DType, n, k int, q, scale []byte) {
	bn, bk := (n+fp8BlockSize-1)/fp8BlockSize, (k+fp8BlockSize-1)/fp8BlockSize
	blocks := bn * bk
	size := dt.Size()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), blocks) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]float32, fp8BlockSize*fp8BlockSize)
			for {
				b := int(next.Add(1)) - 1
				if b >= blocks {
					return
				}
				r0, c0 := b/bk*fp8BlockSize, b%bk*fp8BlockSize
				rows, cols := min(fp8BlockSize, n-r0), min(fp8BlockSize, k-c0)
				var amax float32
				for r := range rows {
					dst := buf[r*cols : (r+1)*cols]
					off := ((r0+r)*k + c0) * size
					decodeRow(dst, w[off:off+cols*size], dt)
					for _, v := range dst {
						amax = max(amax, float32(math.Abs(float64(v))))
					}
				}
				s := amax / tensor.F8E4M3Max
				if s == 0 {
					s = 1
				}
				binary.LittleEndian.PutUint32(scale[b*4:], math.Float32bits(s))
				for r := range rows {
					src := buf[r*cols : (r+1)*cols]
					dst := q[(r0+r)*k+c0 : (r0+r)*k+c0+cols]
					for i, v := range src {
						dst[i] = tensor.F32ToF8E4M3Fast(v / s)
					}
				}
			}
		}()
	}
	wg.Wait()
}

// decodeRow widens the little-endian elements src (of dt) into dst.
func decodeRow(dst []float32, src []byte, dt tensor.DType) {
	switch dt {
	case tensor.BF16:
		for i := range dst {
			dst[i] = tensor.BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case tensor.F16:
		for i := range dst {
			dst[i] = tensor.F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case tensor.F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	}
}
