//go:build !linux

package cpu

// residentPages is not available off Linux.
func residentPages([]byte) (int64, bool) { return 0, false }
