//go:build !windows

package cubind

import "github.com/ebitengine/purego"

// dlopen opens a shared library (the system loader's search for a bare name) with its
// symbols bound now and visible to the libraries opened after it.
func dlopen(path string) (uintptr, error) {
	return purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
}

// dlsym is the address of a library's symbol.
func dlsym(handle uintptr, name string) (uintptr, error) { return purego.Dlsym(handle, name) }
