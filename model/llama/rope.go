package llama

import (
	"fmt"
	"math"

	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/tensor"
)

// invFreq returns the rotary inverse frequencies for a head of size dim, as Hugging Face's
// rope initialisation functions compute them (default, linear and llama3 types), and the
// attention scaling that multiplies cos and sin (1 for these types).
//
//	default: inv[i] = 1 / theta^(2i/dim), i < dim/2
//	linear:  inv[i] / factor
//	llama3:  long wavelengths (> original_max/low_freq_factor) divided by factor, short ones
//	         (< original_max/high_freq_factor) kept, the band between interpolated smoothly.
func invFreq(r model.RopeConfig, dim int) ([]float64, float64, error) {
	if dim <= 0 || dim%2 != 0 {
		return nil, 0, fmt.Errorf("rotary dimension %d must be even and positive", dim)
	}
	theta := r.Theta
	if theta <= 0 {
		return nil, 0, fmt.Errorf("rope_theta must be positive, got %g", theta)
	}
	inv := make([]float64, dim/2)
	for i := range inv {
		// Hugging Face computes this in float32: arange(0, dim, 2) / dim, then base ** x, then 1 / y.
		e := float32(float32(2*i) / float32(dim))
		p := float32(math.Pow(theta, float64(e)))
		inv[i] = float64(float32(1) / p)
	}
	switch r.Type {
	case "", "default":
	case "linear":
		if r.Factor <= 0 {
			return nil, 0, fmt.Errorf("rope scaling type linear needs a positive factor, got %g", r.Factor)
		}
		for i := range inv {
			inv[i] = float64(float32(inv[i]) / float32(r.Factor))
		}
	case "llama3":
		if r.Factor <= 0 || r.OriginalMaxPositionEmbeddings <= 0 || r.HighFreqFactor <= r.LowFreqFactor {
			return nil, 0, fmt.Errorf("rope scaling type llama3 needs factor > 0, original_max_position_embeddings > 0 and high_freq_factor > low_freq_factor; got %+v", r)
		}
		old := float64(r.OriginalMaxPositionEmbeddings)
		lowWave, highWave := old/r.LowFreqFactor, old/r.HighFreqFactor
		for i, f := range inv {
			wave := 2 * math.Pi / f
			scaled := f
			if wave > lowWave {
				scaled = f / r.Factor
			}
			if !(wave < highWave) && !(wave > lowWave) {
				smooth := (old/wave - r.LowFreqFactor) / (r.HighFreqFactor - r.LowFreqFactor)
				scaled = (1-smooth)*scaled/r.Factor + smooth*scaled
			}
			inv[i] = float64(float32(scaled))
		}
	default:
		return nil, 0, fmt.Errorf("rope scaling type %q is not supported (supported: default, linear, llama3)", r.Type)
	}
	return inv, 1, nil
}

// roundTo rounds values to the precision of dt (bf16 or f16); other dtypes leave them as they are.
func roundTo(xs []float64, dt tensor.DType) []float64 {
	for i, x := range xs {
		switch dt {
		case tensor.BF16:
			xs[i] = float64(tensor.BF16ToF32(tensor.F32ToBF16(float32(x))))
		case tensor.F16:
			xs[i] = float64(tensor.F16ToF32(tensor.F32ToF16(float32(x))))
		}
	}
	return xs
}
