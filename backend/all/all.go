// Package all registers every backend (package backend's registry): import it for its
// side effects, as cmd/loom does, so that engine.Load finds "cpu", "cuda" and "auto".
package all

import (
	_ "github.com/loom-ml/loom/backend/cpu"  // device "cpu"
	_ "github.com/loom-ml/loom/backend/cuda" // device "cuda"
)
