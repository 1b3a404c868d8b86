package dist

import "fmt"

// Communicator backends: the values of the dist_backend option.
const (
	// BackendAuto picks BackendLocal on the CPU and BackendNCCL on CUDA devices.
	BackendAuto = "auto"
	// BackendLocal: ranks are goroutines of one process sharing memory (package dist/local).
	BackendLocal = "local"
	// BackendNCCL: NCCL on CUDA devices (package dist/nccl, with the GPU work).
	BackendNCCL = "nccl"
)

// ResolveBackend turns a dist_backend option ("" means auto) into the backend to use for
// device, "cpu" or "cuda".
func ResolveBackend(name, device string) (string, error) {
	switch device {
	case "cpu", "cuda":
	default:
		return "", fmt.Errorf("dist: unknown device %q (want cpu or cuda)", device)
	}
	switch name {
	case "", BackendAuto:
		if device == "cuda" {
			return BackendNCCL, nil
		}
		return BackendLocal, nil
	case BackendLocal:
		return BackendLocal, nil
	case BackendNCCL:
		if device != "cuda" {
			return "", fmt.Errorf("dist: dist_backend %q needs a cuda device, not %s", name, device)
		}
		return BackendNCCL, nil
	}
	return "", fmt.Errorf("dist: unknown dist_backend %q (want %s, %s or %s)", name, BackendAuto, BackendLocal, BackendNCCL)
}
