package cubind

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// NCCL bindings (libnccl.so.2), loaded on first use and separately from the driver: a
// machine without NCCL still runs single-GPU work. The functions stay close to the C API:
// counts are in elements of the given NCCLDataType, buffers are device pointers of the
// communicator's GPU, and every call that takes a Stream only enqueues work on it.
//
// Before libnccl is opened, NCCL_NVLS_ENABLE is set to 0 in the process environment unless
// the caller set it: NVLink SHARP (NVLS) allocates multicast objects (cuMulticastCreate),
// which can take the GPUs of a shared host out of service. Loom never calls
// cuMulticastCreate itself.

// NCCLComm is an NCCL communicator (ncclComm_t): one rank of one group, bound to one GPU.
type NCCLComm uintptr

// UniqueID is an ncclUniqueId: the 128 opaque bytes that rank 0 creates with
// NCCLGetUniqueID and every rank passes to NCCLCommInitRankScalable.
type UniqueID [128]byte

// NCCLDataType is an ncclDataType_t.
type NCCLDataType int32

// NCCL element types (values of ncclDataType_t).
const (
	NCCLInt8     NCCLDataType = 0
	NCCLUint8    NCCLDataType = 1
	NCCLInt32    NCCLDataType = 2
	NCCLUint32   NCCLDataType = 3
	NCCLInt64    NCCLDataType = 4
	NCCLUint64   NCCLDataType = 5
	NCCLFloat16  NCCLDataType = 6
	NCCLFloat32  NCCLDataType = 7
	NCCLFloat64  NCCLDataType = 8
	NCCLBfloat16 NCCLDataType = 9
)

// Size is the number of bytes of one element of the type (0 for an unknown type).
func (t NCCLDataType) Size() int {
	switch t {
	case NCCLInt8, NCCLUint8:
		return 1
	case NCCLFloat16, NCCLBfloat16:
		return 2
	case NCCLInt32, NCCLUint32, NCCLFloat32:
		return 4
	case NCCLInt64, NCCLUint64, NCCLFloat64:
		return 8
	}
	return 0
}

// NCCLRedOp is an ncclRedOp_t.
type NCCLRedOp int32

// NCCL reductions (values of ncclRedOp_t).
const (
	NCCLSum  NCCLRedOp = 0
	NCCLProd NCCLRedOp = 1
	NCCLMax  NCCLRedOp = 2
	NCCLMin  NCCLRedOp = 3
	NCCLAvg  NCCLRedOp = 4
)

// NCCLResult is an ncclResult_t.
type NCCLResult int32

// NCCL status codes (values of ncclResult_t).
const (
	NCCLSuccess            NCCLResult = 0
	NCCLUnhandledCudaError NCCLResult = 1
	NCCLSystemError        NCCLResult = 2
	NCCLInternalError      NCCLResult = 3
	NCCLInvalidArgument    NCCLResult = 4
	NCCLInvalidUsage       NCCLResult = 5
	NCCLRemoteError        NCCLResult = 6
	NCCLInProgress         NCCLResult = 7
)

var ncclResultNames = [...]string{
	NCCLSuccess: "ncclSuccess", NCCLUnhandledCudaError: "ncclUnhandledCudaError",
	NCCLSystemError: "ncclSystemError", NCCLInternalError: "ncclInternalError",
	NCCLInvalidArgument: "ncclInvalidArgument", NCCLInvalidUsage: "ncclInvalidUsage",
	NCCLRemoteError: "ncclRemoteError", NCCLInProgress: "ncclInProgress",
}

// String gives the C name of the result, such as "ncclRemoteError".
func (r NCCLResult) String() string {
	if r >= 0 && int(r) < len(ncclResultNames) {
		return ncclResultNames[r]
	}
	return fmt.Sprintf("ncclResult(%d)", int32(r))
}

// NCCLSplitNoColor is the color a rank passes to NCCLComm.Split to take part in the split
// without joining any new communicator (NCCL_SPLIT_NOCOLOR).
const NCCLSplitNoColor = -1

// NCCLNVLSEnv is the NCCL variable that switches NVLink SHARP; loadNCCL sets it to 0 when
// it is unset.
const NCCLNVLSEnv = "NCCL_NVLS_ENABLE"

// NCCLConfig holds the communicator options Loom sets (a subset of ncclConfig_t; every
// other field keeps NCCL's default).
type NCCLConfig struct {
	// NonBlocking creates the communicator in non-blocking mode: initialisation, splits,
	// group ends and collectives may return ncclInProgress (IsNCCLInProgress) and finish in
	// the background; poll NCCLComm.AsyncError until it is no longer NCCLInProgress before
	// the next call. Such a communicator can be aborted at any time, initialisation included.
	NonBlocking bool
}

// ncclConfigC is the head of ncclConfig_t as NCCL 2.14 laid it out: size, magic, version,
// blocking. NCCL copies the first size bytes of the struct it is given over its defaults
// and, for a config of version 2.14, ignores every later field, so this prefix is valid
// for every NCCL release since 2.14.
type ncclConfigC struct {
	size     uint64
	magic    uint32
	version  uint32
	blocking int32
}

const (
	ncclConfigMagic   = 0xcafebeef
	ncclConfigVersion = 21400 // NCCL_VERSION(2, 14, 0)
	ncclConfigSize    = 20    // bytes of ncclConfigC up to and including blocking
)

// c returns the C layout of cfg, or nil for a nil cfg (NCCL's defaults).
func (cfg *NCCLConfig) c() *ncclConfigC {
	if cfg == nil {
		return nil
	}
	blocking := int32(1)
	if cfg.NonBlocking {
		blocking = 0
	}
	return &ncclConfigC{size: ncclConfigSize, magic: ncclConfigMagic, version: ncclConfigVersion, blocking: blocking}
}

var (
	fnNcclGetVersion           func(v *int32) int32
	fnNcclGetUniqueID          func(id *UniqueID) int32
	fnNcclCommInitAll          func(comms *uintptr, ndev int32, devlist *int32) int32
	fnNcclCommInitRankScalable func(comm *uintptr, nranks, rank, nID int32, ids *UniqueID, cfg *ncclConfigC) int32
	fnNcclCommSplit            func(comm uintptr, color, key int32, newcomm *uintptr, cfg *ncclConfigC) int32
	fnNcclCommCount            func(comm uintptr, n *int32) int32
	fnNcclCommUserRank         func(comm uintptr, r *int32) int32
	fnNcclCommCuDevice         func(comm uintptr, d *int32) int32
	fnNcclCommGetAsyncError    func(comm uintptr, r *int32) int32
	fnNcclCommAbort            func(comm uintptr) int32
	fnNcclCommFinalize         func(comm uintptr) int32
	fnNcclCommDestroy          func(comm uintptr) int32
	fnNcclGetErrorString       func(r int32) *byte
	fnNcclGetLastError         func(comm uintptr) *byte
	fnNcclAllReduce            func(send, recv uint64, count uint64, dt, op int32, comm, s uintptr) int32
	fnNcclAllGather            func(send, recv uint64, sendCount uint64, dt int32, comm, s uintptr) int32
	fnNcclReduceScatter        func(send, recv uint64, recvCount uint64, dt, op int32, comm, s uintptr) int32
	fnNcclBroadcast            func(send, recv uint64, count uint64, dt, root int32, comm, s uintptr) int32
	fnNcclSend                 func(send uint64, count uint64, dt, peer int32, comm, s uintptr) int32
	fnNcclRecv                 func(recv uint64, count uint64, dt, peer int32, comm, s uintptr) int32
	fnNcclGroupStart           func() int32
	fnNcclGroupEnd             func() int32
	ncclOnce                   sync.Once
	ncclErrLoad                error
	ncclLib                    *Library
	ncclDirsForTest            []string // replaces the default folders in tests
	ncclNamesForTest           []string // replaces the default file names in tests
)

// ncclDirs are the folders searched for libnccl after LOOM_CUDA_LIB_DIR and the system
// loader: the distribution's folders (where the libnccl2 package installs it), then the
// CUDA toolkits.
func ncclDirs() []string {
	if ncclDirsForTest != nil {
		return ncclDirsForTest
	}
	return append(systemLibDirs(), toolkitDirs()...)
}

// SetNVLSDefault sets NCCL_NVLS_ENABLE=0 in the process environment when it is unset, so
// that NCCL never creates NVLink SHARP multicast objects. It reports whether it set it.
// NCCL reads the variable when it initialises; loadNCCL calls this before opening the
// library.
func SetNVLSDefault() (bool, error) {
	if _, ok := os.LookupEnv(NCCLNVLSEnv); ok {
		return false, nil
	}
	if err := os.Setenv(NCCLNVLSEnv, "0"); err != nil {
		return false, fmt.Errorf("cubind: set %s=0: %w", NCCLNVLSEnv, err)
	}
	return true, nil
}

// loadNCCL opens libnccl and binds its functions, once.
func loadNCCL() error {
	ncclOnce.Do(func() {
		if _, err := SetNVLSDefault(); err != nil {
			ncclErrLoad = err
			return
		}
		names := []string{"libnccl.so.2", "libnccl.so"}
		if ncclNamesForTest != nil {
			names = ncclNamesForTest
		}
		lib, err := openLibrary("libnccl", names, true, ncclDirs())
		if err != nil {
			ncclErrLoad = err
			return
		}
		ncclLib = lib
		b := &binder{lib: lib}
		b.bind(&fnNcclGetVersion, "ncclGetVersion")
		b.bind(&fnNcclGetUniqueID, "ncclGetUniqueId")
		b.bind(&fnNcclCommInitAll, "ncclCommInitAll")
		b.bind(&fnNcclCommInitRankScalable, "ncclCommInitRankScalable")
		b.bind(&fnNcclCommSplit, "ncclCommSplit")
		b.bind(&fnNcclCommCount, "ncclCommCount")
		b.bind(&fnNcclCommUserRank, "ncclCommUserRank")
		b.bind(&fnNcclCommCuDevice, "ncclCommCuDevice")
		b.bind(&fnNcclCommGetAsyncError, "ncclCommGetAsyncError")
		b.bind(&fnNcclCommAbort, "ncclCommAbort")
		b.bind(&fnNcclCommFinalize, "ncclCommFinalize")
		b.bind(&fnNcclCommDestroy, "ncclCommDestroy")
		b.bind(&fnNcclGetErrorString, "ncclGetErrorString")
		b.bind(&fnNcclGetLastError, "ncclGetLastError")
		b.bind(&fnNcclAllReduce, "ncclAllReduce")
		b.bind(&fnNcclAllGather, "ncclAllGather")
		b.bind(&fnNcclReduceScatter, "ncclReduceScatter")
		b.bind(&fnNcclBroadcast, "ncclBroadcast")
		b.bind(&fnNcclSend, "ncclSend")
		b.bind(&fnNcclRecv, "ncclRecv")
		b.bind(&fnNcclGroupStart, "ncclGroupStart")
		b.bind(&fnNcclGroupEnd, "ncclGroupEnd")
		ncclErrLoad = b.err()
	})
	return ncclErrLoad
}

// NCCLAvailable reports whether libnccl loads and exports every function Loom uses; the
// error lists every path tried when it was not found.
func NCCLAvailable() error { return loadNCCL() }

// NCCLLibrary returns the path of the NCCL library that was opened, or the load error.
func NCCLLibrary() (string, error) {
	if err := loadNCCL(); err != nil {
		return "", err
	}
	return ncclLib.Path, nil
}

// ncclErr turns an ncclResult_t into an *Error (nil for ncclSuccess). The detail holds
// NCCL's text for the status and, when comm is set or for a global failure, the last error
// message NCCL recorded.
func ncclErr(call string, rc int32, comm NCCLComm) error {
	if rc == 0 {
		return nil
	}
	r := NCCLResult(rc)
	e := &Error{Call: call, Code: int(rc), Name: r.String()}
	if fnNcclGetErrorString != nil {
		if p := fnNcclGetErrorString(rc); p != nil {
			e.Detail = cString(p)
		}
	}
	if r != NCCLInProgress && fnNcclGetLastError != nil {
		if p := fnNcclGetLastError(uintptr(comm)); p != nil {
			if last := cString(p); last != "" {
				if e.Detail != "" {
					e.Detail += "; "
				}
				e.Detail += "last error: " + last
			}
		}
	}
	return e
}

// IsNCCLInProgress reports whether err is ncclInProgress: a call on a non-blocking
// communicator that goes on in the background (not a failure).
func IsNCCLInProgress(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Name == "ncclInProgress"
}

// NCCLVersion returns the version of the loaded NCCL as major*10000 + minor*100 + patch
// (22803 for 2.28.3).
func NCCLVersion() (int, error) {
	if err := loadNCCL(); err != nil {
		return 0, err
	}
	var v int32
	if err := ncclErr("ncclGetVersion", fnNcclGetVersion(&v), 0); err != nil {
		return 0, err
	}
	return int(v), nil
}

// NCCLGetUniqueID creates the identifier of a new communicator; rank 0 calls it and sends
// the bytes to every other rank. It starts NCCL's bootstrap listener in this process.
func NCCLGetUniqueID() (UniqueID, error) {
	var id UniqueID
	if err := loadNCCL(); err != nil {
		return id, err
	}
	err := ncclErr("ncclGetUniqueId", fnNcclGetUniqueID(&id), 0)
	return id, err
}

// NCCLCommInitAll creates one communicator per device of this process (ncclCommInitAll,
// blocking): comms[i] is rank i on GPU devices[i].
func NCCLCommInitAll(devices []int) ([]NCCLComm, error) {
	if err := loadNCCL(); err != nil {
		return nil, err
	}
	if len(devices) == 0 {
		return nil, fmt.Errorf("ncclCommInitAll: no devices")
	}
	devs := make([]int32, len(devices))
	for i, d := range devices {
		devs[i] = int32(d)
	}
	comms := make([]uintptr, len(devices))
	rc := fnNcclCommInitAll(&comms[0], int32(len(devs)), &devs[0])
	runtime.KeepAlive(devs)
	if err := ncclErr("ncclCommInitAll", rc, 0); err != nil {
		return nil, fmt.Errorf("devices %v: %w", devices, err)
	}
	out := make([]NCCLComm, len(comms))
	for i, c := range comms {
		out[i] = NCCLComm(c)
	}
	return out, nil
}

// CommCell is the memory into which NCCL writes a new communicator. A blocking
// initialisation or split fills it before returning; a non-blocking one (ncclInProgress)
// fills it from NCCL's background thread when it completes, which is when the parent's (or,
// for an initialisation, the new communicator's) AsyncError stops being NCCLInProgress. The
// cell is pinned (runtime.Pinner) until Release, so NCCL may write it after the call.
type CommCell struct {
	h   uintptr
	pin runtime.Pinner
}

func newCommCell() *CommCell {
	c := &CommCell{}
	c.pin.Pin(c)
	return c
}

// Comm returns the communicator NCCL wrote so far (0 before, or for NCCLSplitNoColor).
func (c *CommCell) Comm() NCCLComm { return NCCLComm(atomic.LoadUintptr(&c.h)) }

// Release unpins the cell. Call it once NCCL is done with it: the operation completed,
// failed, or the communicator was aborted (ncclCommAbort waits for initialisation).
func (c *CommCell) Release() { c.pin.Unpin() }

// NCCLCommInitRankScalable creates this process's rank of a communicator of nranks ranks
// on the current context's GPU (ncclCommInitRankScalable). ids are the unique ids of the
// communicator (usually one, from rank 0); cfg nil means NCCL's defaults. The communicator
// is in the returned cell at once (even when the call fails, it may be there to abort);
// with cfg.NonBlocking the call may return ncclInProgress: poll the communicator's
// AsyncError until initialisation ends, then Release the cell.
func NCCLCommInitRankScalable(nranks, rank int, ids []UniqueID, cfg *NCCLConfig) (*CommCell, error) {
	if err := loadNCCL(); err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("ncclCommInitRankScalable: no unique id")
	}
	cc := cfg.c()
	cell := newCommCell()
	rc := fnNcclCommInitRankScalable(&cell.h, int32(nranks), int32(rank), int32(len(ids)), &ids[0], cc)
	runtime.KeepAlive(ids)
	runtime.KeepAlive(cc)
	if err := ncclErr("ncclCommInitRankScalable", rc, 0); err != nil {
		return cell, fmt.Errorf("rank %d of %d: %w", rank, nranks, err)
	}
	return cell, nil
}

// Split creates a communicator of the ranks of c that pass the same color, ordered by key
// (ncclCommSplit); every rank of c must call it. color NCCLSplitNoColor joins no new
// communicator. cfg nil inherits c's configuration. The new communicator lands in the
// returned cell: before Split returns when c is blocking; when c is non-blocking, Split
// returns ncclInProgress and the cell is filled once c.AsyncError() is no longer
// NCCLInProgress. Release the cell then.
func (c NCCLComm) Split(color, key int, cfg *NCCLConfig) (*CommCell, error) {
	if err := loadNCCL(); err != nil {
		return nil, err
	}
	cc := cfg.c()
	cell := newCommCell()
	rc := fnNcclCommSplit(uintptr(c), int32(color), int32(key), &cell.h, cc)
	runtime.KeepAlive(cc)
	if err := ncclErr("ncclCommSplit", rc, c); err != nil {
		return cell, fmt.Errorf("color %d key %d: %w", color, key, err)
	}
	return cell, nil
}

// Count returns the number of ranks of the communicator (ncclCommCount).
func (c NCCLComm) Count() (int, error) {
	if err := loadNCCL(); err != nil {
		return 0, err
	}
	var n int32
	err := ncclErr("ncclCommCount", fnNcclCommCount(uintptr(c), &n), c)
	return int(n), err
}

// UserRank returns this rank's index in the communicator (ncclCommUserRank).
func (c NCCLComm) UserRank() (int, error) {
	if err := loadNCCL(); err != nil {
		return 0, err
	}
	var r int32
	err := ncclErr("ncclCommUserRank", fnNcclCommUserRank(uintptr(c), &r), c)
	return int(r), err
}

// CuDevice returns the GPU ordinal of the communicator (ncclCommCuDevice).
func (c NCCLComm) CuDevice() (int, error) {
	if err := loadNCCL(); err != nil {
		return 0, err
	}
	var d int32
	err := ncclErr("ncclCommCuDevice", fnNcclCommCuDevice(uintptr(c), &d), c)
	return int(d), err
}

// AsyncError returns the communicator's asynchronous state (ncclCommGetAsyncError):
// NCCLSuccess, NCCLInProgress while a non-blocking operation goes on, or the failure that
// NCCL detected in the background (NCCLRemoteError when a peer failed, ...). err reports a
// failure of the query itself.
func (c NCCLComm) AsyncError() (NCCLResult, error) {
	if err := loadNCCL(); err != nil {
		return 0, err
	}
	var r int32
	if err := ncclErr("ncclCommGetAsyncError", fnNcclCommGetAsyncError(uintptr(c), &r), c); err != nil {
		return 0, err
	}
	return NCCLResult(r), nil
}

// AsyncErr is AsyncError as an error: nil for NCCLSuccess, an *Error naming
// ncclCommGetAsyncError otherwise (IsNCCLInProgress tells an operation still going on).
func (c NCCLComm) AsyncErr() error {
	r, err := c.AsyncError()
	if err != nil {
		return err
	}
	return ncclErr("ncclCommGetAsyncError", int32(r), c)
}

// Abort stops every operation of the communicator, kernels in flight included, and frees
// it (ncclCommAbort). The communicator cannot be used afterwards.
func (c NCCLComm) Abort() error {
	if err := loadNCCL(); err != nil {
		return err
	}
	return ncclErr("ncclCommAbort", fnNcclCommAbort(uintptr(c)), 0)
}

// Finalize flushes the communicator's pending operations (ncclCommFinalize); a
// non-blocking communicator may return ncclInProgress. Destroy it afterwards.
func (c NCCLComm) Finalize() error {
	if err := loadNCCL(); err != nil {
		return err
	}
	return ncclErr("ncclCommFinalize", fnNcclCommFinalize(uintptr(c)), c)
}

// Destroy frees the communicator (ncclCommDestroy).
func (c NCCLComm) Destroy() error {
	if err := loadNCCL(); err != nil {
		return err
	}
	return ncclErr("ncclCommDestroy", fnNcclCommDestroy(uintptr(c)), 0)
}

// LastError returns NCCL's last error message for the communicator, or the global one for
// the zero NCCLComm (ncclGetLastError); "" when NCCL is not loaded.
func (c NCCLComm) LastError() string {
	if loadNCCL() != nil {
		return ""
	}
	return cString(fnNcclGetLastError(uintptr(c)))
}

// NCCLErrorString returns NCCL's text for a status (ncclGetErrorString).
func NCCLErrorString(r NCCLResult) string {
	if loadNCCL() != nil {
		return r.String()
	}
	return cString(fnNcclGetErrorString(int32(r)))
}

// NCCLAllReduce reduces count elements of send over the communicator's ranks with op and
// writes the result to recv on every rank (ncclAllReduce); send may equal recv.
func NCCLAllReduce(send, recv DevicePtr, count int, dt NCCLDataType, op NCCLRedOp, comm NCCLComm, s Stream) error {
	if err := loadNCCL(); err != nil {
		return err
	}
	return ncclErr("ncclAllReduce", fnNcclAllReduce(uint64(send), uint64(recv), uint64(count), int32(dt), int32(op), uintptr(comm), uintptr(s)), comm)
}

// NCCLAllGather concatenates sendCount elements from every rank, in rank order, into recv
// (nranks*sendCount elements) on every rank (ncclAllGather).
func NCCLAllGather(send, recv DevicePtr, sendCount int, dt NCCLDataType, comm NCCLComm, s Stream) error {
	if err := loadNCCL(); err != nil {
		return err
	}
	return ncclErr("ncclAllGather", fnNcclAllGather(uint64(send), uint64(recv), uint64(sendCount), int32(dt), uintptr(comm), uintptr(s)), comm)
}

// NCCLReduceScatter reduces nranks*recvCount elements of send over the ranks and writes
// the rank-th block of recvCount elements of the result to recv (ncclReduceScatter).
func NCCLReduceScatter(send, recv DevicePtr, recvCount int, dt NCCLDataType, op NCCLRedOp, comm NCCLComm, s Stream) error {
	if err := loadNCCL(); err != nil {
		return err
	}
	return ncclErr("ncclReduceScatter", fnNcclReduceScatter(uint64(send), uint64(recv), uint64(recvCount), int32(dt), int32(op), uintptr(comm), uintptr(s)), comm)
}

// NCCLBroadcast copies count elements of root's send into every rank's recv
// (ncclBroadcast); send is read on root only and may equal recv.
func NCCLBroadcast(send, recv DevicePtr, count int, dt NCCLDataType, root int, comm NCCLComm, s Stream) error {
	if err := loadNCCL(); err != nil {
		return err
	}
	return ncclErr("ncclBroadcast", fnNcclBroadcast(uint64(send), uint64(recv), uint64(count), int32(dt), int32(root), uintptr(comm), uintptr(s)), comm)
}

// NCCLSend sends count elements of send to rank peer (ncclSend); the peer posts the
// matching NCCLRecv. Pair sends and receives inside NCCLGroupStart/NCCLGroupEnd.
func NCCLSend(send DevicePtr, count int, dt NCCLDataType, peer int, comm NCCLComm, s Stream) error {
	if err := loadNCCL(); err != nil {
		return err
	}
	return ncclErr("ncclSend", fnNcclSend(uint64(send), uint64(count), int32(dt), int32(peer), uintptr(comm), uintptr(s)), comm)
}

// NCCLRecv receives count elements from rank peer into recv (ncclRecv).
func NCCLRecv(recv DevicePtr, count int, dt NCCLDataType, peer int, comm NCCLComm, s Stream) error {
	if err := loadNCCL(); err != nil {
		return err
	}
	return ncclErr("ncclRecv", fnNcclRecv(uint64(recv), uint64(count), int32(dt), int32(peer), uintptr(comm), uintptr(s)), comm)
}

// NCCLGroupStart opens a group of NCCL calls of this thread (ncclGroupStart): they are
// issued together at NCCLGroupEnd.
func NCCLGroupStart() error {
	if err := loadNCCL(); err != nil {
		return err
	}
	return ncclErr("ncclGroupStart", fnNcclGroupStart(), 0)
}

// NCCLGroupEnd issues the calls of the group (ncclGroupEnd); with non-blocking
// communicators it may return ncclInProgress.
func NCCLGroupEnd() error {
	if err := loadNCCL(); err != nil {
		return err
	}
	return ncclErr("ncclGroupEnd", fnNcclGroupEnd(), 0)
}

// The C layout of ncclConfigC: blocking at byte 16, after size (8), magic and version (4
// each). A wrong offset fails to compile.
var _ = [1]struct{}{}[unsafe.Offsetof(ncclConfigC{}.blocking)-16]
