package cpu

import "math"

// siluScalar is silu as the reference kernels compute it: in float64, rounded to float32.
func siluScalar(x float32) float32 {
	return float32(float64(x) / (1 + math.Exp(-float64(x))))
}
