package llama

import (
	"fmt"
	"math"

	"github.com/loom-ml/loom/model"
)

// invFreq returns the rotary inverse frequencies for a head of size dim, as Hugging Face's
// rope initialisation functions compute them (default, linear and llama3 types), and the
// attention scaling that multiplies cos and sin (1 for these types).
//
//	default: inv[i] = 1 / theta^(2i/dim), i < dim/2
//	linear:  inv[i] / factor
//	llama3:  long wavelengths (> original_max/low_freq_factor) divided by factor, short ones
//	         (< original_max/high_freq_factor) kept, the band between interpolated smoothly.
//
// transformers keeps inv_freq in float32 whatever the checkpoint's dtype (from_pretrained
// with a bf16 dtype does not round the buffer) and computes it with float32 tensor ops, so
// every step below is rounded to float32 as torch rounds it; the angles position * inv_freq
// and their cos and sin are float32 too (graph.DecomposeRotaryTables) and only the tables are
// cast to the activation dtype. Rounding inv_freq to bf16 instead moves the angle at position
// p by up to p * 2^-9 * inv_freq: scrambled positions at long contexts.
func invFreq(r model.RopeConfig, dim int) ([]float64, float64, error) {
	if dim <= 0 || dim%2 != 0 {
		return nil, 0, fmt.Errorf("rotary dimension %d must be even and positive", dim)
	}
	theta := r.Theta
	if theta <= 0 {
		return nil, 0, fmt.Errorf("rope_theta must be positive, got %g", theta)
	}
	inv := make([]float32, dim/2)
	for i := range inv {
		// arange(0, dim, 2).float() / dim, then base ** x, then 1 / y (torch's 1/y is
		// reciprocal(y) in float32).
		e := float32(2*i) / float32(dim)
		p := float32(math.Pow(float64(float32(theta)), float64(e)))
		inv[i] = 1 / p
	}
	switch r.Type {
	case "", "default":
	case "linear":
		if r.Factor <= 0 {
			return nil, 0, fmt.Errorf("rope scaling type linear needs a positive factor, got %g", r.Factor)
		}
		for i := range inv {
			inv[i] /= float32(r.Factor)
		}
	case "llama3":
		if r.Factor <= 0 || r.OriginalMaxPositionEmbeddings <= 0 || r.HighFreqFactor <= r.LowFreqFactor {
			return nil, 0, fmt.Errorf("rope scaling type llama3 needs factor > 0, original_max_position_embeddings > 0 and high_freq_factor > low_freq_factor; got %+v", r)
		}
		llama3Scale(inv, r)
	default:
		return nil, 0, fmt.Errorf("rope scaling type %q is not supported (supported: default, linear, llama3)", r.Type)
	}
	out := make([]float64, len(inv))
	for i, f := range inv {
		out[i] = float64(f)
	}
	return out, 1, nil
}

// llama3Scale applies Llama 3.1's frequency scaling to inv in place, step for step as
// transformers' _compute_llama3_parameters does in float32 tensor arithmetic: a Python scalar
// divided by a tensor is reciprocal(tensor) * scalar, and the scalars (wavelength bounds,
// factors) enter as float32. Each product is converted explicitly so that Go never fuses it
// into an FMA that torch does not do.
func llama3Scale(inv []float32, r model.RopeConfig) {
	old := float64(r.OriginalMaxPositionEmbeddings)
	lowWave, highWave := float32(old/r.LowFreqFactor), float32(old/r.HighFreqFactor)
	factor, low := float32(r.Factor), float32(r.LowFreqFactor)
	span := float32(r.HighFreqFactor - r.LowFreqFactor)
	for i, f := range inv {
		wave := float32((1 / f) * float32(2*math.Pi))
		scaled := f
		if wave > lowWave {
			scaled = f / factor
		}
		if !(wave < highWave) && !(wave > lowWave) {
			smooth := (float32((1/wave)*float32(old)) - low) / span
			a := float32((1-smooth)*scaled) / factor
			scaled = a + float32(smooth*scaled)
		}
		inv[i] = scaled
	}
}
