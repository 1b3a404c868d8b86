// Package nccl runs Loom's collectives on GPUs with NVIDIA's NCCL (libnccl.so.2, through
// cubind, without cgo). It works on device buffers and CUDA streams: a collective enqueues
// its kernel on the caller's stream and returns; World.Sync waits for the stream.
//
// A World is one rank's view of a dist.Mesh: the world communicator plus one communicator
// per mesh axis (made with ncclCommSplit: color = the first rank of the rank's group along
// the axis, key = the rank, so the new communicator's ranks are in dist.Group order; a group
// that spans the whole world shares the world communicator). World.Group looks up the Comm
// of a dist.Group; Comm runs AllReduce, AllGather, ReduceScatter, AllToAll (grouped
// ncclSend/ncclRecv) and Broadcast.
//
// # Two ways to make worlds
//
// In one process, InitAll(devices, mesh) makes one World per GPU with ncclCommInitAll.
// Each rank's calls must then come from its own goroutine, locked to its OS thread
// (runtime.LockOSThread) with that GPU's primary context current (cubind
// Device.PrimaryCtxRetain, Context.SetCurrent): NCCL calls of different ranks may wait for
// each other (the first collective of each kind connects the ranks), so one thread cannot
// drive two ranks.
//
// Across processes, one per GPU, Init(ctx, env, mesh, opts) follows torchrun's convention:
// EnvFromOS reads RANK, WORLD_SIZE, LOCAL_RANK (the GPU ordinal), MASTER_ADDR and
// MASTER_PORT (`loom launch --nproc N -- cmd` sets them). Rank 0 listens at
// MASTER_ADDR:MASTER_PORT, makes the ncclUniqueId and hands it to every rank (Rendezvous);
// every rank then calls ncclCommInitRankScalable on a non-blocking communicator, so that
// initialisation itself can be abandoned, and splits from it the blocking world and axis
// communicators that carry the collectives (a non-blocking communicator runs every call
// through a background thread, about 1 ms each, against 12 us). The rendezvous connections
// stay open as a liveness channel (Peers): when a process dies, the others learn "rank N
// died or disconnected" within milliseconds, and a hung one is declared failed after
// Options.PeerTimeout without heartbeats.
//
// # Failures never hang
//
// A GPU collective whose peer is gone spins forever. World.Sync therefore waits for the
// stream by polling, at most Options.Timeout and no longer than its context, while it
// watches ncclCommGetAsyncError of every communicator and the liveness channel. On a
// failure or a timeout it aborts every communicator of the world (ncclCommAbort, which stops
// kernels in flight), tells the other ranks why, and returns an error that names the
// failed rank (a *PeerError, matching dist.ErrPeerFailed) or the cause (dist.ErrTimeout,
// an NCCL status). The world is then broken: later calls fail with dist.ErrBroken. Errors of
// collectives are *dist.Error values that name the collective, the group and the rank.
//
// One wait escapes this: NCCL connects the ranks of a communicator lazily, at the first
// collective of each kind, and that first call blocks the calling thread until the peers
// make it too. A peer that died makes it fail (its sockets close); one that is alive but
// never makes the call leaves it blocked. Set NCCL_RUNTIME_CONNECT=0 to connect every
// algorithm during initialisation instead, which is abortable but costs GPU memory.
//
// # Multicast stays off
//
// Before NCCL initialises, NCCL_NVLS_ENABLE is set to 0 in the process environment unless
// it is already set: NVLink SHARP allocates multicast objects, and multicast can take a
// shared host's GPUs out of service. Neither this package nor cubind ever calls
// cuMulticastCreate.
//
// # Numerics
//
// Reductions take f32, bf16, f16, i32 and i64; data movement (all_gather, all_to_all,
// broadcast) also bool. NCCL sums in its own order (ring or tree) and rounds bf16 and f16
// after each step, so for more than two ranks results can differ in the last bits from
// dist/local's fold in group order; every rank still receives the same bits. With two ranks
// a sum is one correctly rounded addition.
package nccl
