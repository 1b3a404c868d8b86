package cubind

import "errors"

// errNoCUDAHere is what opening a CUDA library gives on Windows, where Loom runs on the CPU
// only: CUDA is loaded through dlopen, on Linux.
var errNoCUDAHere = errors.New("CUDA libraries are loaded on Linux only; on Windows Loom runs on the CPU")

func dlopen(string) (uintptr, error) { return 0, errNoCUDAHere }

func dlsym(uintptr, string) (uintptr, error) { return 0, errNoCUDAHere }
