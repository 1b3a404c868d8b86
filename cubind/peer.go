package cubind

import (
	"errors"
	"fmt"
)

// Peer access and CUDA IPC: what a custom all-reduce needs to read and write the memory of
// other GPUs over NVLink, in this process (peer access between contexts) or in another
// process (IPC memory handles). loadDriver binds them with the rest of the driver API.
//
// Loom never binds the multicast API (cuMulticast*): multicast objects can take a shared
// host's GPUs out of service.

// IPCMemHandle identifies a device allocation to another process (CUipcMemHandle, 64
// opaque bytes). Send it to the other process by any channel; OpenIPCMemHandle maps it.
type IPCMemHandle struct {
	Reserved [64]byte
}

// Driver status codes of the peer-access calls.
const (
	CudaErrorPeerAccessAlreadyEnabled = 704 // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
	CudaErrorPeerAccessUnsupported    = 217 // CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
)

// IPCMemLazyEnablePeerAccess is CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, the flag of
// OpenIPCMemHandle that enables peer access to the exporting device when needed.
const IPCMemLazyEnablePeerAccess = 1

var (
	fnDeviceCanAccessPeer  func(can *int32, d, peer int32) int32
	fnCtxEnablePeerAccess  func(peer uintptr, flags uint32) int32
	fnCtxDisablePeerAccess func(peer uintptr) int32
	fnIpcGetMemHandle      func(h *IPCMemHandle, p uint64) int32
	fnIpcOpenMemHandle     func(p *uint64, h IPCMemHandle, flags uint32) int32
	fnIpcCloseMemHandle    func(p uint64) int32
	fnStreamQuery          func(s uintptr) int32
	fnDeviceGetPCIBusID    func(id *byte, n int32, d int32) int32
	fnDeviceGetByPCIBusID  func(d *int32, id *byte) int32
)

// bindPeer binds the peer-access and IPC functions; loadDriver calls it with the rest.
func bindPeer(b *binder) {
	b.bind(&fnDeviceCanAccessPeer, "cuDeviceCanAccessPeer")
	b.bind(&fnCtxEnablePeerAccess, "cuCtxEnablePeerAccess")
	b.bind(&fnCtxDisablePeerAccess, "cuCtxDisablePeerAccess")
	b.bind(&fnIpcGetMemHandle, "cuIpcGetMemHandle")
	b.bind(&fnIpcOpenMemHandle, "cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle")
	b.bind(&fnIpcCloseMemHandle, "cuIpcCloseMemHandle")
	b.bind(&fnStreamQuery, "cuStreamQuery")
	b.bind(&fnDeviceGetPCIBusID, "cuDeviceGetPCIBusId")
	b.bind(&fnDeviceGetByPCIBusID, "cuDeviceGetByPCIBusId")
}

// CanAccessPeer reports whether contexts on d can map the memory of GPU peer
// (cuDeviceCanAccessPeer).
func (d Device) CanAccessPeer(peer Device) (bool, error) {
	if err := loadDriver(); err != nil {
		return false, err
	}
	var can int32
	if err := driverErr("cuDeviceCanAccessPeer", fnDeviceCanAccessPeer(&can, int32(d), int32(peer))); err != nil {
		return false, err
	}
	return can != 0, nil
}

// PCIBusID returns the device's PCI bus id, such as "0000:19:00.0" (cuDeviceGetPCIBusId).
// It names one GPU the same way in every process, whatever CUDA_VISIBLE_DEVICES says.
func (d Device) PCIBusID() (string, error) {
	if err := loadDriver(); err != nil {
		return "", err
	}
	buf := make([]byte, 64)
	if err := driverErr("cuDeviceGetPCIBusId", fnDeviceGetPCIBusID(&buf[0], int32(len(buf)), int32(d))); err != nil {
		return "", err
	}
	return cString(&buf[0]), nil
}

// DeviceByPCIBusID returns the device of a PCI bus id, if this process can see it
// (cuDeviceGetByPCIBusId).
func DeviceByPCIBusID(id string) (Device, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var d int32
	if err := driverErr("cuDeviceGetByPCIBusId", fnDeviceGetByPCIBusID(&d, cStr(id))); err != nil {
		return 0, fmt.Errorf("PCI bus id %q: %w", id, err)
	}
	return Device(d), nil
}

// EnablePeerAccess lets the current context access the memory of the context peer (of
// another GPU) (cuCtxEnablePeerAccess). Access is one-way: enable it from both sides for
// two GPUs to reach each other. Enabling it again is not an error.
func EnablePeerAccess(peer Context) error {
	if err := loadDriver(); err != nil {
		return err
	}
	rc := fnCtxEnablePeerAccess(uintptr(peer), 0)
	if rc == CudaErrorPeerAccessAlreadyEnabled {
		return nil
	}
	return driverErr("cuCtxEnablePeerAccess", rc)
}

// DisablePeerAccess undoes EnablePeerAccess for the current context
// (cuCtxDisablePeerAccess).
func DisablePeerAccess(peer Context) error {
	if err := loadDriver(); err != nil {
		return err
	}
	return driverErr("cuCtxDisablePeerAccess", fnCtxDisablePeerAccess(uintptr(peer)))
}

// IPCGetMemHandle returns the IPC handle of an allocation made by MemAlloc
// (cuIpcGetMemHandle). The handle names the whole allocation: p should be its start, since
// the importer gets the allocation's base address.
func IPCGetMemHandle(p DevicePtr) (IPCMemHandle, error) {
	if err := loadDriver(); err != nil {
		return IPCMemHandle{}, err
	}
	var h IPCMemHandle
	if err := driverErr("cuIpcGetMemHandle", fnIpcGetMemHandle(&h, uint64(p))); err != nil {
		return IPCMemHandle{}, err
	}
	return h, nil
}

// OpenIPCMemHandle maps into the current context an allocation that another process
// exported with IPCGetMemHandle (cuIpcOpenMemHandle_v2), with flags 0 or
// IPCMemLazyEnablePeerAccess. A process cannot open its own handles. Pair it with
// CloseIPCMemHandle.
func OpenIPCMemHandle(h IPCMemHandle, flags uint32) (DevicePtr, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var p uint64
	if err := driverErr("cuIpcOpenMemHandle_v2", fnIpcOpenMemHandle(&p, h, flags)); err != nil {
		return 0, err
	}
	return DevicePtr(p), nil
}

// CloseIPCMemHandle unmaps memory mapped by OpenIPCMemHandle (cuIpcCloseMemHandle).
func CloseIPCMemHandle(p DevicePtr) error {
	if err := loadDriver(); err != nil {
		return err
	}
	return driverErr("cuIpcCloseMemHandle", fnIpcCloseMemHandle(uint64(p)))
}

// Query reports whether all work queued on s has finished (cuStreamQuery), without
// waiting. An error of the queued work is returned as an error.
func (s Stream) Query() (bool, error) {
	if err := loadDriver(); err != nil {
		return false, err
	}
	return queryResult("cuStreamQuery", fnStreamQuery(uintptr(s)))
}

// IsPeerAccessUnsupported reports whether err says that two GPUs cannot reach each other's
// memory.
func IsPeerAccessUnsupported(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == CudaErrorPeerAccessUnsupported
}
