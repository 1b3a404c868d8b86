//go:build !amd64 || purego

package cpu

import "runtime"

// platformKernels lists the kernel sets of this build besides the portable one: none here
// (not amd64, or the purego tag).
func platformKernels() []kernelSet { return nil }

// purego reports whether the purego build tag is set: on amd64 it is, or this file would not
// be built.
const purego = runtime.GOARCH == "amd64"

// readHalf reads every element of h and returns a fold of them (the read-bandwidth probe).
func readHalf(h []uint16) uint64 { return readHalfGo(h) }
