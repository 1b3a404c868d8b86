package engine

// Every backend is registered for the tests: the CPU's, which engine imports itself, and
// CUDA's, which the GPU tests load through engine.Load with Device "cuda" (they skip
// without a GPU).
import _ "github.com/loom-ml/loom/backend/all"
