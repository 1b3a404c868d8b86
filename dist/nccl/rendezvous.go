package nccl

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/loom-ml/loom/dist"
)

// The rendezvous: rank 0 listens on MASTER_ADDR:MASTER_PORT, every other rank connects and
// says who it is, and once all have arrived rank 0 hands each the payload it made (the NCCL
// unique id). The connections then stay open as the world's liveness channel: every rank
// sends a heartbeat to the other end every Options.Heartbeat, a rank that closes its world
// says goodbye, one that aborts says why, and rank 0 relays whatever it learns about one
// rank to all the others. A process that dies closes its sockets, so its peers learn it at
// once; one that hangs (stopped, or a lost host) is declared failed after
// Options.PeerTimeout of silence. The links form a star around rank 0: when rank 0 dies,
// every rank learns it directly.
//
// Frames are a type byte, a big-endian uint32 length and the payload.

const (
	msgHello      byte = iota + 1 // rank -> 0: helloMagic, rank (u32), world size (u32)
	msgWelcome                    // 0 -> rank: the payload
	msgReject                     // 0 -> rank: a reason code byte, then the reason
	msgPing                       // either way: heartbeat
	msgBye                        // either way: the sender closed its world
	msgAbort                      // either way: the sender aborted; payload is the reason
	msgPeerFailed                 // 0 -> rank: rank (u32), then "how\x00reason"
)

const (
	helloMagic     = "loom-nccl-rendezvous/1"
	maxFrame       = 1 << 20
	rejectTimeout  = 1 // rank 0 gave up waiting for a rank
	rejectInvalid  = 2 // the world's configuration is inconsistent
	rejectComplete = 3 // the rendezvous was over when the rank arrived
	dialRetry      = 50 * time.Millisecond
	sendTimeout    = 2 * time.Second
)

// The defaults of Options.
const (
	DefaultTimeout     = 120 * time.Second
	DefaultHeartbeat   = time.Second
	DefaultPeerTimeout = 10 * time.Second
)

// Options configure a multi-process world: its rendezvous, its liveness channel and how
// long World.Sync waits (dist.ProcessOptions; zero fields take DefaultTimeout,
// DefaultHeartbeat and DefaultPeerTimeout).
type Options = dist.ProcessOptions

// withDefaults fills o's zero fields with the defaults.
func withDefaults(o Options) Options {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = DefaultHeartbeat
	}
	if o.PeerTimeout <= 0 {
		o.PeerTimeout = DefaultPeerTimeout
	}
	if o.PeerTimeout <= o.Heartbeat {
		o.PeerTimeout = 3 * o.Heartbeat
	}
	return o
}

// PeerError says that another rank of the world failed, as this rank learnt it. It matches
// dist.ErrPeerFailed with errors.Is.
type PeerError struct {
	Rank int    // the rank that failed
	How  string // "died or disconnected", "stopped responding", "left" (closed its world) or "aborted"
	Err  error  // what was seen: the connection error, the silence, or the reason the peer gave
}

func (e *PeerError) Error() string {
	return fmt.Sprintf("rank %d %s: %v", e.Rank, e.How, e.Err)
}

// Unwrap gives dist.ErrPeerFailed and the cause.
func (e *PeerError) Unwrap() []error { return []error{dist.ErrPeerFailed, e.Err} }

// Peers is one rank's end of the liveness channel that Rendezvous leaves open. Its methods
// are safe for concurrent use.
type Peers struct {
	rank, size int
	opts       Options
	links      []*link // by remote rank; rank 0 holds one per other rank, the others links[0] only
	events     chan event
	done       chan struct{}
	wg         sync.WaitGroup
	closing    atomic.Bool
	closeOnce  sync.Once
	abortOnce  sync.Once

	mu       sync.Mutex
	failure  *PeerError // the first failure learnt
	failed   chan struct{}
	reported []bool  // rank 0: failures already relayed, by rank
	accepted []*link // rank 0: every connection accepted, to close them all at the end
}

// track records a connection rank 0 accepted, unless the Peers are shutting down.
func (p *Peers) track(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing.Load() {
		return false
	}
	p.accepted = append(p.accepted, l)
	return true
}

// link is one TCP connection to another rank.
type link struct {
	rank int // the remote rank; -1 until its hello arrives, droppedLink once dropped (rank 0's side)
	conn net.Conn
	r    *bufio.Reader
	wmu  sync.Mutex
	live atomic.Bool // in the liveness phase: each frame read renews the read deadline
}

func (l *link) send(typ byte, payload []byte) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.conn.SetWriteDeadline(time.Now().Add(sendTimeout))
	return writeFrame(l.conn, typ, payload)
}

// droppedLink is the rank of a connection rank 0 dropped during the rendezvous: frames its
// reader had already queued (a hello after a first frame that was not one) are ignored, where
// they used to make the closed connection rank 1, and the welcome to it fail the world.
const droppedLink = -2

type event struct {
	l       *link
	typ     byte
	payload []byte
	err     error
}

func writeFrame(w io.Writer, typ byte, payload []byte) error { return dist.WriteFrame(w, typ, payload) }

func readFrame(r io.Reader) (byte, []byte, error) {
	return dist.ReadFrame(r, maxFrame, "a Loom rendezvous peer")
}

func helloPayload(rank, size int) []byte {
	b := append([]byte(helloMagic), make([]byte, 8)...)
	binary.BigEndian.PutUint32(b[len(helloMagic):], uint32(rank))
	binary.BigEndian.PutUint32(b[len(helloMagic)+4:], uint32(size))
	return b
}

func parseHello(b []byte) (rank, size int, err error) {
	if len(b) != len(helloMagic)+8 || string(b[:len(helloMagic)]) != helloMagic {
		return 0, 0, errors.New("not a Loom rendezvous hello")
	}
	return int(binary.BigEndian.Uint32(b[len(helloMagic):])), int(binary.BigEndian.Uint32(b[len(helloMagic)+4:])), nil
}

// Rendezvous brings the env.WorldSize ranks together at env.Addr() and returns this rank's
// end of the liveness channel and the payload that rank 0 made with newID (newID is called
// on rank 0 only, once, before it listens). It waits at most opts.Timeout and no longer
// than ctx; on a timeout rank 0's error names the ranks that never connected, and so do
// the errors of the ranks that did (wrapping dist.ErrTimeout). ctx bounds the rendezvous
// only, not the liveness channel that outlives it; close that with Peers.Close.
func Rendezvous(ctx context.Context, env Env, opts Options, newID func() ([]byte, error)) (*Peers, []byte, error) {
	opts = withDefaults(opts)
	if env.WorldSize < 1 || env.Rank < 0 || env.Rank >= env.WorldSize {
		return nil, nil, fmt.Errorf("nccl: rendezvous: rank %d out of range for a world of %d", env.Rank, env.WorldSize)
	}
	p := &Peers{
		rank: env.Rank, size: env.WorldSize, opts: opts,
		links:  make([]*link, env.WorldSize),
		events: make(chan event, 16),
		done:   make(chan struct{}),
		failed: make(chan struct{}),
	}
	var payload []byte
	var err error
	if env.Rank == 0 {
		payload, err = p.serve(ctx, env, newID)
	} else {
		payload, err = p.join(ctx, env)
	}
	if err != nil {
		p.shutdown(false)
		return nil, nil, fmt.Errorf("nccl: rendezvous at %s: rank %d: %w", env.Addr(), env.Rank, err)
	}
	p.wg.Add(2)
	go p.monitor()
	go p.heartbeat()
	return p, payload, nil
}

// serve is rank 0's side of the rendezvous.
func (p *Peers) serve(ctx context.Context, env Env, newID func() ([]byte, error)) ([]byte, error) {
	id, err := newID()
	if err != nil {
		return nil, fmt.Errorf("make the id: %w", err)
	}
	if p.size == 1 {
		return id, nil
	}
	deadline := time.Now().Add(p.opts.Timeout)
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", env.Addr())
	if err != nil {
		return nil, fmt.Errorf("listen (is %s=%d taken, or %s=%s not an address of this host?): %w",
			EnvMasterPort, env.MasterPort, EnvMasterAddr, env.MasterAddr, err)
	}
	defer ln.Close()
	p.reported = make([]bool, p.size)
	p.wg.Add(1)
	go func() { // accept until the listener closes
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.SetReadDeadline(deadline.Add(time.Second))
			l := &link{rank: -1, conn: c, r: bufio.NewReader(c)}
			if !p.track(l) {
				c.Close()
				return
			}
			p.wg.Add(1)
			go p.readLoop(l)
		}
	}()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	arrived := 0
	for arrived < p.size-1 {
		select {
		case ev := <-p.events:
			l := ev.l
			if l.rank == droppedLink {
				continue // a frame read before the connection was dropped: not a hello to take
			}
			if ev.err != nil || ev.typ != msgHello || l.rank >= 0 {
				// A connection that dropped or spoke out of turn: forget it. A rank that
				// dropped before the rendezvous completed may connect again.
				if l.rank > 0 && p.links[l.rank] == l {
					p.links[l.rank] = nil
					arrived--
				}
				l.rank = droppedLink
				l.conn.Close()
				continue
			}
			rank, size, err := parseHello(ev.payload)
			var bad string
			switch {
			case err != nil:
				l.rank = droppedLink
				l.conn.Close()
				continue
			case size != p.size:
				bad = fmt.Sprintf("rank %d has %s=%d, rank 0 has %d", rank, EnvWorldSize, size, p.size)
			case rank <= 0 || rank >= p.size:
				bad = fmt.Sprintf("a process connected as rank %d, out of range for %s=%d", rank, EnvWorldSize, p.size)
			case p.links[rank] != nil:
				bad = fmt.Sprintf("two processes connected as rank %d", rank)
			}
			if bad != "" {
				l.send(msgReject, append([]byte{rejectInvalid}, bad...))
				l.conn.Close()
				p.rejectAll(rejectInvalid, bad)
				return nil, errors.New(bad)
			}
			l.rank = rank
			p.links[rank] = l
			arrived++
		case <-timer.C:
			var missing []int
			for r := 1; r < p.size; r++ {
				if p.links[r] == nil {
					missing = append(missing, r)
				}
			}
			why := fmt.Sprintf("timed out after %v waiting for %s to connect", p.opts.Timeout, rankList(missing))
			p.rejectAll(rejectTimeout, "rank 0 "+why)
			return nil, fmt.Errorf("%s: %w", why, dist.ErrTimeout)
		case <-ctx.Done():
			p.rejectAll(rejectInvalid, "rank 0 stopped: "+context.Cause(ctx).Error())
			return nil, context.Cause(ctx)
		}
	}
	ln.Close()
	for r := 1; r < p.size; r++ {
		l := p.links[r]
		l.live.Store(true)
		l.conn.SetReadDeadline(time.Now().Add(p.opts.PeerTimeout))
		if err := l.send(msgWelcome, id); err != nil {
			p.rejectAll(rejectInvalid, fmt.Sprintf("rank 0 could not reach rank %d", r))
			return nil, &PeerError{Rank: r, How: "died or disconnected", Err: err}
		}
	}
	return id, nil
}

// rejectAll tells every connected rank that the rendezvous failed.
func (p *Peers) rejectAll(code byte, why string) {
	for _, l := range p.links {
		if l != nil {
			l.send(msgReject, append([]byte{code}, why...))
		}
	}
}

// join is the side of the rendezvous of a rank other than 0.
func (p *Peers) join(ctx context.Context, env Env) ([]byte, error) {
	deadline := time.Now().Add(p.opts.Timeout)
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var conn net.Conn
	for {
		var d net.Dialer
		c, err := d.DialContext(dctx, "tcp", env.Addr())
		if err == nil {
			conn = c
			break
		}
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if dctx.Err() != nil || time.Now().Add(dialRetry).After(deadline) {
			return nil, fmt.Errorf("timed out after %v connecting to rank 0 (last error: %v): %w", p.opts.Timeout, err, dist.ErrTimeout)
		}
		select {
		case <-time.After(dialRetry):
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
	l := &link{rank: 0, conn: conn, r: bufio.NewReader(conn)}
	p.links[0] = l
	if err := l.send(msgHello, helloPayload(p.rank, p.size)); err != nil {
		return nil, &PeerError{Rank: 0, How: "died or disconnected", Err: err}
	}
	// Rank 0 answers when every rank has arrived, or when it gives up (naming the missing
	// ranks): wait a little longer than it would.
	conn.SetReadDeadline(deadline.Add(2 * time.Second))
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	typ, payload, err := readFrame(l.r)
	if !stop() || ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return nil, fmt.Errorf("timed out after %v waiting for rank 0 to hand out the id: %w", p.opts.Timeout, dist.ErrTimeout)
	case err != nil:
		return nil, &PeerError{Rank: 0, How: "died or disconnected", Err: err}
	case typ == msgReject && len(payload) > 0:
		why := errors.New(string(payload[1:]))
		if payload[0] == rejectTimeout {
			return nil, fmt.Errorf("%w: %w", why, dist.ErrTimeout)
		}
		return nil, why
	case typ != msgWelcome:
		return nil, fmt.Errorf("unexpected message %d from rank 0", typ)
	}
	l.live.Store(true)
	conn.SetReadDeadline(time.Now().Add(p.opts.PeerTimeout))
	p.wg.Add(1)
	go p.readLoop(l)
	return payload, nil
}

// readLoop delivers every frame of l, and finally its error, to the events channel.
func (p *Peers) readLoop(l *link) {
	defer p.wg.Done()
	for {
		typ, payload, err := readFrame(l.r)
		if err == nil && l.live.Load() {
			l.conn.SetReadDeadline(time.Now().Add(p.opts.PeerTimeout))
		}
		select {
		case p.events <- event{l: l, typ: typ, payload: payload, err: err}:
		case <-p.done:
			return
		}
		if err != nil {
			return
		}
	}
}

// monitor handles the events of the liveness phase.
func (p *Peers) monitor() {
	defer p.wg.Done()
	for {
		select {
		case <-p.done:
			return
		case ev := <-p.events:
			p.handle(ev)
		}
	}
}

func (p *Peers) handle(ev event) {
	l := ev.l
	if l.rank < 0 || (p.rank == 0 && p.links[l.rank] != l) {
		// A connection to rank 0 after the rendezvous completed.
		if ev.err == nil && ev.typ == msgHello {
			l.send(msgReject, append([]byte{rejectComplete}, "the rendezvous is over: every rank has joined"...))
		}
		l.conn.Close()
		return
	}
	if ev.err != nil {
		if p.closing.Load() {
			return
		}
		l.conn.Close()
		var ne net.Error
		if errors.As(ev.err, &ne) && ne.Timeout() {
			p.peerFailed(l.rank, "stopped responding", fmt.Errorf("no heartbeat for %v", p.opts.PeerTimeout))
		} else {
			p.peerFailed(l.rank, "died or disconnected", ev.err)
		}
		return
	}
	switch ev.typ {
	case msgPing:
	case msgBye:
		l.conn.Close()
		p.peerFailed(l.rank, "left", errors.New("it closed its world"))
	case msgAbort:
		p.peerFailed(l.rank, "aborted", errors.New(string(ev.payload)))
	case msgPeerFailed:
		if p.rank != 0 && len(ev.payload) >= 4 {
			r := int(binary.BigEndian.Uint32(ev.payload))
			how, why, _ := strings.Cut(string(ev.payload[4:]), "\x00")
			p.peerFailed(r, how, fmt.Errorf("%s (reported by rank 0)", why))
		}
	}
}

// peerFailed records the failure of rank (the first one is what Err returns) and, on rank
// 0, tells every other rank.
func (p *Peers) peerFailed(rank int, how string, err error) {
	p.mu.Lock()
	if p.failure == nil {
		p.failure = &PeerError{Rank: rank, How: how, Err: err}
		close(p.failed)
	}
	relay := p.rank == 0 && rank > 0 && rank < p.size && !p.reported[rank]
	if relay {
		p.reported[rank] = true
	}
	p.mu.Unlock()
	if !relay {
		return
	}
	msg := binary.BigEndian.AppendUint32(nil, uint32(rank))
	msg = append(msg, how+"\x00"+err.Error()...)
	for r, l := range p.links {
		if l != nil && r != rank {
			l.send(msgPeerFailed, msg)
		}
	}
}

// heartbeat sends a ping on every link every Options.Heartbeat.
func (p *Peers) heartbeat() {
	defer p.wg.Done()
	t := time.NewTicker(p.opts.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
			for _, l := range p.links {
				if l != nil {
					l.send(msgPing, nil) // a failed send shows up on the reading side
				}
			}
		}
	}
}

// Rank is this rank, Size the number of ranks of the world.
func (p *Peers) Rank() int { return p.rank }

// Size is the number of ranks of the world.
func (p *Peers) Size() int { return p.size }

// Err returns the first failure of another rank that this rank learnt (a *PeerError), or
// nil while every peer is alive.
func (p *Peers) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failure == nil {
		return nil
	}
	return p.failure
}

// Failed is closed when Err becomes non-nil.
func (p *Peers) Failed() <-chan struct{} { return p.failed }

// Abort tells the other ranks that this rank gave up, and why; they see a PeerError
// "aborted" naming it. The links stay open (Close them).
func (p *Peers) Abort(reason string) {
	p.abortOnce.Do(func() {
		for _, l := range p.links {
			if l != nil {
				l.send(msgAbort, []byte(reason))
			}
		}
	})
}

// Close says goodbye to the other ranks (they see this rank "left") and closes the links.
func (p *Peers) Close() error {
	p.shutdown(true)
	return nil
}

// shutdown closes every link, saying goodbye first when graceful, and stops the
// goroutines.
func (p *Peers) shutdown(graceful bool) {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closing.Store(true)
		accepted := p.accepted
		p.mu.Unlock()
		for _, l := range p.links {
			if l == nil {
				continue
			}
			if graceful {
				l.send(msgBye, nil)
			}
			l.conn.Close()
		}
		for _, l := range accepted {
			l.conn.Close()
		}
		close(p.done)
		p.wg.Wait()
	})
}

// kill drops every link without a goodbye, as a crash would (tests).
func (p *Peers) kill() { p.shutdown(false) }

// rankList writes ranks as "rank 2" or "ranks 1, 3".
func rankList(ranks []int) string {
	if len(ranks) == 1 {
		return fmt.Sprintf("rank %d", ranks[0])
	}
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = fmt.Sprint(r)
	}
	return "ranks " + strings.Join(s, ", ")
}
