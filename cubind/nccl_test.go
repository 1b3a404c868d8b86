package cubind

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/loom-ml/loom/internal/gputest"
)

// withNCCL skips the test when no GPU or no NCCL can be used (or fails it when
// LOOM_REQUIRE_GPU=1), and returns the number of GPUs.
func withNCCL(t *testing.T) int {
	t.Helper()
	requireGPU(t, 1)
	gputest.Missing(t, "NCCL", NCCLAvailable())
	n, err := DeviceCount()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestNCCLConfigLayout(t *testing.T) {
	if c := (*NCCLConfig)(nil).c(); c != nil {
		t.Errorf("nil config gives %+v, want nil (NCCL's defaults)", c)
	}
	for _, tc := range []struct {
		nonBlocking bool
		blocking    int32
	}{{false, 1}, {true, 0}} {
		c := (&NCCLConfig{NonBlocking: tc.nonBlocking}).c()
		if c.size != 20 || c.magic != 0xcafebeef || c.version != 21400 || c.blocking != tc.blocking {
			t.Errorf("NonBlocking=%v: got %+v, want size 20, magic 0xcafebeef, version 21400, blocking %d", tc.nonBlocking, *c, tc.blocking)
		}
	}
	// NCCL copies size bytes: they must end right after blocking, within the Go struct.
	if end := unsafe.Offsetof(ncclConfigC{}.blocking) + 4; end != ncclConfigSize || unsafe.Sizeof(ncclConfigC{}) < end {
		t.Errorf("blocking ends at byte %d, struct is %d bytes; size field says %d", end, unsafe.Sizeof(ncclConfigC{}), ncclConfigSize)
	}
}

func TestCommCell(t *testing.T) {
	c := newCommCell()
	if c.Comm() != 0 {
		t.Fatalf("a new cell holds %#x", c.Comm())
	}
	c.h = 0xbeef // as NCCL would write it
	if c.Comm() != 0xbeef {
		t.Errorf("Comm() = %#x, want 0xbeef", c.Comm())
	}
	c.Release()
}

func TestNCCLResultString(t *testing.T) {
	for _, tc := range []struct {
		r    NCCLResult
		want string
	}{
		{NCCLSuccess, "ncclSuccess"},
		{NCCLUnhandledCudaError, "ncclUnhandledCudaError"},
		{NCCLRemoteError, "ncclRemoteError"},
		{NCCLInProgress, "ncclInProgress"},
		{42, "ncclResult(42)"},
		{-1, "ncclResult(-1)"},
	} {
		if got := tc.r.String(); got != tc.want {
			t.Errorf("NCCLResult(%d).String() = %q, want %q", int32(tc.r), got, tc.want)
		}
	}
}

func TestNCCLDataTypeSize(t *testing.T) {
	for _, tc := range []struct {
		dt   NCCLDataType
		want int
	}{
		{NCCLInt8, 1}, {NCCLUint8, 1}, {NCCLFloat16, 2}, {NCCLBfloat16, 2}, {NCCLInt32, 4},
		{NCCLUint32, 4}, {NCCLFloat32, 4}, {NCCLInt64, 8}, {NCCLUint64, 8}, {NCCLFloat64, 8}, {99, 0},
	} {
		if got := tc.dt.Size(); got != tc.want {
			t.Errorf("NCCLDataType(%d).Size() = %d, want %d", tc.dt, got, tc.want)
		}
	}
}

func TestNCCLErrInProgress(t *testing.T) {
	// Without the library loaded the error still carries the result's name.
	err := ncclErr("ncclAllReduce", int32(NCCLInProgress), 0)
	if !IsNCCLInProgress(err) || !IsNCCLInProgress(fmt.Errorf("rank 1 of 2: %w", err)) {
		t.Errorf("IsNCCLInProgress(%v) = false, plain or wrapped", err)
	}
	err = ncclErr("ncclAllReduce", int32(NCCLRemoteError), 0)
	if IsNCCLInProgress(err) || !strings.Contains(err.Error(), "ncclAllReduce: ncclRemoteError (6)") {
		t.Errorf("got %v, want a failure naming ncclAllReduce and ncclRemoteError", err)
	}
	if IsNCCLInProgress(errors.New("ncclInProgress")) || ncclErr("x", 0, 0) != nil {
		t.Error("a plain error or success counts as in progress")
	}
}

func TestSetNVLSDefault(t *testing.T) {
	t.Setenv(NCCLNVLSEnv, "1")
	if set, err := SetNVLSDefault(); err != nil || set || os.Getenv(NCCLNVLSEnv) != "1" {
		t.Errorf("with %s=1: set=%v err=%v value %q; want the caller's value kept", NCCLNVLSEnv, set, err, os.Getenv(NCCLNVLSEnv))
	}
	os.Unsetenv(NCCLNVLSEnv)
	if set, err := SetNVLSDefault(); err != nil || !set || os.Getenv(NCCLNVLSEnv) != "0" {
		t.Errorf("unset: set=%v err=%v value %q; want it set to 0", set, err, os.Getenv(NCCLNVLSEnv))
	}
}

func TestNCCLLoadErrorListsPaths(t *testing.T) {
	saveDirs, saveNames := ncclDirsForTest, ncclNamesForTest
	t.Cleanup(func() { ncclDirsForTest, ncclNamesForTest = saveDirs, saveNames })
	ncclDirsForTest = []string{"/nonexistent-loom-nccl"}
	_, err := openLibrary("libnccl", []string{"libloomnonccl.so.2"}, true, ncclDirs())
	var le *LoadError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "/nonexistent-loom-nccl/libloomnonccl.so.2: not found") ||
		!strings.Contains(err.Error(), LibDirEnv) {
		t.Errorf("got %v, want a *LoadError listing /nonexistent-loom-nccl/libloomnonccl.so.2 and naming %s", err, LibDirEnv)
	}
	if dirs := append(systemLibDirs(), toolkitDirs()...); len(saveDirs) == 0 && len(dirs) == 0 {
		t.Error("no default folders to search for libnccl")
	}
}

// TestNCCLAllReduceInitAll runs an f32 all-reduce of ones over every GPU of the machine
// (at most 2), one goroutine per GPU, and checks each rank's result equals the number of
// ranks.
func TestNCCLAllReduceInitAll(t *testing.T) {
	n := withNCCL(t)
	if n > 2 {
		n = 2
	}
	if v := os.Getenv(NCCLNVLSEnv); v == "" {
		t.Errorf("%s is unset after NCCL loaded", NCCLNVLSEnv)
	}
	v, err := NCCLVersion()
	if err != nil || v < 22300 {
		t.Fatalf("NCCLVersion() = %d, %v; want >= 2.23 (ncclCommInitRankScalable)", v, err)
	}
	path, _ := NCCLLibrary()
	t.Logf("NCCL %d from %s, %d GPU(s)", v, path, n)
	devs := make([]int, n)
	for i := range devs {
		devs[i] = i
	}
	comms, err := NCCLCommInitAll(devs)
	if err != nil {
		t.Fatal(err)
	}
	const count = 1001
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = allReduceOnes(comms[r], r, n, count)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func allReduceOnes(c NCCLComm, rank, n, count int) (err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d, err := GetDevice(rank)
	if err != nil {
		return err
	}
	ctx, err := d.PrimaryCtxRetain()
	if err != nil {
		return err
	}
	defer d.PrimaryCtxRelease()
	if err := ctx.SetCurrent(); err != nil {
		return err
	}
	defer func() {
		if derr := c.Destroy(); err == nil {
			err = derr
		}
	}()
	if got, err := c.Count(); err != nil || got != n {
		return fmt.Errorf("ncclCommCount = %d, %v; want %d", got, err, n)
	}
	if got, err := c.UserRank(); err != nil || got != rank {
		return fmt.Errorf("ncclCommUserRank = %d, %v; want %d", got, err, rank)
	}
	if got, err := c.CuDevice(); err != nil || got != rank {
		return fmt.Errorf("ncclCommCuDevice = %d, %v; want %d", got, err, rank)
	}
	s, err := StreamCreate(StreamNonBlocking)
	if err != nil {
		return err
	}
	defer s.Destroy()
	buf, err := MemAlloc(uint64(count) * 4)
	if err != nil {
		return err
	}
	defer MemFree(buf)
	ones := make([]float32, count)
	for i := range ones {
		ones[i] = 1
	}
	if err := MemcpyHtoDAsync(buf, ones, s); err != nil {
		return err
	}
	if err := NCCLAllReduce(buf, buf, count, NCCLFloat32, NCCLSum, c, s); err != nil {
		return err
	}
	if err := s.Synchronize(); err != nil {
		return err
	}
	if r, err := c.AsyncError(); err != nil || r != NCCLSuccess {
		return fmt.Errorf("ncclCommGetAsyncError = %v, %v; want ncclSuccess", r, err)
	}
	got := make([]float32, count)
	if err := MemcpyDtoHAsync(got, buf, s); err != nil {
		return err
	}
	for i, v := range got {
		if v != float32(n) {
			return fmt.Errorf("element %d = %v, want %d", i, v, n)
		}
	}
	return nil
}
