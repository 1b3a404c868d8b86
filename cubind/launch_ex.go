package cubind

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Programmatic dependent launch (PDL, compute capability 9.0 and later): a kernel launched
// with LaunchKernelPDL may start while the kernel before it on the stream is still
// running, once every block of that kernel has executed griddepcontrol.launch_dependents
// (or exited). The kernel must execute griddepcontrol.wait before it reads anything the
// previous kernel writes or writes anything it reads: the wait returns when the previous
// kernel has completed and its memory is visible. Work before the wait (address
// arithmetic, loads of constant weights) overlaps the previous kernel's tail. Captured in
// a CUDA graph, the launch becomes a programmatic edge.

// launchAttrProgrammaticStreamSerialization is CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION.
const launchAttrProgrammaticStreamSerialization = 6

// launchAttribute is CUlaunchAttribute: a 4-byte id, 4 bytes of padding, a 64-byte value
// union whose first 4 bytes hold programmaticStreamSerializationAllowed.
type launchAttribute struct {
	id    uint32
	_     uint32
	value [64]byte
}

// launchConfig is CUlaunchConfig.
type launchConfig struct {
	gridX, gridY, gridZ    uint32
	blockX, blockY, blockZ uint32
	sharedMem              uint32
	_                      uint32
	stream                 uintptr
	attrs                  *launchAttribute
	numAttrs               uint32
	_                      uint32
}

var fnLaunchKernelEx func(cfg *launchConfig, f uintptr, params, extra unsafe.Pointer) int32

// HasPDL reports whether the driver has cuLaunchKernelEx, which LaunchKernelPDL needs.
func HasPDL() bool {
	return loadDriver() == nil && fnLaunchKernelEx != nil
}

// LaunchKernelPDL is LaunchKernel with programmatic stream serialization allowed (see the
// comment above): f must wait (griddepcontrol.wait) before it touches memory the previous
// kernel on s uses. Without cuLaunchKernelEx in the driver it returns an error.
func LaunchKernelPDL(f Function, grid, block Dim3, sharedMem int, s Stream, args *Args) error {
	attrs := []launchAttribute{{id: launchAttrProgrammaticStreamSerialization}}
	attrs[0].value[0] = 1
	if err := launchEx(f, grid, block, sharedMem, s, args, attrs); err != nil {
		return fmt.Errorf("grid %v block %v shared %d: %w", grid, block, sharedMem, err)
	}
	return nil
}

// launchAttrClusterDimension is CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: the value union
// starts with the cluster's x, y, z (unsigned).
const launchAttrClusterDimension = 4

// LaunchKernelCluster launches f (compute capability 9.0 and later) in thread-block
// clusters of cluster blocks (the grid a multiple of it in each dimension), with
// programmatic stream serialization allowed when pdl is set (see LaunchKernelPDL). Without
// cuLaunchKernelEx in the driver it returns an error.
func LaunchKernelCluster(f Function, grid, block, cluster Dim3, sharedMem int, s Stream, args *Args, pdl bool) error {
	attrs := []launchAttribute{{id: launchAttrClusterDimension}, {id: launchAttrProgrammaticStreamSerialization}}
	for i, v := range []int{cluster.X, cluster.Y, cluster.Z} {
		*(*uint32)(unsafe.Pointer(&attrs[0].value[4*i])) = uint32(v)
	}
	attrs[1].value[0] = 1
	if !pdl {
		attrs = attrs[:1]
	}
	if err := launchEx(f, grid, block, sharedMem, s, args, attrs); err != nil {
		return fmt.Errorf("grid %v block %v cluster %v shared %d: %w", grid, block, cluster, sharedMem, err)
	}
	return nil
}

// launchEx calls cuLaunchKernelEx with the launch attributes attrs.
func launchEx(f Function, grid, block Dim3, sharedMem int, s Stream, args *Args, attrs []launchAttribute) error {
	if err := loadDriver(); err != nil {
		return err
	}
	if fnLaunchKernelEx == nil {
		return fmt.Errorf("cuLaunchKernelEx: not in the driver library %s", driverLib.Path)
	}
	var params unsafe.Pointer
	if args != nil {
		var err error
		if params, err = args.params(); err != nil {
			return fmt.Errorf("cuLaunchKernelEx: %w", err)
		}
	}
	cfg := &launchConfig{
		gridX: uint32(grid.X), gridY: uint32(grid.Y), gridZ: uint32(grid.Z),
		blockX: uint32(block.X), blockY: uint32(block.Y), blockZ: uint32(block.Z),
		sharedMem: uint32(sharedMem), stream: uintptr(s), attrs: &attrs[0], numAttrs: uint32(len(attrs)),
	}
	rc := fnLaunchKernelEx(cfg, uintptr(f), params, nil)
	runtime.KeepAlive(args)
	runtime.KeepAlive(cfg)
	runtime.KeepAlive(attrs)
	return driverErr("cuLaunchKernelEx", rc)
}
