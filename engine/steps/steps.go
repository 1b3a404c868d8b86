// Package steps is the step transport of a deployment with one process per rank: rank 0
// runs the engine and, at every step, sends the step's inputs to every other rank (a
// follower) over TCP; each follower runs its own executable on them, its collectives
// meeting rank 0's, and replies once it is done (or with its error). The KV caches never
// travel: each rank keeps its own on its device, and only the number of cache blocks comes
// with a step.
//
// Rank 0 listens at Addr and takes its followers with Accept, each a Remote: an executable
// (backend.Executable, and backend.Launcher when the follower can launch steps ahead) that
// the engine runs as the rank. A follower connects with Dial and runs Follow until rank 0
// says goodbye.
package steps

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/kvcache"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

// Frames are a type byte, a big-endian uint32 length and the payload; numbers inside the
// payloads are little-endian.
//
//	hello    follower -> 0: stepMagic, rank u32, world size u32, free device bytes u64,
//	         flags u8 (followLaunches: the follower can launch steps ahead)
//	welcome  0 -> follower: (empty) the follower is rank `rank` of this world
//	reject   0 -> follower: why it is refused
//	step     0 -> follower: step u64, cache blocks u32, tensors u32, then per tensor
//	         name length u16, name, dtype u8, dims u8, dims × u32, the elements
//	launch   0 -> follower: feed u8, draws u32, per draw temperature, top-p, min-p f32,
//	         top-k i32, seed, counter u64; then a step's payload. The follower queues the
//	         step (backend.Launcher), sampling with the draws, its input_ids fed from its
//	         previous launch's ids when feed is 1, and reads on: rank 0 may send the next
//	         step before this one's reply (the engine's steps launched ahead)
//	done     follower -> 0: step u64 (replies come in the order of the steps)
//	failed   follower -> 0: step u64, the error's text
//	bye      0 -> follower: rank 0 is done; the follower returns
const (
	stepHello byte = iota + 1
	stepWelcome
	stepReject
	stepRun
	stepDone
	stepFailed
	stepBye
	stepLaunch
)

// followLaunches is the hello flag of a follower that can launch steps.
const followLaunches = 1

const (
	stepMagic = "loom-steps/2"
	// maxStepFrame bounds a frame: a step of 64k tokens is under 2 MiB.
	maxStepFrame = 256 << 20
	// helloWait bounds how long rank 0 waits for an accepted connection's hello, and a
	// follower for rank 0's answer to its hello.
	helloWait = 10 * time.Second
	// stepDialRetry is the pause between a follower's attempts to reach rank 0, which may
	// still be compiling.
	stepDialRetry = 50 * time.Millisecond
)

// writeStepFrame and readStepFrame frame the step protocol (see dist.WriteFrame).
func writeStepFrame(w io.Writer, typ byte, payload []byte) error {
	return dist.WriteFrame(w, typ, payload)
}

func readStepFrame(r io.Reader) (byte, []byte, error) {
	return dist.ReadFrame(r, maxStepFrame, "the step protocol")
}

// stepMsg is what a step frame carries.
type stepMsg struct {
	step   uint64
	blocks int // KV cache blocks of every rank (0: the graph has no cache)
	inputs map[string]*tensor.Tensor
}

// IsCacheInput reports whether an input is one of the KV caches every rank keeps itself.
func IsCacheInput(name string) bool { return strings.HasPrefix(name, "kv_cache.") }

// Addr is where rank 0 listens for the followers' step connections: MASTER_ADDR and the
// port after MASTER_PORT (the rendezvous's).
func Addr(env dist.ProcessEnv) (string, error) {
	if env.MasterPort >= 65535 {
		return "", fmt.Errorf("%s=%d: the step transport listens on the next port, and there is none", dist.EnvMasterPort, env.MasterPort)
	}
	return net.JoinHostPort(env.MasterAddr, strconv.Itoa(env.MasterPort+1)), nil
}

// encodeStep lays a step out: every input but the caches, which must hold their data
// (i32, i64 or f32), sorted by name; the caches give only their number of blocks.
func encodeStep(step uint64, inputs map[string]*tensor.Tensor) ([]byte, error) {
	return appendStep(nil, step, inputs)
}

// appendStep is encodeStep appending to b.
func appendStep(b []byte, step uint64, inputs map[string]*tensor.Tensor) ([]byte, error) {
	names := make([]string, 0, len(inputs))
	blocks := 0
	for name, t := range inputs {
		if IsCacheInput(name) {
			if len(t.Shape) > 0 {
				blocks = t.Shape[0]
			}
			continue
		}
		names = append(names, name)
	}
	sort.Strings(names)
	size := 16
	for _, name := range names {
		size += 4 + len(name) + 4*len(inputs[name].Shape) + 8*tensor.Numel(inputs[name].Shape)
	}
	b = slices.Grow(b, size)
	b = binary.LittleEndian.AppendUint64(b, step)
	b = binary.LittleEndian.AppendUint32(b, uint32(blocks))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(names)))
	for _, name := range names {
		t := inputs[name]
		n := tensor.Numel(t.Shape)
		if len(name) > math.MaxUint16 || len(t.Shape) > math.MaxUint8 {
			return nil, fmt.Errorf("input %q: name or rank too large to send", name)
		}
		b = binary.LittleEndian.AppendUint16(b, uint16(len(name)))
		b = append(b, name...)
		b = append(b, byte(t.DType), byte(len(t.Shape)))
		for _, d := range t.Shape {
			if d < 0 || d > math.MaxUint32 {
				return nil, fmt.Errorf("input %q: dimension %d cannot be sent", name, d)
			}
			b = binary.LittleEndian.AppendUint32(b, uint32(d))
		}
		data := stepData(t)
		if data == nil || t.Len() != n {
			return nil, fmt.Errorf("input %q (%s%v) cannot be sent: only i32, i64 and f32 host tensors holding their data travel", name, t.DType, t.Shape)
		}
		var err error
		if b, err = binary.Append(b, binary.LittleEndian, data); err != nil {
			return nil, fmt.Errorf("input %q: %w", name, err)
		}
	}
	return b, nil
}

// stepData is the storage of a host tensor of a dtype steps carry (i32, i64, f32), as
// encoding/binary reads and writes it; nil for another dtype.
func stepData(t *tensor.Tensor) any {
	switch t.DType {
	case tensor.I32:
		return t.I32
	case tensor.I64:
		return t.I64
	case tensor.F32:
		return t.F32
	}
	return nil
}

// stepReader reads the fields of a payload in order; the first problem sticks.
type stepReader struct {
	b   []byte
	err error
}

func (r *stepReader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = errors.New("truncated step message")
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *stepReader) u8() byte {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *stepReader) u16() uint16 {
	if b := r.take(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (r *stepReader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *stepReader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// decodeStep reads what encodeStep wrote.
func decodeStep(payload []byte) (stepMsg, error) {
	r := &stepReader{b: payload}
	m := stepMsg{step: r.u64(), blocks: int(r.u32())}
	count := int(r.u32())
	if r.err != nil {
		return m, r.err
	}
	if count > len(r.b)/4 { // a tensor takes at least its name length, dtype and rank
		return m, fmt.Errorf("%d tensors in %d bytes", count, len(r.b))
	}
	m.inputs = make(map[string]*tensor.Tensor, count)
	for range count {
		name := string(r.take(int(r.u16())))
		dt, dims := tensor.DType(r.u8()), int(r.u8())
		shape := make([]int, dims)
		n := 1
		for i := range shape {
			shape[i] = int(r.u32())
			n *= shape[i]
			if n > maxStepFrame {
				return m, fmt.Errorf("input %q: %v elements exceed a frame", name, shape[:i+1])
			}
		}
		if r.err != nil {
			return m, r.err
		}
		if dt != tensor.I32 && dt != tensor.I64 && dt != tensor.F32 {
			return m, fmt.Errorf("input %q has dtype %d, which steps do not carry", name, dt)
		}
		if n*dt.Size() > len(r.b) {
			return m, fmt.Errorf("input %q: %v elements, %d bytes left in the step", name, shape, len(r.b))
		}
		t := tensor.New(dt, shape...)
		if raw := r.take(n * dt.Size()); raw != nil {
			if _, err := binary.Decode(raw, binary.LittleEndian, stepData(t)); err != nil {
				return m, fmt.Errorf("input %q: %w", name, err)
			}
		}
		if r.err != nil {
			return m, r.err
		}
		m.inputs[name] = t
	}
	if len(r.b) != 0 {
		return m, fmt.Errorf("%d bytes after the step's inputs", len(r.b))
	}
	return m, nil
}

// launchMsg is what a launch frame carries.
type launchMsg struct {
	stepMsg
	feed  bool
	draws []sample.DeviceDraw
}

// drawBytes is the size of one draw in a launch frame.
const drawBytes = 32

// encodeLaunch lays a launch out: feed, the draws, then the step as encodeStep does.
func encodeLaunch(step uint64, inputs map[string]*tensor.Tensor, draws []sample.DeviceDraw, feed bool) ([]byte, error) {
	b := make([]byte, 0, 5+drawBytes*len(draws))
	f := byte(0)
	if feed {
		f = 1
	}
	b = append(b, f)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(draws)))
	for _, d := range draws {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(d.Temperature))
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(d.TopP))
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(d.MinP))
		b = binary.LittleEndian.AppendUint32(b, uint32(d.TopK))
		b = binary.LittleEndian.AppendUint64(b, d.Seed)
		b = binary.LittleEndian.AppendUint64(b, d.Counter)
	}
	return appendStep(b, step, inputs)
}

// decodeLaunch reads what encodeLaunch wrote.
func decodeLaunch(payload []byte) (launchMsg, error) {
	r := &stepReader{b: payload}
	var m launchMsg
	switch f := r.u8(); {
	case r.err != nil:
		return m, r.err
	case f > 1:
		return m, fmt.Errorf("launch: feed flag %d, want 0 or 1", f)
	default:
		m.feed = f == 1
	}
	n := int(r.u32())
	if r.err == nil && n > len(r.b)/drawBytes {
		return m, fmt.Errorf("launch: %d draws in %d bytes", n, len(r.b))
	}
	m.draws = make([]sample.DeviceDraw, n)
	for i := range m.draws {
		d := &m.draws[i]
		d.Temperature, d.TopP, d.MinP = math.Float32frombits(r.u32()), math.Float32frombits(r.u32()), math.Float32frombits(r.u32())
		d.TopK = int32(r.u32())
		d.Seed, d.Counter = r.u64(), r.u64()
	}
	if r.err != nil {
		return m, r.err
	}
	var err error
	m.stepMsg, err = decodeStep(r.b)
	return m, err
}

// watchConn makes blocking I/O on conn end when ctx ends (by moving its deadline into the
// past). The returned function stops watching and clears the deadline; it reports whether
// ctx ended first.
func watchConn(ctx context.Context, conn net.Conn) func() bool {
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		conn.SetDeadline(time.Unix(1, 0))
		close(fired)
	})
	return func() bool {
		ended := !stop()
		if ended {
			<-fired
		}
		conn.SetDeadline(time.Time{})
		return ended
	}
}

// Remote is, on rank 0, the executable of another rank that runs in its own process:
// Run sends the step's inputs (but the KV caches) to the follower and waits until it has
// run them (see Follow); LaunchStep sends a step to be launched and returns at once, its
// pending step's Wait reading the reply. It returns no outputs: rank 0's come from its own
// program. Its errors do not repeat the rank; the engine, which runs it, names it. Accept
// makes them; run one through Executable.
type Remote struct {
	rank     int
	conn     net.Conn
	r        *bufio.Reader
	free     uint64        // the follower's free device memory when it connected
	launches bool          // the follower can launch steps (followLaunches)
	resident []string      // the cache inputs the follower keeps
	timeout  time.Duration // the longest wait for a step's reply (0: no limit but ctx)

	mu     sync.Mutex
	step   uint64
	broken error // why the connection can no longer carry steps
	closed bool
	// sent holds the steps sent whose replies have not been read, in order. A step whose
	// wait ended with its context (a rank failed and rankSet cancelled the others) stays
	// there: the follower still runs it and replies, and a later wait drops that reply.
	sent []uint64
}

// Resident names the cache inputs the follower keeps on its device (SetResident): the
// engine gives the remote rank shape-only cache tensors (see backend.Resident).
func (rr *Remote) Resident() []string { return rr.resident }

// Rank is the follower's rank.
func (rr *Remote) Rank() int { return rr.rank }

// Free is the device memory the follower had free after its weights when it connected.
func (rr *Remote) Free() uint64 { return rr.free }

// Launches reports whether the follower can launch steps ahead (its hello said so).
func (rr *Remote) Launches() bool { return rr.launches }

// SetResident names the cache inputs the follower keeps on its device; set it before the
// first step.
func (rr *Remote) SetResident(names []string) { rr.resident = names }

// SetTimeout bounds each wait for a step's reply (0: no limit but the caller's context);
// set it before the first step. A follower that has not replied within it is lost.
func (rr *Remote) SetTimeout(d time.Duration) { rr.timeout = d }

// Executable is the remote rank as the engine runs it: rr itself, a backend.Launcher, when
// the follower can launch steps; otherwise an executable without LaunchStep, so that the
// engine never launches a step on it.
func (rr *Remote) Executable() backend.Executable {
	if rr.launches {
		return rr
	}
	return runOnly{rr}
}

// runOnly is a Remote that is not a backend.Launcher.
type runOnly struct{ rr *Remote }

func (r runOnly) Run(ctx context.Context, inputs map[string]*tensor.Tensor) ([]*tensor.Tensor, error) {
	return r.rr.Run(ctx, inputs)
}

func (r runOnly) Resident() []string { return r.rr.Resident() }

// Run sends one step to the follower and waits for its reply, at most rr.timeout and no
// longer than ctx. A follower's failure to run the step comes back as its error. When ctx
// ends before the reply starts, the step fails and its reply is dropped when it comes, at
// a later wait; a lost connection, a timeout, a reply cut short or one that does not match
// the step break the remote rank for good (the stream of steps is out of step).
func (rr *Remote) Run(ctx context.Context, inputs map[string]*tensor.Tensor) ([]*tensor.Tensor, error) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	step, err := rr.send(ctx, stepRun, func(step uint64) ([]byte, error) { return encodeStep(step, inputs) })
	if err != nil {
		return nil, err
	}
	return nil, rr.await(ctx, step)
}

// LaunchStep sends a step for the follower to launch (see backend.Launcher) and returns
// without waiting for it. Only rank 0's ids are read, so the follower's stay on its device.
func (rr *Remote) LaunchStep(ctx context.Context, inputs map[string]*tensor.Tensor, draws []sample.DeviceDraw, feed, _ bool) (backend.Pending, error) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	step, err := rr.send(ctx, stepLaunch, func(step uint64) ([]byte, error) { return encodeLaunch(step, inputs, draws, feed) })
	if err != nil {
		return nil, err
	}
	return remotePending{rr, step}, nil
}

// remotePending is a step a Remote sent to be launched.
type remotePending struct {
	rr   *Remote
	step uint64
}

func (p remotePending) Wait(ctx context.Context) ([]int32, error) {
	p.rr.mu.Lock()
	defer p.rr.mu.Unlock()
	return nil, p.rr.await(ctx, p.step)
}

// send numbers the next step, encodes it with encode and writes it as a frame of type typ,
// within rr.timeout and no longer than ctx. rr.mu is held.
func (rr *Remote) send(ctx context.Context, typ byte, encode func(step uint64) ([]byte, error)) (uint64, error) {
	if rr.closed {
		return 0, errors.New("the connection to the follower is closed")
	}
	if rr.broken != nil {
		return 0, rr.broken
	}
	step := rr.step + 1
	payload, err := encode(step)
	if err != nil {
		return 0, fmt.Errorf("step %d: %w", step, err)
	}
	rr.step = step
	if rr.timeout > 0 {
		rr.conn.SetWriteDeadline(time.Now().Add(rr.timeout))
		defer rr.conn.SetWriteDeadline(time.Time{})
	}
	done := watchConn(ctx, rr.conn)
	err = writeStepFrame(rr.conn, typ, payload)
	if cancelled := done(); err != nil {
		rr.broken = rr.connErr(step, err, cancelled, ctx)
		return 0, rr.broken
	}
	rr.sent = append(rr.sent, step)
	return step, nil
}

// await reads the follower's replies up to step's, dropping those of earlier steps whose
// waits were abandoned, and returns step's outcome. rr.mu is held.
func (rr *Remote) await(ctx context.Context, step uint64) error {
	for {
		if rr.broken != nil {
			return rr.broken
		}
		if len(rr.sent) == 0 || rr.sent[0] > step {
			return fmt.Errorf("step %d: no reply is owed for it", step)
		}
		if rr.timeout > 0 {
			rr.conn.SetReadDeadline(time.Now().Add(rr.timeout))
		}
		done := watchConn(ctx, rr.conn)
		_, err := rr.r.Peek(1) // wait for the reply's first byte, consuming nothing
		if cancelled := done(); err != nil {
			if cancelled {
				return fmt.Errorf("step %d: %w (waiting for the follower)", step, context.Cause(ctx))
			}
			rr.broken = rr.connErr(step, err, false, ctx)
			return rr.broken
		}
		next := rr.sent[0]
		typ, msg, err := rr.reply(next)
		if err != nil {
			rr.broken = err
			return err
		}
		rr.sent = rr.sent[1:]
		switch {
		case next != step:
			continue // an abandoned step's reply
		case typ == stepFailed:
			return fmt.Errorf("step %d on the follower: %s", step, msg)
		}
		return nil
	}
}

// reply reads the follower's reply to step (within rr.timeout), checking that it answers
// that step; it returns the reply's type and message.
func (rr *Remote) reply(step uint64) (byte, []byte, error) {
	if rr.timeout > 0 {
		rr.conn.SetDeadline(time.Now().Add(rr.timeout))
		defer rr.conn.SetDeadline(time.Time{})
	}
	typ, reply, err := readStepFrame(rr.r)
	if err != nil {
		return 0, nil, rr.connErr(step, err, false, nil)
	}
	switch typ {
	case stepDone, stepFailed:
		if len(reply) < 8 || binary.LittleEndian.Uint64(reply) != step {
			return 0, nil, fmt.Errorf("step %d: the follower replied out of turn", step)
		}
		return typ, reply[8:], nil
	}
	return 0, nil, fmt.Errorf("step %d: the follower sent message type %d, not a step's reply", step, typ)
}

// connErr describes a failed exchange of step with the follower.
func (rr *Remote) connErr(step uint64, err error, cancelled bool, ctx context.Context) error {
	var ne net.Error
	switch {
	case cancelled:
		return fmt.Errorf("step %d: %w (sending to the follower)", step, context.Cause(ctx))
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("step %d: no reply from the follower within %v", step, rr.timeout)
	case connGone(err):
		return fmt.Errorf("step %d: the follower process closed its connection (did it die?): %w", step, err)
	}
	return fmt.Errorf("step %d: the connection to the follower failed: %w", step, err)
}

// Close tells the follower that rank 0 is done (its Follow returns nil) and closes the
// connection.
func (rr *Remote) Close() error {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if rr.closed {
		return nil
	}
	rr.closed = true
	rr.conn.SetWriteDeadline(time.Now().Add(helloWait))
	err := writeStepFrame(rr.conn, stepBye, nil)
	if cerr := rr.conn.Close(); err == nil {
		err = cerr
	}
	if err != nil && rr.broken == nil {
		return fmt.Errorf("rank %d: say goodbye: %w", rr.rank, err)
	}
	return nil
}

// Accept accepts on ln the followers of a world of worldSize ranks (see acceptFollowers).
func Accept(ctx context.Context, ln net.Listener, worldSize int) ([]*Remote, error) {
	return acceptFollowers(ctx, ln, worldSize)
}

// acceptFollowers accepts on ln the followers of a world of worldSize ranks, ranks 1 to
// worldSize-1, each once, and returns them in rank order. A connection that does not speak
// the step protocol is dropped; a follower of another world size, or a rank already
// connected, is refused, which fails the whole world. It waits no longer than ctx.
func acceptFollowers(ctx context.Context, ln net.Listener, worldSize int) ([]*Remote, error) {
	ranks := make([]*Remote, worldSize-1)
	fail := func(err error) ([]*Remote, error) {
		for _, rr := range ranks {
			if rr != nil {
				rr.conn.Close()
			}
		}
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for left := worldSize - 1; left > 0; {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				var missing []string
				for i, rr := range ranks {
					if rr == nil {
						missing = append(missing, fmt.Sprint(i+1))
					}
				}
				return fail(fmt.Errorf("waiting for rank(s) %s to connect: %w", strings.Join(missing, ", "), context.Cause(ctx)))
			}
			return fail(fmt.Errorf("accept: %w", err))
		}
		conn.SetDeadline(time.Now().Add(helloWait))
		typ, payload, err := readStepFrame(conn)
		r := &stepReader{b: payload}
		if err != nil || typ != stepHello || string(r.take(len(stepMagic))) != stepMagic {
			slog.Warn("dropped a connection that does not speak the step protocol", "from", conn.RemoteAddr(), "err", err)
			conn.Close()
			continue
		}
		rank, size, free, flags := int(r.u32()), int(r.u32()), r.u64(), r.u8()
		reject := func(why string) {
			writeStepFrame(conn, stepReject, []byte(why))
			conn.Close()
		}
		switch {
		case r.err != nil:
			reject("malformed hello")
			continue
		case size != worldSize:
			why := fmt.Sprintf("rank %d belongs to a world of %d ranks, rank 0's has %d", rank, size, worldSize)
			reject(why)
			return fail(errors.New(why))
		case rank < 1 || rank >= worldSize || ranks[rank-1] != nil:
			why := fmt.Sprintf("a process says it is rank %d, which is not a follower of this world of %d or is already connected", rank, worldSize)
			reject(why)
			return fail(errors.New(why))
		}
		if err := writeStepFrame(conn, stepWelcome, nil); err != nil {
			conn.Close()
			return fail(fmt.Errorf("rank %d: welcome: %w", rank, err))
		}
		conn.SetDeadline(time.Time{})
		ranks[rank-1] = &Remote{rank: rank, conn: conn, r: bufio.NewReaderSize(conn, 64<<10), free: free, launches: flags&followLaunches != 0}
		left--
	}
	return ranks, nil
}

// Dial connects a follower to rank 0's step listener at addr and says hello (see dialRank0).
func Dial(ctx context.Context, addr string, rank, worldSize int, free uint64, launches bool) (net.Conn, error) {
	return dialRank0(ctx, addr, rank, worldSize, free, launches)
}

// dialRank0 connects a follower, rank of a world of worldSize ranks, to rank 0's step
// listener at addr, retrying until rank 0 listens, and says hello (with free, the free
// device memory, which sizes the KV cache, and whether it launches steps). It waits no
// longer than ctx.
func dialRank0(ctx context.Context, addr string, rank, worldSize int, free uint64, launches bool) (net.Conn, error) {
	var d net.Dialer
	var conn net.Conn
	for {
		var err error
		if conn, err = d.DialContext(ctx, "tcp", addr); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("rank %d: connect to rank 0 at %s: %w (last: %v)", rank, addr, context.Cause(ctx), err)
		case <-time.After(stepDialRetry):
		}
	}
	hello := []byte(stepMagic)
	hello = binary.LittleEndian.AppendUint32(hello, uint32(rank))
	hello = binary.LittleEndian.AppendUint32(hello, uint32(worldSize))
	hello = binary.LittleEndian.AppendUint64(hello, free)
	flags := byte(0)
	if launches {
		flags |= followLaunches
	}
	hello = append(hello, flags)
	conn.SetDeadline(time.Now().Add(helloWait))
	done := watchConn(ctx, conn)
	err := writeStepFrame(conn, stepHello, hello)
	var typ byte
	var reply []byte
	if err == nil {
		// Unbuffered: the first step may follow the welcome at once, and Follow reads it.
		typ, reply, err = readStepFrame(conn)
	}
	if done() {
		err = context.Cause(ctx)
	}
	switch {
	case err != nil:
		err = fmt.Errorf("rank %d: hello to rank 0 at %s: %w", rank, addr, err)
	case typ == stepReject:
		err = fmt.Errorf("rank %d: rank 0 at %s refused this rank: %s", rank, addr, reply)
	case typ != stepWelcome:
		err = fmt.Errorf("rank %d: rank 0 at %s answered the hello with message type %d", rank, addr, typ)
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	return conn, nil
}

// Follow is the loop of a follower, a rank other than 0 in its own process: it receives
// each step's inputs from rank 0 on conn, adds its own KV caches (laid out by cache, of as
// many blocks as rank 0 says; shape-only tensors when exe keeps them on its device, see
// kvcache.NewCacheShapes; none when cache has no layers), runs exe on them (or, for a
// launch, queues the step on exe, a backend.Launcher, and reads the next frame while it runs)
// and replies, in the order of the steps, that each is done, or with exe's error, which
// rank 0's step then reports. It returns nil when rank 0 says goodbye, and an error naming
// rank 0 when the connection ends otherwise (rank 0 died, or sent what is not a step) or
// ctx ends. It does not close conn.
func Follow(ctx context.Context, exe backend.Executable, cache kvcache.Spec, conn net.Conn) error {
	r := bufio.NewReaderSize(conn, 64<<10)
	launcher, _ := exe.(backend.Launcher)
	// The replies go out from their own goroutine, in order, each once its step is done:
	// a launched step's reply waits for the step while this loop reads the next one.
	replies := make(chan followed, 2)
	replied := make(chan error, 1)
	go func() { replied <- reply(ctx, conn, replies) }()
	finish := func(err error) error {
		close(replies)
		if err != nil {
			return err // a step still in flight ends with the caller's Close
		}
		return <-replied
	}
	var caches *kvcache.Cache
	steps := 0
	for {
		done := watchConn(ctx, conn)
		typ, payload, err := readStepFrame(r)
		if done() {
			return finish(fmt.Errorf("following rank 0: %w", context.Cause(ctx)))
		}
		if err != nil {
			if connGone(err) {
				return finish(fmt.Errorf("rank 0 closed the step connection without a goodbye after %d steps (did it die?): %w", steps, err))
			}
			return finish(fmt.Errorf("read rank 0's next step: %w", err))
		}
		var msg launchMsg
		switch typ {
		case stepBye:
			return finish(nil)
		case stepRun:
			msg.stepMsg, err = decodeStep(payload)
		case stepLaunch:
			msg, err = decodeLaunch(payload)
		default:
			return finish(fmt.Errorf("rank 0 sent message type %d, not a step", typ))
		}
		if err != nil {
			return finish(fmt.Errorf("rank 0's step %d: %w", steps+1, err))
		}
		steps++
		if len(cache.Layers) > 0 {
			if msg.blocks < 1 {
				return finish(fmt.Errorf("rank 0's step %d has no KV cache blocks, but this rank's graph runs on a cache", msg.step))
			}
			if caches == nil || caches.NumBlocks != msg.blocks {
				newCache := kvcache.NewCache
				if backend.Keeps(exe, cacheNames(cache)) {
					newCache = kvcache.NewCacheShapes
				}
				if caches, err = newCache(cache, msg.blocks); err != nil {
					return finish(fmt.Errorf("rank 0's step %d: %w", msg.step, err))
				}
			}
			caches.Bind(msg.inputs)
		}
		f := followed{step: msg.step}
		switch {
		case typ == stepRun:
			f.err = backend.RunDiscard(ctx, exe, msg.inputs)
		case launcher == nil:
			f.err = errors.New("this rank cannot launch steps ahead")
		default:
			f.pend, f.err = launcher.LaunchStep(ctx, msg.inputs, msg.draws, msg.feed, false)
		}
		select {
		case replies <- f:
		case err := <-replied: // the replies stopped: the connection or ctx is gone
			if err == nil {
				err = errors.New("the replies to rank 0 stopped")
			}
			return finish(err)
		}
	}
}

// followed is a step a follower ran (err) or launched (pend, to wait for).
type followed struct {
	step uint64
	pend backend.Pending
	err  error
}

// cacheNames names the inputs of a cache spec's tensors.
func cacheNames(spec kvcache.Spec) []string {
	names := make([]string, 0, 2*len(spec.Layers))
	for _, l := range spec.Layers {
		names = append(names, l.K, l.V)
	}
	return names
}

// reply sends rank 0 the reply of each step from steps, in order, waiting for the launched
// ones; it returns when steps is closed, or with the error that stops it.
func reply(ctx context.Context, conn net.Conn, steps <-chan followed) error {
	for f := range steps {
		if f.pend != nil {
			_, f.err = f.pend.Wait(ctx)
		}
		typ, msg := stepDone, binary.LittleEndian.AppendUint64(nil, f.step)
		if f.err != nil {
			typ, msg = stepFailed, append(msg, f.err.Error()...)
		}
		done := watchConn(ctx, conn)
		err := writeStepFrame(conn, typ, msg)
		if done() {
			return fmt.Errorf("following rank 0: %w", context.Cause(ctx))
		}
		if err != nil {
			return fmt.Errorf("reply to rank 0's step %d (did rank 0 die?): %w", f.step, err)
		}
	}
	return nil
}

// connGone reports that the other end of a connection went away: closed between or
// inside frames, reset (a process that died with unread data in its socket), or a broken
// pipe.
func connGone(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
