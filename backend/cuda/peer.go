package cuda

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/loom-ml/loom/cubind"
)

// A custom "one-shot" all-reduce for small messages over NVLink, through CUDA peer access
// (GPUs of one process) or CUDA IPC (GPUs of several processes), like vLLM's and
// TensorRT-LLM's custom all-reduce: every rank writes its input into a buffer of every rank
// (all ranks map each other's), whose elements read as empty until written, then every rank
// waits for the values in its own buffer and reduces them, in rank order, so that all ranks
// get bit-identical results. One kernel, one crossing of NVLink, no flags, no host
// synchronisation, nothing allocated per call: it can be captured in a CUDA graph and
// replayed. kernels/allreduce.cu gives the protocol and why it is safe.
//
// Every rank must make the same calls in the same order with the same sizes (as with any
// collective); a rank that never comes makes the others wait PeerTimeout, after which the
// group is unusable and Check reports the missing rank.

// PeerMaxRanks is the most ranks a peer group may have.
const PeerMaxRanks = 8

// PeerTimeout is how long a kernel waits for a peer's values before it gives up and marks the group
// broken (see PeerRank.Check).
const PeerTimeout = 30 * time.Second

// Layout of each rank's peer allocation (kernels/allreduce.cu describes the use).
const (
	peerMaxBlocks  = 256                              // blocks of one call, at most (a counter each)
	peerDataOffset = 4096                             // ctl words before the buffers
	peerBuffers    = 3                                // buffers of nranks slots each
	peerEmpty      = 0xffffffff                       // what an empty slot holds, per 32 bits
	peerArgsBytes  = PeerMaxRanks*8 + 8 + 8 + 8 + 4*2 // struct PeerArgs
	peerThreads    = 512                              // threads per block of the plain all-reduce, at most
)

// peerKernels are the kernels of allreduce.cu, compiled when a rank is set up so that no call
// compiles (nor loads a module, which a graph capture forbids).
var peerKernels = func() []string {
	ks := []string{"allreduce_f32", "allreduce_bf16"}
	for _, x := range []string{"f32", "bf16"} {
		for _, r := range []string{"f32", "bf16"} {
			for _, w := range []string{"f32", "bf16"} {
				ks = append(ks, "ar_add_rmsnorm_"+x+"_"+r+"_"+w, "ar_add_rmsnorm_"+x+"_"+r+"_"+w+"_vec")
			}
		}
	}
	return ks
}()

// PeerGroup is a set of GPUs of this process, one rank each, that all-reduce through each
// other's memory (peer access over NVLink). Use Rank(i) from the goroutine that drives GPU i.
type PeerGroup struct {
	ranks []*PeerRank
}

// PeerRank is one rank of a peer group: its device, its buffer and the addresses of every
// rank's buffer as its GPU sees them. Its methods queue work on the device's stream, like
// Device's; one goroutine should drive a rank.
type PeerRank struct {
	dev      *Device
	rank     int
	size     int
	maxBytes int
	slot     uint64             // bytes of one slot: one rank's values of one call
	own      cubind.DevicePtr   // this rank's allocation
	bases    []cubind.DevicePtr // every rank's allocation as this rank's GPU addresses it
	opened   []cubind.DevicePtr // IPC mappings of the other ranks' allocations, to close
	params   []byte             // struct PeerArgs
	threads  int                // threads per block of the plain all-reduce; 0: peerBlockSize
	group    *PeerGroup         // nil for a rank of NewPeerRankIPC
	exchange Exchange           // for a rank of NewPeerRankIPC: the barrier of Close
}

// peerSlot is the size of one slot for messages of up to maxBytes.
func peerSlot(maxBytes int) uint64 { return (uint64(maxBytes) + 255) &^ 255 }

// peerDataBytes is the size of a rank's buffers: three of size slots.
func (r *PeerRank) peerDataBytes() uint64 { return peerBuffers * uint64(r.size) * r.slot }

// NewPeerGroup makes devs (distinct GPUs of this process, at most PeerMaxRanks) a peer group
// for messages of up to maxBytes bytes: rank i is devs[i]. It enables peer access between
// every pair of GPUs, failing with an error naming the pair that cannot reach each other, and
// allocates on each GPU 3*len(devs)*maxBytes (maxBytes rounded up to 256) plus 4 KiB.
func NewPeerGroup(devs []*Device, maxBytes int) (*PeerGroup, error) {
	if len(devs) == 0 || len(devs) > PeerMaxRanks {
		return nil, fmt.Errorf("cuda: peer group: %d devices; want 1 to %d", len(devs), PeerMaxRanks)
	}
	if maxBytes <= 0 {
		return nil, fmt.Errorf("cuda: peer group: maxBytes %d; want > 0", maxBytes)
	}
	for i, d := range devs {
		if d == nil {
			return nil, fmt.Errorf("cuda: peer group: device of rank %d is nil", i)
		}
		for j := range i {
			if devs[j].dev == d.dev {
				return nil, fmt.Errorf("cuda: peer group: ranks %d and %d are both GPU %d", j, i, d.ordinal)
			}
		}
	}
	for i, d := range devs {
		for j, e := range devs {
			if i == j {
				continue
			}
			ok, err := d.dev.CanAccessPeer(e.dev)
			if err != nil {
				return nil, fmt.Errorf("cuda: peer group: can GPU %d (rank %d) access GPU %d (rank %d): %w", d.ordinal, i, e.ordinal, j, err)
			}
			if !ok {
				return nil, fmt.Errorf("cuda: peer group: GPU %d (rank %d) cannot access the memory of GPU %d (rank %d) (cuDeviceCanAccessPeer: no peer access, no NVLink or PCIe P2P between them)", d.ordinal, i, e.ordinal, j)
			}
			if err := d.do(func() error { return cubind.EnablePeerAccess(e.ctx) }); err != nil {
				return nil, fmt.Errorf("cuda: peer group: enable access of GPU %d (rank %d) to GPU %d (rank %d): %w", d.ordinal, i, e.ordinal, j, err)
			}
		}
	}
	g := &PeerGroup{}
	slot := peerSlot(maxBytes)
	bases := make([]cubind.DevicePtr, len(devs))
	for i, d := range devs {
		r := &PeerRank{dev: d, rank: i, size: len(devs), maxBytes: maxBytes, slot: slot, group: g}
		g.ranks = append(g.ranks, r)
		if err := r.setup(); err != nil {
			g.Close()
			return nil, fmt.Errorf("cuda: peer group: rank %d (GPU %d): %w", i, d.ordinal, err)
		}
		bases[i] = r.own
	}
	for _, r := range g.ranks {
		r.bases = bases
		r.params = peerParams(bases, slot, r.rank, PeerTimeout)
	}
	return g, nil
}

// setup compiles the kernels, allocates the rank's memory, zeroes its control words, marks
// its buffers empty and waits for that.
func (r *PeerRank) setup() error {
	d := r.dev
	return d.do(func() error {
		for _, k := range peerKernels {
			if _, err := d.function("allreduce.cu", "", k); err != nil {
				return err
			}
		}
		p, err := cubind.MemAlloc(peerDataOffset + r.peerDataBytes())
		if err != nil {
			return err
		}
		r.own = p
		if err := d.memset8(p, 0, peerDataOffset); err != nil {
			return err
		}
		if err := d.memset32(p+peerDataOffset, peerEmpty, r.peerDataBytes()/4); err != nil {
			return err
		}
		return d.stream.Synchronize()
	})
}

// peerParams encodes struct PeerArgs for rank, given every rank's allocation as the rank's
// GPU addresses it.
func peerParams(bases []cubind.DevicePtr, slot uint64, rank int, timeout time.Duration) []byte {
	b := make([]byte, 0, peerArgsBytes)
	for i := range PeerMaxRanks {
		var p uint64
		if i < len(bases) {
			p = uint64(bases[i]) + peerDataOffset
		}
		b = binary.LittleEndian.AppendUint64(b, p)
	}
	b = binary.LittleEndian.AppendUint64(b, uint64(bases[rank]))
	b = binary.LittleEndian.AppendUint64(b, slot)
	b = binary.LittleEndian.AppendUint64(b, uint64(timeout.Nanoseconds()))
	b = binary.LittleEndian.AppendUint32(b, uint32(rank))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(bases)))
	return b
}

// Size is the number of ranks.
func (g *PeerGroup) Size() int { return len(g.ranks) }

// Rank returns rank i (0 <= i < Size()).
func (g *PeerGroup) Rank(i int) *PeerRank { return g.ranks[i] }

// Close waits for the work queued on every rank's device and frees the group's buffers.
// Nothing may use the group afterwards. Peer access stays enabled.
func (g *PeerGroup) Close() error {
	var errs []error
	for _, r := range g.ranks {
		if err := r.dev.Sync(); err != nil {
			errs = append(errs, fmt.Errorf("rank %d: %w", r.rank, err))
		}
	}
	for _, r := range g.ranks {
		if err := r.free(); err != nil {
			errs = append(errs, fmt.Errorf("rank %d: %w", r.rank, err))
		}
	}
	g.ranks = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cuda: close peer group: %w", err)
	}
	return nil
}

// free unmaps the IPC mappings and frees the rank's allocation.
func (r *PeerRank) free() error {
	return r.dev.do(func() error {
		var errs []error
		if err := r.dev.stream.Synchronize(); err != nil {
			errs = append(errs, err)
		}
		for _, p := range r.opened {
			errs = append(errs, cubind.CloseIPCMemHandle(p))
		}
		r.opened = nil
		if r.own != 0 {
			errs = append(errs, cubind.MemFree(r.own))
			r.own = 0
		}
		return errors.Join(errs...)
	})
}

// Exchange hands this rank's bytes to every rank of a group and returns every rank's bytes,
// in rank order (its own included), by whatever channel the ranks share (a pipe, a TCP
// connection, a key-value store, dist's communicator ...). Every rank calls it the same number
// of times; a call with nil is a barrier.
type Exchange func(ctx context.Context, mine []byte) (all [][]byte, err error)

// peerMagic starts every rank's exchanged description.
var peerMagic = []byte("loom-peer-ipc-v1")

// peerDesc is what a rank of NewPeerRankIPC tells the others.
type peerDesc struct {
	rank, size, maxBytes int
	pid                  int
	busID                string
	handle               cubind.IPCMemHandle
}

func (p peerDesc) encode() []byte {
	b := append([]byte{}, peerMagic...)
	for _, v := range []int{p.rank, p.size, p.maxBytes, p.pid} {
		b = binary.LittleEndian.AppendUint64(b, uint64(v))
	}
	var id [32]byte
	copy(id[:], p.busID)
	b = append(b, id[:]...)
	return append(b, p.handle.Reserved[:]...)
}

func decodePeerDesc(b []byte) (peerDesc, error) {
	var p peerDesc
	if len(b) != len(peerMagic)+4*8+32+64 || !bytes.HasPrefix(b, peerMagic) {
		return p, fmt.Errorf("not a peer description (%d bytes)", len(b))
	}
	b = b[len(peerMagic):]
	v := make([]int, 4)
	for i := range v {
		v[i] = int(binary.LittleEndian.Uint64(b[8*i:]))
	}
	p.rank, p.size, p.maxBytes, p.pid = v[0], v[1], v[2], v[3]
	b = b[32:]
	p.busID = string(bytes.TrimRight(b[:32], "\x00"))
	copy(p.handle.Reserved[:], b[32:])
	return p, nil
}

// NewPeerRankIPC makes d rank `rank` of a peer group of `size` ranks in as many processes,
// for messages of up to maxBytes bytes (the same on every rank). Each process calls it with
// its own rank at about the same time: it allocates this rank's buffer, exports it as a CUDA
// IPC handle, hands it to the other ranks through exchange, maps theirs
// (cuIpcOpenMemHandle), and returns once every rank has. Ranks of one process cannot map each
// other's handles: use NewPeerGroup for them. Close the rank with Close on every rank.
func NewPeerRankIPC(ctx context.Context, d *Device, rank, size, maxBytes int, exchange Exchange) (*PeerRank, error) {
	if size < 1 || size > PeerMaxRanks || rank < 0 || rank >= size {
		return nil, fmt.Errorf("cuda: peer rank %d of %d: want 0 <= rank < size <= %d", rank, size, PeerMaxRanks)
	}
	if maxBytes <= 0 {
		return nil, fmt.Errorf("cuda: peer rank %d: maxBytes %d; want > 0", rank, maxBytes)
	}
	r := &PeerRank{dev: d, rank: rank, size: size, maxBytes: maxBytes, slot: peerSlot(maxBytes), exchange: exchange}
	fail := func(err error) (*PeerRank, error) {
		r.free()
		return nil, fmt.Errorf("cuda: peer rank %d of %d (GPU %d): %w", rank, size, d.ordinal, err)
	}
	if err := r.setup(); err != nil {
		return fail(err)
	}
	me := peerDesc{rank: rank, size: size, maxBytes: maxBytes, pid: os.Getpid()}
	var err error
	if me.busID, err = d.dev.PCIBusID(); err != nil {
		return fail(err)
	}
	if err := d.do(func() error {
		var err error
		me.handle, err = cubind.IPCGetMemHandle(r.own)
		return err
	}); err != nil {
		return fail(err)
	}
	all, err := exchange(ctx, me.encode())
	if err != nil {
		return fail(fmt.Errorf("exchange IPC handles: %w", err))
	}
	if len(all) != size {
		return fail(fmt.Errorf("exchange IPC handles: got %d descriptions, want %d", len(all), size))
	}
	descs := make([]peerDesc, size)
	for q, b := range all {
		p, err := decodePeerDesc(b)
		if err != nil {
			return fail(fmt.Errorf("rank %d's description: %w", q, err))
		}
		if p.rank != q || p.size != size || p.maxBytes != maxBytes {
			return fail(fmt.Errorf("rank %d describes itself as rank %d of %d with maxBytes %d; want rank %d of %d with maxBytes %d",
				q, p.rank, p.size, p.maxBytes, q, size, maxBytes))
		}
		if q != rank && p.pid == me.pid {
			return fail(fmt.Errorf("rank %d is in this process too; a process cannot open its own IPC handles: use NewPeerGroup", q))
		}
		descs[q] = p
	}
	bases := make([]cubind.DevicePtr, size)
	bases[rank] = r.own
	for q, p := range descs {
		if q == rank {
			continue
		}
		if pd, err := cubind.DeviceByPCIBusID(p.busID); err == nil {
			if pd == d.dev {
				return fail(fmt.Errorf("rank %d uses the same GPU (%s)", q, p.busID))
			}
			if ok, err := d.dev.CanAccessPeer(pd); err == nil && !ok {
				return fail(fmt.Errorf("GPU %s cannot access the memory of rank %d's GPU %s (cuDeviceCanAccessPeer: no peer access)", me.busID, q, p.busID))
			}
		}
		err := d.do(func() error {
			ptr, err := cubind.OpenIPCMemHandle(p.handle, cubind.IPCMemLazyEnablePeerAccess)
			if err != nil {
				return err
			}
			bases[q] = ptr
			r.opened = append(r.opened, ptr)
			return nil
		})
		if err != nil {
			return fail(fmt.Errorf("map rank %d's buffer (GPU %s): %w", q, p.busID, err))
		}
	}
	r.bases = bases
	r.params = peerParams(bases, r.slot, rank, PeerTimeout)
	// Every rank has mapped every buffer (and marked its own empty before the first exchange)
	// before anyone returns.
	if _, err := exchange(ctx, nil); err != nil {
		return fail(fmt.Errorf("barrier after mapping: %w", err))
	}
	return r, nil
}

// Close ends a rank of NewPeerRankIPC: it waits for the rank's queued work, meets the other
// ranks (so that nobody still reads this rank's buffer), unmaps theirs, meets them again and
// frees its buffer. Call it on every rank. Ranks of a PeerGroup are closed by the group.
func (r *PeerRank) Close(ctx context.Context) error {
	if r.group != nil {
		return fmt.Errorf("cuda: close peer rank %d: it belongs to a PeerGroup; close the group", r.rank)
	}
	if r.exchange == nil {
		return nil
	}
	var errs []error
	if err := r.dev.Sync(); err != nil {
		errs = append(errs, err)
	}
	if _, err := r.exchange(ctx, nil); err != nil {
		errs = append(errs, fmt.Errorf("barrier before unmapping: %w", err))
	}
	err := r.dev.do(func() error {
		var errs []error
		for _, p := range r.opened {
			errs = append(errs, cubind.CloseIPCMemHandle(p))
		}
		r.opened = nil
		return errors.Join(errs...)
	})
	errs = append(errs, err)
	if _, err := r.exchange(ctx, nil); err != nil {
		errs = append(errs, fmt.Errorf("barrier before freeing: %w", err))
	}
	errs = append(errs, r.free())
	r.exchange = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cuda: close peer rank %d: %w", r.rank, err)
	}
	return nil
}

// Rank is this rank's index in its group.
func (r *PeerRank) Rank() int { return r.rank }

// Size is the number of ranks of the group.
func (r *PeerRank) Size() int { return r.size }

// Device is the rank's GPU.
func (r *PeerRank) Device() *Device { return r.dev }

// MaxBytes is the largest input, in bytes, the rank reduces.
func (r *PeerRank) MaxBytes() int { return r.maxBytes }

// Check waits for the rank's queued work and reports its errors, and a peer that did not
// arrive within PeerTimeout (after which the group is unusable: every later call returns at
// once and leaves its outputs unwritten).
func (r *PeerRank) Check() error {
	return r.dev.do(func() error {
		var w [4]uint32
		if r.own == 0 {
			return fmt.Errorf("cuda: peer rank %d: closed", r.rank)
		}
		if err := cubind.MemcpyDtoHAsync(w[:], r.own, r.dev.stream); err != nil {
			return fmt.Errorf("cuda: peer rank %d: check: %w", r.rank, err)
		}
		if err := r.dev.sync(); err != nil {
			return fmt.Errorf("cuda: peer rank %d: %w", r.rank, err)
		}
		if w[3] != 0 {
			return fmt.Errorf("cuda: peer rank %d: rank %d did not arrive within %v; the group is unusable", r.rank, w[3]-1, PeerTimeout)
		}
		return nil
	})
}

// checkDev rejects tensors of another device.
func (r *PeerRank) checkDev(ts ...*Tensor) error {
	for _, t := range ts {
		if t.dev != nil && t.dev != r.dev {
			return fmt.Errorf("%s is on GPU %d, the rank's GPU is %d", t, t.dev.ordinal, r.dev.ordinal)
		}
	}
	return nil
}

// blocks is the grid size for work of n units: at most one block per SM (one wave: a block
// that waits for peers' values holds its SM) and at most peerMaxBlocks.
func (r *PeerRank) blocks(n int64) int {
	return int(max(1, min(n, int64(r.dev.info.SMs), peerMaxBlocks)))
}

// peerBlockSize is the block size of the plain all-reduce for packs 16-byte packs: small
// blocks for small messages, whose time is latency (more blocks issue their peer reads in
// parallel), up to peerThreads.
func peerBlockSize(packs int64) int64 {
	switch {
	case packs <= 2048: // 32 KiB
		return 128
	case packs <= 8192: // 128 KiB
		return 256
	}
	return peerThreads
}

// AllReduce sets out to the sum over the group's ranks of x, where x and out (f32 or bf16,
// one dtype, the same shape; out may be x) hold at most MaxBytes bytes. Sums run in f32 in
// rank order (bf16 rounds once), so every rank gets bit-identical results, the same as
// dist/local's. It queues one kernel on the rank's device; every rank must call it with the
// same shape and dtype, in the same order relative to the group's other calls.
func (r *PeerRank) AllReduce(out, x *Tensor) error {
	return r.dev.do(func() error { return r.allReduce(out, x) })
}

func (r *PeerRank) allReduce(out, x *Tensor) error {
	wrapErr := func(err error) error { return fmt.Errorf("cuda: all-reduce rank %d: %w", r.rank, err) }
	if err := checkLive(out, x); err != nil {
		return wrapErr(err)
	}
	xn, err := floatName("x", x.DType)
	if err != nil {
		return wrapErr(err)
	}
	if err := checkOut("output", out, x.DType, x.Shape); err != nil {
		return wrapErr(err)
	}
	if err := r.checkDev(out, x); err != nil {
		return wrapErr(err)
	}
	if x.Bytes() > r.maxBytes {
		return wrapErr(fmt.Errorf("x %s is %d bytes; the group takes at most %d", x, x.Bytes(), r.maxBytes))
	}
	n := int64(x.Numel())
	if n == 0 {
		return nil
	}
	pack := int64(16 / x.DType.Size())
	packs := (n + pack - 1) / pack
	th := int64(r.threads)
	if th == 0 {
		th = peerBlockSize(packs)
	}
	grid := cubind.Dim3{X: r.blocks((packs + th - 1) / th), Y: 1, Z: 1}
	err = r.dev.launch("allreduce.cu", "allreduce_"+xn, grid, cubind.Dim3{X: int(th), Y: 1, Z: 1}, 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).Ptr(x.ptr).I64(n).Struct(r.params)
	})
	if err != nil {
		return wrapErr(err)
	}
	return nil
}

// AllReduceAddRMSNorm is AllReduce of x followed by AddRMSNorm, in one kernel, as
// graph op all_reduce_add_rmsnorm: sum = round(allreduce(x)) + residual, of dtype
// promote(x, residual); normed = rmsnorm(sum) * w, of dtype promote(w, sum). x and residual
// are [..., D], w is [D]; x holds at most MaxBytes bytes. Results are bit-identical to
// AllReduce then AddRMSNorm, on every rank. sum may be x or residual (in place).
func (r *PeerRank) AllReduceAddRMSNorm(normed, sum, x, residual, w *Tensor, eps float32) error {
	return r.dev.do(func() error { return r.allReduceAddRMSNorm(normed, sum, x, residual, w, eps) })
}

func (r *PeerRank) allReduceAddRMSNorm(normed, sum, x, res, w *Tensor, eps float32) error {
	wrapErr := func(err error) error { return fmt.Errorf("cuda: all-reduce add_rmsnorm rank %d: %w", r.rank, err) }
	if err := checkLive(normed, sum, x, res, w); err != nil {
		return wrapErr(err)
	}
	var names [3]string
	for i, t := range []*Tensor{x, res, w} {
		n, err := floatName([]string{"x", "residual", "w"}[i], t.DType)
		if err != nil {
			return wrapErr(err)
		}
		names[i] = n
	}
	if !slices.Equal(x.Shape, res.Shape) {
		return wrapErr(fmt.Errorf("x %v and residual %v differ in shape", x.Shape, res.Shape))
	}
	D, err := normDim(x, w)
	if err != nil {
		return wrapErr(err)
	}
	sdt := promote(x.DType, res.DType)
	if err := checkOut("sum", sum, sdt, x.Shape); err != nil {
		return wrapErr(err)
	}
	if err := checkOut("normed", normed, promote(w.DType, sdt), x.Shape); err != nil {
		return wrapErr(err)
	}
	if err := r.checkDev(normed, sum, x, res, w); err != nil {
		return wrapErr(err)
	}
	if x.Bytes() > r.maxBytes {
		return wrapErr(fmt.Errorf("x %s is %d bytes; the group takes at most %d", x, x.Bytes(), r.maxBytes))
	}
	rows := x.Numel() / max(D, 1)
	if rows == 0 || D == 0 {
		return nil
	}
	name := "ar_add_rmsnorm_" + names[0] + "_" + names[1] + "_" + names[2]
	grid := cubind.Dim3{X: r.blocks(int64(rows)), Y: 1, Z: 1}
	block := rowBlock(D)
	// The vector form takes what add_rmsnorm's register form takes with one vector of 16
	// bytes per thread, in the same threads, so that the two sum the squares alike.
	wide := max(x.DType.Size(), res.DType.Size(), w.DType.Size())
	if np, ok := planAddNorm(D, normed, sum, x, res, w); ok && np.nv == 1 && np.vec*wide == 16 {
		name += "_vec"
		block = np.block()
	}
	err = r.dev.launch("allreduce.cu", name, grid, block, 0, func(a *cubind.Args) {
		a.Ptr(normed.ptr).Ptr(sum.ptr).Ptr(x.ptr).Ptr(res.ptr).Ptr(w.ptr).I32(int32(rows)).I32(int32(D)).F32(eps).Struct(r.params)
	})
	if err != nil {
		return wrapErr(err)
	}
	return nil
}
