//go:build !linux

package cpu

import "github.com/loom-ml/loom/tensor"

// adviseHugePages does nothing where transparent huge pages cannot be asked for.
func adviseHugePages(*tensor.Tensor) {}
