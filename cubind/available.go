package cubind

import (
	"errors"
	"fmt"
)

// Available reports whether this machine can run Loom's CUDA backend: the driver library
// loads and initialises, at least one GPU is present, and NVRTC and cuBLAS load. The error
// says what is missing (with every path tried for a library that was not found).
func Available() error {
	if err := loadDriver(); err != nil {
		return err
	}
	n, err := DeviceCount()
	if err != nil {
		return err
	}
	if n == 0 {
		return errors.New("cubind: the CUDA driver sees no GPU")
	}
	if err := loadNVRTC(); err != nil {
		return err
	}
	if err := loadCublas(); err != nil {
		return err
	}
	return nil
}

// Describe returns a one-line summary of the CUDA stack: driver version, GPU 0 and the
// libraries opened; for logs and test output.
func Describe() string {
	if err := Available(); err != nil {
		return "CUDA unavailable: " + err.Error()
	}
	dv, _ := DriverVersion()
	d, _ := GetDevice(0)
	name, _ := d.Name()
	ma, mi, _ := d.ComputeCapability()
	nm, nn, _ := NVRTCVersion()
	nv, _ := NVRTCLibrary()
	cb, lt, _ := CublasLibrary()
	return fmt.Sprintf("driver CUDA %d.%d (%s); GPU 0 %s sm_%d%d; NVRTC %d.%d (%s); cuBLAS %s, cuBLASLt %s (version %d)",
		dv/1000, dv%1000/10, DriverLibrary(), name, ma, mi, nm, nn, nv, cb, lt, CublasLtVersion())
}
