package cubind

import (
	"testing"
	"unsafe"
)

func TestIPCMemHandleLayout(t *testing.T) {
	if n := unsafe.Sizeof(IPCMemHandle{}); n != 64 {
		t.Errorf("IPCMemHandle is %d bytes; CUipcMemHandle is 64", n)
	}
}

// TestPeerBindings checks the peer-access and IPC bindings that one GPU can exercise; the
// two-GPU and two-process paths are tested by backend/cuda's peer all-reduce tests.
func TestPeerBindings(t *testing.T) {
	d := withGPU(t)
	id, err := d.PCIBusID()
	if err != nil {
		t.Fatal(err)
	}
	back, err := DeviceByPCIBusID(id)
	if err != nil {
		t.Fatal(err)
	}
	if back != d {
		t.Errorf("DeviceByPCIBusID(%q) = %d, want %d", id, back, d)
	}
	if _, err := DeviceByPCIBusID("ffff:ff:1f.7"); err == nil {
		t.Error("DeviceByPCIBusID of a bus id with no GPU: no error")
	}
	n, err := DeviceCount()
	if err != nil {
		t.Fatal(err)
	}
	for o := range n {
		peer, err := GetDevice(o)
		if err != nil {
			t.Fatal(err)
		}
		if peer == d {
			continue
		}
		can, err := d.CanAccessPeer(peer)
		if err != nil {
			t.Errorf("CanAccessPeer(%d): %v", o, err)
		}
		t.Logf("GPU %d -> GPU %d: peer access %v", d, o, can)
	}

	s, err := StreamCreate(StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	if done, err := s.Query(); err != nil || !done {
		t.Errorf("Query of an idle stream = %v, %v; want true, nil", done, err)
	}

	p, err := MemAlloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer MemFree(p)
	h, err := IPCGetMemHandle(p)
	if err != nil {
		t.Fatal(err)
	}
	if h == (IPCMemHandle{}) {
		t.Error("IPCGetMemHandle gave an all-zero handle")
	}
}
