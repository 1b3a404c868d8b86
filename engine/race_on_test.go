//go:build race

package engine

// raceEnabled is set under the race detector, which slows the CPU kernels many times:
// tests with large matrices trim them.
const raceEnabled = true
