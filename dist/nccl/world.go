package nccl

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/dist"
)

// Polling of World.Sync and of non-blocking NCCL calls: spin for spinFor, then sleep from
// pollStart up to pollMax between looks. A decode step lasts a few milliseconds: spinning
// through it finds its end at once (sleeps of up to 1 ms cost a tp=2 decode step 0.7 ms on
// the H200 machine); longer waits sleep in short naps.
//
// Sync's spin yields the processor only every yieldEvery looks: its callers hold their
// goroutine on the OS thread that has the GPU's context current (runtime.LockOSThread),
// and there runtime.Gosched hands the thread's P to another thread and takes it back, two
// wake-ups of sleeping threads: 37 µs a yield measured on a 2-core machine, against 0.1 µs
// unlocked, so yielding at every look (as Sync did) noticed the end of a step tens of
// microseconds late on every rank.
const (
	spinFor    = 5 * time.Millisecond
	yieldEvery = 1024
	pollStart  = 20 * time.Microsecond
	pollMax    = 100 * time.Microsecond
	// failureGrace is how long Sync keeps waiting for a stream after it learnt that a peer
	// failed or left: work the peer completed before it went still finishes here.
	failureGrace = 200 * time.Millisecond
	// abortWait bounds the wait for ncclCommAbort. With a peer dead in the middle of a
	// collective the call did not return within 10 s on the H200 machine; the world is
	// broken either way, so the error is reported after this wait and the abort goes on
	// in the background.
	abortWait = 2 * time.Second
)

// liveness tells a World about its peers: the TCP Peers of a multi-process world, or the
// shared board of the worlds of one process.
type liveness interface {
	Err() error          // the first failure of another rank, or nil
	Abort(reason string) // tell the others this rank gave up
	Close() error        // tell the others this rank closed its world
}

// World is one rank's view of a mesh of GPUs: its world communicator and one communicator
// per mesh axis. Make worlds with InitAll (ranks are goroutines of one process) or Init
// (one process per rank). A World's methods are meant for the rank's own goroutine (locked
// to its OS thread with the GPU's context current); Abort and Err may be called from any
// goroutine.
type World struct {
	rank, size int
	mesh       dist.Mesh
	device     cubind.Device
	cuctx      cubind.Context
	retained   bool
	opts       Options
	peers      liveness
	world      *Comm
	axes       map[string]*Comm
	comms      []*Comm // the communicators this World owns, in creation order (world first)
	event      cubind.Event

	mu     sync.Mutex
	broken error // why the world was aborted
	closed bool
}

func newWorld(rank int, mesh dist.Mesh, opts Options, peers liveness) *World {
	return &World{rank: rank, size: mesh.Size(), mesh: mesh, opts: withDefaults(opts), peers: peers, axes: map[string]*Comm{}}
}

// setWorld installs the world communicator.
func (w *World) setWorld(h cubind.NCCLComm) {
	g, _ := w.mesh.Group(w.rank, dist.WorldAxis)
	w.world = &Comm{w: w, group: g, h: h}
	w.comms = append(w.comms, w.world)
}

// Rank is this rank's index in the world, Size the number of ranks.
func (w *World) Rank() int { return w.rank }

// Size is the number of ranks of the world.
func (w *World) Size() int { return w.size }

// Mesh is the mesh the world was made for.
func (w *World) Mesh() dist.Mesh { return w.mesh }

// Device is this rank's GPU.
func (w *World) Device() cubind.Device { return w.device }

// Context is the primary context of this rank's GPU, which its calls need current.
func (w *World) Context() cubind.Context { return w.cuctx }

// Timeout is how long Sync and non-blocking NCCL calls wait.
func (w *World) Timeout() time.Duration { return w.opts.Timeout }

// SetTimeout changes Timeout; d <= 0 restores DefaultTimeout.
func (w *World) SetTimeout(d time.Duration) {
	if d <= 0 {
		d = DefaultTimeout
	}
	w.opts.Timeout = d
}

// Group returns the communicator of g, a group of this rank along a mesh axis or
// dist.WorldAxis (as Mesh.Group gives it).
func (w *World) Group(g dist.Group) (*Comm, error) {
	c := w.world
	if g.Axis != dist.WorldAxis {
		c = w.axes[g.Axis]
	}
	if c == nil {
		return nil, fmt.Errorf("nccl: rank %d: group %s: mesh %q has no axis %q", w.rank, g, w.mesh, g.Axis)
	}
	if g.Index != c.group.Index || !slices.Equal(g.Ranks, c.group.Ranks) {
		return nil, fmt.Errorf("nccl: rank %d: group %s is not this rank's group along %s in mesh %q, which is %s (index %d)",
			w.rank, g, g.Axis, w.mesh, c.group, c.group.Index)
	}
	return c, nil
}

// Axis returns the communicator of this rank's group along the named mesh axis (or
// dist.WorldAxis).
func (w *World) Axis(name string) (*Comm, error) {
	g, err := w.mesh.Group(w.rank, name)
	if err != nil {
		return nil, fmt.Errorf("nccl: rank %d: %w", w.rank, err)
	}
	return w.Group(g)
}

// Err returns nil while the world is usable, else why it is not (wrapping dist.ErrBroken
// after a failure, dist.ErrAborted after Close).
func (w *World) Err() error { return w.usable() }

func (w *World) usable() error {
	w.mu.Lock()
	broken, closed := w.broken, w.closed
	w.mu.Unlock()
	if broken != nil {
		return fmt.Errorf("%w: %w", dist.ErrBroken, broken)
	}
	if closed {
		return fmt.Errorf("world closed: %w", dist.ErrAborted)
	}
	if w.peers != nil {
		if err := w.peers.Err(); err != nil {
			return fmt.Errorf("%w: %w", dist.ErrBroken, w.abort(err))
		}
	}
	return nil
}

// Abort aborts every communicator of the world (ncclCommAbort stops kernels in flight),
// tells the other ranks, and returns the error the world now fails with: cause, or the
// cause of an earlier failure. The world cannot be used afterwards; Close it.
func (w *World) Abort(cause error) error {
	if cause == nil {
		cause = dist.ErrAborted
	}
	return w.abort(cause)
}

func (w *World) abort(cause error) error {
	w.mu.Lock()
	if w.broken != nil {
		b := w.broken
		w.mu.Unlock()
		return b
	}
	w.broken = cause
	closed := w.closed
	comms := slices.Clone(w.comms)
	w.mu.Unlock()
	if w.peers != nil {
		w.peers.Abort(cause.Error())
	}
	if closed || len(comms) == 0 {
		return cause
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var errs []error
		if w.retained {
			if err := w.cuctx.SetCurrent(); err != nil {
				errs = append(errs, err)
			}
		}
		for i := len(comms) - 1; i >= 0; i-- {
			if err := comms[i].h.Abort(); err != nil {
				errs = append(errs, err)
			}
		}
		done <- errors.Join(errs...)
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%w (aborting the communicators: %v)", cause, err)
		}
	case <-time.After(abortWait):
		return fmt.Errorf("%w (ncclCommAbort did not return within %v)", cause, abortWait)
	}
	return cause
}

// check looks at everything a wait must give up on: the other ranks (when peers is set),
// the context and the deadline. It aborts the world and returns the cause on a failure.
func (w *World) check(ctx context.Context, what string, deadline time.Time, peers bool) error {
	if peers && w.peers != nil {
		if err := w.peers.Err(); err != nil {
			return w.abort(fmt.Errorf("%s: %w", what, err))
		}
	}
	if ctx.Err() != nil {
		return w.abort(fmt.Errorf("%s: %w", what, context.Cause(ctx)))
	}
	if time.Now().After(deadline) {
		return w.abort(fmt.Errorf("%s: not done after %v (a rank is missing, hung or made a different call): %w",
			what, w.opts.Timeout, dist.ErrTimeout))
	}
	return nil
}

// asyncFailure explains a failed ncclCommGetAsyncError. NCCL cannot say which peer failed;
// when the liveness channel knows (or learns within failureGrace, since NCCL may notice
// first), the error names the rank. NCCL's remote error wraps dist.ErrPeerFailed.
func (w *World) asyncFailure(c *Comm, err error) error {
	if w.peers != nil {
		for deadline := time.Now().Add(failureGrace); ; time.Sleep(time.Millisecond) {
			if pe := w.peers.Err(); pe != nil {
				return fmt.Errorf("communicator %s: %w (NCCL: %v)", c.group, pe, err)
			}
			if time.Now().After(deadline) {
				break
			}
		}
	}
	var ce *cubind.Error
	if errors.As(err, &ce) && ce.Name == cubind.NCCLRemoteError.String() {
		return fmt.Errorf("communicator %s: %w: %w", c.group, dist.ErrPeerFailed, err)
	}
	return fmt.Errorf("communicator %s: %w", c.group, err)
}

// await waits until none of the communicators hs is in progress (after a call on a
// non-blocking communicator), watching the other ranks (when peers is set), ctx and the
// timeout.
func (w *World) await(ctx context.Context, what string, peers bool, hs ...cubind.NCCLComm) error {
	deadline := time.Now().Add(w.opts.Timeout)
	wait := pollStart
	for {
		pending := false
		for _, h := range hs {
			r, err := h.AsyncError()
			if err == nil && r != cubind.NCCLSuccess && r != cubind.NCCLInProgress {
				err = h.AsyncErr()
			}
			if err != nil {
				return w.abort(fmt.Errorf("%s: %w", what, w.asyncFailure(w.commOf(h), err)))
			}
			pending = pending || r == cubind.NCCLInProgress
		}
		if !pending {
			return nil
		}
		if err := w.check(ctx, what, deadline, peers); err != nil {
			return err
		}
		time.Sleep(wait)
		wait = min(2*wait, pollMax)
	}
}

// commOf finds the Comm of a handle, for messages.
func (w *World) commOf(h cubind.NCCLComm) *Comm {
	for _, c := range w.comms {
		if c.h == h {
			return c
		}
	}
	return &Comm{w: w, group: dist.Group{Axis: "?"}, h: h}
}

// Sync waits until the work issued to stream s so far has finished, at most Timeout() and
// no longer than ctx, watching every communicator's asynchronous errors and the other
// ranks. It returns nil when the stream is done. Otherwise it aborts the world (see Abort)
// and returns an error naming the failed rank (a *PeerError, matching dist.ErrPeerFailed),
// or the cause: dist.ErrTimeout, the context's error, an NCCL or CUDA failure.
func (w *World) Sync(ctx context.Context, s cubind.Stream) error {
	if err := w.usable(); err != nil {
		return w.syncErr(err)
	}
	if err := w.event.Record(s); err != nil {
		return w.syncErr(fmt.Errorf("record an event on the stream: %w", err))
	}
	return w.WaitEvent(ctx, w.event)
}

// WaitEvent is Sync up to an event recorded earlier on the rank's stream: it waits until
// the work before done has finished, with Sync's watch and errors, and lets work queued
// after done go on (a step queued behind the one being waited for).
func (w *World) WaitEvent(ctx context.Context, done cubind.Event) error {
	if err := w.usable(); err != nil {
		return w.syncErr(err)
	}
	start := time.Now()
	deadline := start.Add(w.opts.Timeout)
	var failedAt time.Time
	wait := pollStart
	for i := 0; ; i++ {
		finished, err := done.Done()
		if err != nil {
			return w.syncErr(w.abort(fmt.Errorf("the stream failed: %w", err)))
		}
		if finished {
			return nil
		}
		spinning := time.Since(start) < spinFor
		if spinning && i%16 != 15 {
			continue // while spinning, look at the rest every 16th time only
		}
		for _, c := range w.comms {
			if err := c.h.AsyncErr(); err != nil && !cubind.IsNCCLInProgress(err) {
				return w.syncErr(w.abort(w.asyncFailure(c, err)))
			}
		}
		now := time.Now()
		if w.peers != nil {
			if pe := w.peers.Err(); pe != nil {
				if failedAt.IsZero() {
					failedAt = now
				} else if now.Sub(failedAt) >= failureGrace {
					return w.syncErr(w.abort(pe))
				}
			}
		}
		if err := w.check(ctx, "waiting for the stream", deadline, false); err != nil {
			return w.syncErr(err)
		}
		if spinning {
			if i%yieldEvery == yieldEvery-1 {
				runtime.Gosched()
			}
			continue
		}
		time.Sleep(wait)
		wait = min(2*wait, pollMax)
	}
}

func (w *World) syncErr(err error) error { return fmt.Errorf("nccl: rank %d: sync: %w", w.rank, err) }

// Close destroys the world's communicators (after flushing them; aborted ones are already
// gone), releases the GPU's primary context and closes the liveness channel, which the
// other ranks see as this rank leaving. Call it on every rank once its collectives are
// done, from the rank's goroutine.
func (w *World) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	broken := w.broken
	w.mu.Unlock()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var errs []error
	if w.retained {
		if err := w.cuctx.SetCurrent(); err != nil {
			errs = append(errs, err)
		}
	}
	if broken == nil {
		for i := len(w.comms) - 1; i >= 0; i-- {
			if err := w.destroy(w.comms[i]); err != nil {
				errs = append(errs, fmt.Errorf("communicator %s: %w", w.comms[i].group, err))
			}
		}
	}
	if w.event != 0 {
		if err := w.event.Destroy(); err != nil {
			errs = append(errs, err)
		}
	}
	if w.peers != nil {
		if err := w.peers.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if w.retained {
		if err := w.device.PrimaryCtxRelease(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("nccl: rank %d: close: %w", w.rank, err)
	}
	return nil
}

// destroy finalizes and destroys one communicator; one that does not finalize within the
// timeout is aborted.
func (w *World) destroy(c *Comm) error {
	err := c.h.Finalize()
	deadline := time.Now().Add(w.opts.Timeout)
	for wait := pollStart; cubind.IsNCCLInProgress(err); wait = min(2*wait, pollMax) {
		if time.Now().After(deadline) {
			c.h.Abort()
			return fmt.Errorf("ncclCommFinalize not done after %v: %w", w.opts.Timeout, dist.ErrTimeout)
		}
		time.Sleep(wait)
		err = c.h.AsyncErr()
	}
	if err != nil {
		c.h.Abort()
		return err
	}
	return c.h.Destroy()
}

// split makes the communicator of each mesh axis by splitting parent, with configuration
// cfg (nil: the parent's). Every rank splits the same axes in the same order; a group as
// large as the world shares the world communicator.
func (w *World) split(ctx context.Context, parent cubind.NCCLComm, cfg *cubind.NCCLConfig) error {
	for _, a := range w.mesh.Axes() {
		g, err := w.mesh.Group(w.rank, a.Name)
		if err != nil {
			return w.abort(err)
		}
		if g.Size() == w.size {
			w.axes[a.Name] = &Comm{w: w, group: g, h: w.world.h}
			continue
		}
		what := fmt.Sprintf("split the %s groups (ncclCommSplit color %d key %d)", a.Name, g.Ranks[0], w.rank)
		c, err := w.splitFrom(ctx, parent, g, g.Ranks[0], cfg, what)
		if err != nil {
			return err
		}
		w.axes[a.Name] = c
	}
	return nil
}

// splitFrom makes the communicator of group g (this rank's color; key = this rank) from
// parent and registers it with the world. On a non-blocking parent the split goes on in
// the background: it is awaited (abortably) on the parent.
func (w *World) splitFrom(ctx context.Context, parent cubind.NCCLComm, g dist.Group, color int, cfg *cubind.NCCLConfig, what string) (*Comm, error) {
	cell, err := parent.Split(color, w.rank, cfg)
	if err != nil && !cubind.IsNCCLInProgress(err) {
		return nil, w.abort(fmt.Errorf("%s: %w", what, err))
	}
	if err := w.await(ctx, what, true, parent); err != nil {
		return nil, err // the cell stays pinned: NCCL may still write it
	}
	h := cell.Comm()
	cell.Release()
	if h == 0 {
		return nil, w.abort(fmt.Errorf("%s: NCCL made no communicator", what))
	}
	c := &Comm{w: w, group: g, h: h}
	w.mu.Lock()
	w.comms = append(w.comms, c)
	w.mu.Unlock()
	if err := w.await(ctx, what, true, h); err != nil {
		return nil, err
	}
	n, err := h.Count()
	if err == nil && n != g.Size() {
		err = fmt.Errorf("the new communicator has %d ranks, want %d", n, g.Size())
	}
	if err == nil {
		var r int
		if r, err = h.UserRank(); err == nil && r != g.Index {
			err = fmt.Errorf("this rank is %d in the new communicator, want %d", r, g.Index)
		}
	}
	if err != nil {
		return nil, w.abort(fmt.Errorf("%s: %w", what, err))
	}
	return c, nil
}

// attach retains the primary context of GPU ordinal dev for the world.
func (w *World) attach(dev int) error {
	d, err := cubind.GetDevice(dev)
	if err != nil {
		return err
	}
	ctx, err := d.PrimaryCtxRetain()
	if err != nil {
		return fmt.Errorf("GPU %d: %w", dev, err)
	}
	w.device, w.cuctx, w.retained = d, ctx, true
	return nil
}

// ready makes the world's event (on the current context).
func (w *World) ready() error {
	e, err := cubind.EventCreate(cubind.EventDisableTiming)
	if err != nil {
		return w.abort(fmt.Errorf("create the sync event: %w", err))
	}
	w.event = e
	return nil
}

// prepare checks the libraries and switches NVLink SHARP off before NCCL initialises.
func prepare() error {
	if _, err := cubind.SetNVLSDefault(); err != nil {
		return err
	}
	if err := cubind.Init(); err != nil {
		return err
	}
	return cubind.NCCLAvailable()
}

// InitAll makes one World per GPU of devices (rank i on GPU devices[i]) for mesh, whose
// size must be len(devices), in this process: the world communicators come from
// ncclCommInitAll and the axis communicators from ncclCommSplit. Each rank's calls must
// then come from its own goroutine locked to its OS thread (runtime.LockOSThread) with that
// GPU's primary context current (World.Context().SetCurrent()). Close every World when done.
func InitAll(devices []int, mesh dist.Mesh) ([]*World, error) {
	n := len(devices)
	if n == 0 || mesh.Size() != n {
		return nil, fmt.Errorf("nccl: mesh %q has %d ranks but %d devices were given", mesh, mesh.Size(), n)
	}
	if err := prepare(); err != nil {
		return nil, fmt.Errorf("nccl: %w", err)
	}
	b := &board{}
	worlds := make([]*World, n)
	for r := range worlds {
		worlds[r] = newWorld(r, mesh, Options{}, &boardView{b: b, rank: r})
	}
	fail := func(err error) ([]*World, error) {
		for _, w := range worlds {
			if len(w.comms) > 0 {
				w.abort(err)
			}
			w.Close()
		}
		return nil, err
	}
	for r, w := range worlds {
		if err := w.attach(devices[r]); err != nil {
			return fail(fmt.Errorf("nccl: rank %d: %w", r, err))
		}
	}
	hs, err := cubind.NCCLCommInitAll(devices)
	if err != nil {
		return fail(fmt.Errorf("nccl: %w", err))
	}
	for r, w := range worlds {
		w.setWorld(hs[r])
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, w := range worlds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if err := w.cuctx.SetCurrent(); err != nil {
				errs[r] = w.abort(err)
				return
			}
			if err := w.split(context.Background(), w.world.h, nil); err != nil {
				errs[r] = err
				return
			}
			errs[r] = w.ready()
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			return fail(fmt.Errorf("nccl: rank %d: %w", r, err))
		}
	}
	return worlds, nil
}

// Init joins the multi-process world that env describes (EnvFromOS) as rank env.Rank on
// GPU env.LocalRank, for mesh, whose size must be env.WorldSize: a rendezvous at
// env.Addr() (see Rendezvous) hands out the NCCL id, ncclCommInitRankScalable makes a
// non-blocking communicator of every rank, and ncclCommSplit makes from it the blocking
// world and axis communicators that carry the collectives. Every step can be abandoned: it
// waits at most opts.Timeout and no longer than ctx, and gives up (aborting what it made) as
// soon as another rank fails.
//
// Init locks the calling goroutine to its OS thread (runtime.LockOSThread) and leaves it
// locked, with the GPU's primary context current, for the World's calls; after Close the
// caller may unlock it. Close the World when done.
func Init(ctx context.Context, env Env, mesh dist.Mesh, opts Options) (*World, error) {
	if mesh.Size() != env.WorldSize {
		return nil, fmt.Errorf("nccl: rank %d: mesh %q has %d ranks, %s=%d", env.Rank, mesh, mesh.Size(), EnvWorldSize, env.WorldSize)
	}
	if err := prepare(); err != nil {
		return nil, fmt.Errorf("nccl: rank %d: %w", env.Rank, err)
	}
	runtime.LockOSThread()
	w, err := initRank(ctx, env, mesh, opts)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("nccl: rank %d: %w", env.Rank, err)
	}
	return w, nil
}

func initRank(ctx context.Context, env Env, mesh dist.Mesh, opts Options) (*World, error) {
	w := newWorld(env.Rank, mesh, opts, nil)
	if err := w.attach(env.LocalRank); err != nil {
		return nil, fmt.Errorf("%s=%d: %w", EnvLocalRank, env.LocalRank, err)
	}
	if err := w.cuctx.SetCurrent(); err != nil {
		w.Close()
		return nil, err
	}
	peers, payload, err := Rendezvous(ctx, env, w.opts, func() ([]byte, error) {
		id, err := cubind.NCCLGetUniqueID()
		return id[:], err
	})
	if err != nil {
		w.Close()
		return nil, err
	}
	w.peers = peers
	var id cubind.UniqueID
	if len(payload) != len(id) {
		w.Close()
		return nil, fmt.Errorf("rank 0 handed out a %d-byte id, want %d", len(payload), len(id))
	}
	copy(id[:], payload)
	// The first communicator is non-blocking, so that initialisation can be abandoned when
	// a peer fails. Its blocking children carry the collectives: a non-blocking
	// communicator hands every call to a background thread (about 1 ms each).
	cell, err := cubind.NCCLCommInitRankScalable(env.WorldSize, env.Rank, []cubind.UniqueID{id}, &cubind.NCCLConfig{NonBlocking: true})
	var h cubind.NCCLComm
	if cell != nil {
		h = cell.Comm()
	}
	worldGroup, _ := mesh.Group(env.Rank, dist.WorldAxis)
	if h != 0 {
		w.comms = append(w.comms, &Comm{w: w, group: worldGroup, h: h})
	}
	if err == nil || cubind.IsNCCLInProgress(err) {
		if h == 0 {
			err = errors.New("ncclCommInitRankScalable returned no communicator")
		} else {
			err = w.await(ctx, "ncclCommInitRankScalable", true, h)
		}
	}
	if err == nil {
		cell.Release()
		blocking := &cubind.NCCLConfig{}
		w.world, err = w.splitFrom(ctx, h, worldGroup, 0, blocking, "make the blocking world communicator (ncclCommSplit)")
		if err == nil {
			err = w.split(ctx, h, blocking)
		}
	}
	if err == nil {
		err = w.ready()
	}
	if err != nil {
		err = w.abort(err)
		w.Close()
		return nil, err
	}
	return w, nil
}

// board is the liveness channel of the worlds of one process: a rank that aborts or
// closes posts it, the others read it.
type board struct {
	mu       sync.Mutex
	failures []*PeerError
}

type boardView struct {
	b    *board
	rank int
}

func (v *boardView) Err() error {
	v.b.mu.Lock()
	defer v.b.mu.Unlock()
	for _, f := range v.b.failures {
		if f.Rank != v.rank {
			return f
		}
	}
	return nil
}

func (v *boardView) post(how string, err error) {
	v.b.mu.Lock()
	defer v.b.mu.Unlock()
	for _, f := range v.b.failures {
		if f.Rank == v.rank {
			return
		}
	}
	v.b.failures = append(v.b.failures, &PeerError{Rank: v.rank, How: how, Err: err})
}

func (v *boardView) Abort(reason string) { v.post("aborted", errors.New(reason)) }

func (v *boardView) Close() error {
	v.post("left", errors.New("it closed its world"))
	return nil
}
