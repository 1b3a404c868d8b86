// Package local is the in-process communicator backend: the ranks of a world are goroutines
// of one process that share memory, and collectives read their peers' tensors directly. It
// serves the CPU backend and every multi-rank test.
//
// New returns one *Comm per rank, all sharing one world. Each rank's goroutine calls
// collectives on its own Comm:
//
//	comms, err := local.New(4, local.Options{Timeout: 10 * time.Second})
//	...
//	go func(c *local.Comm) {
//		g, _ := mesh.Group(c.Rank(), "tp")
//		err := c.AllReduce(ctx, g, dist.Sum, x)
//	}(comms[r])
//
// # Guarantees
//
// Results are deterministic and bit-identical on every rank: reductions fold the ranks'
// values in group order (see package dist), and oneshot and twoshot give the same bits.
//
// A collective never hangs. A rank waits for its peers to arrive at most Options.Timeout
// (and no longer than its context); then it fails with a *dist.Error that names the
// collective, the group and the ranks that did not arrive (dist.ErrTimeout). A rank that
// calls Abort, or whose context ends while it waits, fails its peers' pending and later
// calls on every group that holds it (dist.ErrPeerFailed, naming it). A group that failed
// in these ways stays broken (dist.ErrBroken); make a new world to go on.
//
// Calls that are invalid on one rank (a dtype that does not reduce, an axis out of range)
// fail that step on every rank of the group: the rank gets its own error, its peers
// dist.ErrPeerFailed naming it. Calls that disagree across the ranks (collective, dtype,
// shape, axis, op, root, strategy) fail on every rank with dist.ErrMismatch. Neither moves
// any data, and the group stays usable.
//
// Once all the ranks of a group have arrived at a collective, it runs to completion: the
// rest is bounded local work, and a rank must not return while peers still read its tensor.
//
// Collectives over disjoint groups run concurrently: the tp groups of two dp replicas do
// not wait for each other.
//
// # Algorithms
//
// all_reduce has two algorithms, chosen by Options.AllReduceStrategy or per call with
// AllReduceStrategy; both fold in group order and give the same bits.
//
//   - oneshot: each rank copies its tensor to a staging buffer of its own, arrives, and
//     folds every rank's staged copy straight into its tensor. One synchronisation (the
//     arrival), but each rank reads n times the message. Staging buffers are double
//     buffered by step, which is what makes the one synchronisation safe; a rank keeps two
//     per group, the size of its largest oneshot message on that group.
//   - twoshot: rank i folds the i-th of n chunks into its own tensor in place, then copies
//     the other chunks from their owners. Three synchronisations, no extra memory, and
//     each rank reads about twice the message whatever n is.
//   - auto applies dist.StrategyFor: oneshot below 16 KB per rank for 2 ranks, 4 KB for 4
//     (64 KB / n² in general), twoshot above; BenchmarkAllReduce measures the crossover.
//
// A waiting rank polls for a few microseconds, yielding the processor, before it parks:
// ranks of one collective usually arrive within microseconds of each other, and waking a
// parked goroutine costs more.
package local

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/tensor"
)

// DefaultTimeout is the wait for missing peers when Options.Timeout is zero.
const DefaultTimeout = 30 * time.Second

// Options configure a world.
type Options struct {
	// Timeout bounds how long a rank waits in a collective for its peers to arrive; zero
	// means DefaultTimeout. It must not be negative.
	Timeout time.Duration
	// AllReduceStrategy is the allreduce_strategy option: dist.StrategyAuto (or ""),
	// dist.StrategyOneShot or dist.StrategyTwoShot.
	AllReduceStrategy string
}

// Comm is one rank's communicator. It implements dist.Communicator and
// dist.StrategyAllReducer.
type Comm struct {
	w    *world
	rank int
}

var (
	_ dist.Communicator       = (*Comm)(nil)
	_ dist.StrategyAllReducer = (*Comm)(nil)
)

// New makes a world of worldSize ranks and returns their communicators, rank r at index r.
func New(worldSize int, opts Options) ([]*Comm, error) {
	if worldSize < 1 {
		return nil, fmt.Errorf("local: world size %d, want >= 1", worldSize)
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("local: negative timeout %v", opts.Timeout)
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	strategy, err := localStrategy(opts.AllReduceStrategy)
	if err != nil {
		return nil, fmt.Errorf("local: option allreduce_strategy: %w", err)
	}
	w := &world{size: worldSize, timeout: opts.Timeout, strategy: strategy, failed: map[int]error{}, groups: map[string]*group{}}
	comms := make([]*Comm, worldSize)
	for r := range comms {
		comms[r] = &Comm{w: w, rank: r}
	}
	return comms, nil
}

// localStrategy checks a strategy this backend can run.
func localStrategy(s string) (string, error) {
	s, err := dist.ParseStrategy(s)
	if err != nil {
		return "", err
	}
	if s == dist.StrategyNCCL {
		return "", fmt.Errorf("the local backend cannot run strategy %q (want %s, %s or %s)", s, dist.StrategyAuto, dist.StrategyOneShot, dist.StrategyTwoShot)
	}
	return s, nil
}

// Rank is this communicator's rank.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks of the world.
func (c *Comm) Size() int { return c.w.size }

// Abort marks this rank failed with err (nil: "aborted"). Its peers' pending and later
// collectives on every group that holds this rank fail with an error that names it and
// wraps err; this rank's later calls fail with dist.ErrAborted. Collectives whose ranks have
// all arrived still complete. Abort is safe to call from any goroutine, more than once.
func (c *Comm) Abort(err error) {
	if err == nil {
		err = errors.New("aborted")
	}
	w := c.w
	w.mu.Lock()
	if _, done := w.failed[c.rank]; done {
		w.mu.Unlock()
		return
	}
	w.failed[c.rank] = err
	var hit []*group
	for _, g := range w.groups {
		if g.holds(c.rank) {
			hit = append(hit, g)
		}
	}
	w.mu.Unlock()
	cause := fmt.Errorf("%w: rank %d aborted: %w", dist.ErrPeerFailed, c.rank, err)
	for _, g := range hit {
		g.kill(cause, []int{c.rank})
	}
}

// world is the state the ranks share.
type world struct {
	size     int
	timeout  time.Duration
	strategy string // the configured allreduce_strategy, checked

	mu     sync.Mutex
	failed map[int]error     // aborted ranks and why
	groups map[string]*group // by groupKey

	// arrived, when set (by tests, before any rank runs), is called with a rank's number
	// each time its call has arrived at a step, before it waits for its peers.
	arrived func(rank int)
}

// group is the shared state of one ordered set of ranks.
type group struct {
	ranks []int

	mu   sync.Mutex
	next []uint64       // the next step of each member, by group index
	ops  map[uint64]*op // steps in progress
	// stage holds each member's oneshot staging buffers, by group index and step parity.
	// Member i writes stage[i][p] before it arrives at a step of parity p; its peers read
	// it after every member has arrived. Its next write, two steps later, comes after
	// every peer has arrived at the step in between, so after they have finished reading.
	stage [][2]stageBuf
	dead  chan struct{} // closed when the group breaks
	// Set before dead closes: why the group broke, and the ranks at fault.
	cause    error
	culprits []int
}

// groupKey appends the key of a group's ranks to b.
func groupKey(b []byte, ranks []int) []byte {
	for i, r := range ranks {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(r), 10)
	}
	return b
}

func (g *group) holds(rank int) bool {
	for _, r := range g.ranks {
		if r == rank {
			return true
		}
	}
	return false
}

// kill breaks the group, unless it is broken already.
func (g *group) kill(cause error, culprits []int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.killLocked(cause, culprits)
}

func (g *group) killLocked(cause error, culprits []int) {
	if g.cause != nil {
		return
	}
	g.cause, g.culprits = cause, culprits
	close(g.dead)
}

// group finds or makes the shared state of ranks, for rank, which must not have aborted.
func (w *world) group(rank int, ranks []int) (*group, error) {
	var buf [64]byte
	key := groupKey(buf[:0], ranks)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err, ok := w.failed[rank]; ok {
		return nil, fmt.Errorf("%w: %w", dist.ErrAborted, err)
	}
	if g, ok := w.groups[string(key)]; ok { // no allocation for the lookup
		return g, nil
	}
	g := &group{
		ranks: append([]int(nil), ranks...),
		next:  make([]uint64, len(ranks)),
		ops:   map[uint64]*op{},
		stage: make([][2]stageBuf, len(ranks)),
		dead:  make(chan struct{}),
	}
	var failed []int
	format, args := "%w: ", []any{dist.ErrPeerFailed}
	for _, r := range ranks {
		if err, ok := w.failed[r]; ok {
			if len(failed) > 0 {
				format += "; "
			}
			failed = append(failed, r)
			format += "rank %d aborted: %w"
			args = append(args, r, err)
		}
	}
	if len(failed) > 0 {
		g.killLocked(fmt.Errorf(format, args...), failed)
	}
	w.groups[string(key)] = g
	return g, nil
}

// call is one rank's side of a collective: what it asks for, for cross-checking, and its
// tensor.
type call struct {
	kind     string
	axis     string // the group's axis name
	t        *tensor.Tensor
	op       dist.ReduceOp
	strategy string         // all_reduce: the strategy asked for (before auto is resolved)
	a, b     int            // axis; split and concat axes; root
	stage    *tensor.Tensor // oneshot all_reduce: this rank's staged copy of t
	err      error          // the call is invalid on this rank
	posted   bool
}

func (c *call) describe() string {
	var sb strings.Builder
	sb.WriteString(c.kind)
	if c.t != nil {
		fmt.Fprintf(&sb, " %s%v", c.t.DType, c.t.Shape)
	}
	switch c.kind {
	case "all_reduce":
		fmt.Fprintf(&sb, " op=%s strategy=%s", c.op, c.strategy)
	case "all_gather":
		fmt.Fprintf(&sb, " axis=%d", c.a)
	case "reduce_scatter":
		fmt.Fprintf(&sb, " op=%s axis=%d", c.op, c.a)
	case "all_to_all":
		fmt.Fprintf(&sb, " split_axis=%d concat_axis=%d", c.a, c.b)
	case "broadcast":
		fmt.Fprintf(&sb, " root=%d", c.a)
	}
	fmt.Fprintf(&sb, " on axis %q", c.axis)
	return sb.String()
}

// matches reports whether two ranks' calls agree.
func (c *call) matches(o *call) bool {
	if c.kind != o.kind || c.axis != o.axis || c.op != o.op || c.strategy != o.strategy || c.a != o.a || c.b != o.b {
		return false
	}
	if (c.t == nil) != (o.t == nil) {
		return false
	}
	if c.t == nil {
		return true
	}
	if c.t.DType != o.t.DType || len(c.t.Shape) != len(o.t.Shape) {
		return false
	}
	for i := range c.t.Shape {
		if c.t.Shape[i] != o.t.Shape[i] {
			return false
		}
	}
	return true
}

// op is one step of a group: the collective that its ranks' step-th calls make together.
type op struct {
	calls   []call
	arrived int
	arrive  chan struct{} // closed when every rank has arrived
	ready   atomic.Bool   // set as arrive closes, for spinning waiters
	bars    [2]barrier    // synchronisations after arrival
	left    int
}

type barrier struct {
	count int
	done  chan struct{}
	ready atomic.Bool // set as done closes
}

// session is one rank inside one collective.
type session struct {
	c     *Comm
	g     dist.Group
	gs    *group
	o     *op
	idx   int
	step  uint64
	kind  string
	calls []call // every rank's call, valid once all have arrived
}

func (s *session) errorf(peers []int, err error) error {
	return &dist.Error{Collective: s.kind, Group: s.g, Rank: s.c.rank, Step: s.step, Peers: peers, Err: err}
}

// enter arrives at the next step of the group with cl and waits for the other ranks. On
// success every rank's call is in s.calls and agrees with this one; the caller runs the
// collective and then calls leave. stage, if not nil, runs once the step is known and
// before this rank arrives, when its call is valid (oneshot all_reduce copies its input to
// its staging buffer there).
func (c *Comm) enter(ctx context.Context, g dist.Group, cl call, stage func(s *session, cl *call)) (*session, error) {
	s := &session{c: c, g: g, kind: cl.kind, idx: g.Index}
	if err := g.Validate(c.rank, c.w.size); err != nil {
		return nil, s.errorf(nil, err)
	}
	gs, err := c.w.group(c.rank, g.Ranks)
	if err != nil {
		return nil, s.errorf(nil, err)
	}
	s.gs = gs
	cl.axis = g.Axis
	cl.posted = true
	n := len(g.Ranks)

	// Take the step. Only this rank touches gs.next[s.idx] and its staging buffers.
	gs.mu.Lock()
	s.step = gs.next[s.idx]
	if gs.cause != nil {
		cause, culprits := gs.cause, gs.culprits
		gs.mu.Unlock()
		return nil, s.errorf(culprits, fmt.Errorf("%w: %w", dist.ErrBroken, cause))
	}
	gs.next[s.idx]++
	gs.mu.Unlock()
	if stage != nil && cl.err == nil {
		stage(s, &cl)
	}

	// Arrive. An invalid call arrives too, so that the peers learn of it; the step
	// completes on every rank either way.
	gs.mu.Lock()
	if gs.cause != nil {
		cause, culprits := gs.cause, gs.culprits
		gs.mu.Unlock()
		return nil, s.errorf(culprits, cause)
	}
	o := gs.ops[s.step]
	if o == nil {
		o = &op{calls: make([]call, n), arrive: make(chan struct{})}
		gs.ops[s.step] = o
	}
	s.o = o
	o.calls[s.idx] = cl
	o.arrived++
	if o.arrived == n {
		o.ready.Store(true)
		close(o.arrive)
	}
	complete := o.arrived == n
	gs.mu.Unlock()
	if c.w.arrived != nil {
		c.w.arrived(c.rank)
	}

	if !complete {
		if err := s.waitArrival(ctx); err != nil {
			return nil, err
		}
	}
	s.calls = o.calls
	if err := s.check(); err != nil {
		s.leave()
		return nil, err
	}
	return s, nil
}

// waitArrival waits until every rank has arrived, the group breaks, the context ends or
// the timeout passes.
func (s *session) waitArrival(ctx context.Context) error {
	w, gs, o := s.c.w, s.gs, s.o
	if spin(&o.ready) {
		return nil
	}
	timer := time.NewTimer(w.timeout)
	defer timer.Stop()
	var timedOut bool
	select {
	case <-o.arrive:
		return nil
	case <-gs.dead:
	case <-ctx.Done():
	case <-timer.C:
		timedOut = true
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if o.arrived == len(o.calls) { // everyone came after all: run the collective
		return nil
	}
	switch {
	case gs.cause != nil:
		return s.errorf(gs.culprits, gs.cause)
	case ctx.Err() != nil:
		gs.killLocked(fmt.Errorf("%w: rank %d left %s: %w", dist.ErrPeerFailed, s.c.rank, s.kind, ctx.Err()), []int{s.c.rank})
		return s.errorf(nil, ctx.Err())
	case timedOut:
		var missing []int
		for i, cl := range o.calls {
			if !cl.posted {
				missing = append(missing, s.g.Ranks[i])
			}
		}
		who := "rank " + strconv.Itoa(missing[0])
		if len(missing) > 1 {
			who = fmt.Sprintf("ranks %v", missing)
		}
		cause := fmt.Errorf("%s did not arrive at %s within %v: %w", who, s.kind, w.timeout, dist.ErrTimeout)
		gs.killLocked(cause, missing)
		return s.errorf(missing, cause)
	}
	return s.errorf(nil, errors.New("local: internal error: woken without a cause"))
}

// check verifies that every rank made a valid call and that all the calls agree. Every
// rank sees the same calls, so every rank returns the same verdict.
func (s *session) check() error {
	if err := s.calls[s.idx].err; err != nil {
		return s.errorf(nil, err)
	}
	for i := range s.calls {
		if err := s.calls[i].err; err != nil {
			r := s.g.Ranks[i]
			return s.errorf([]int{r}, fmt.Errorf("%w: rank %d made an invalid %s call: %w", dist.ErrPeerFailed, r, s.calls[i].kind, err))
		}
	}
	first := &s.calls[0]
	for i := 1; i < len(s.calls); i++ {
		if !s.calls[i].matches(first) {
			return s.errorf([]int{s.g.Ranks[i]}, fmt.Errorf("%w: rank %d called %s, rank %d called %s",
				dist.ErrMismatch, s.g.Ranks[0], first.describe(), s.g.Ranks[i], s.calls[i].describe()))
		}
	}
	if first.kind == "all_reduce" || first.kind == "broadcast" { // written in place
		for i := range s.calls {
			for j := range i {
				if sameStorage(s.calls[i].t, s.calls[j].t) {
					return s.errorf([]int{s.g.Ranks[j], s.g.Ranks[i]}, fmt.Errorf("%w: ranks %d and %d pass the same tensor storage to %s",
						dist.ErrMismatch, s.g.Ranks[j], s.g.Ranks[i], first.kind))
				}
			}
		}
	}
	return nil
}

// barrier waits until every rank of the collective has reached synchronisation k. Every
// rank has arrived and only runs bounded local work, so this waits for nothing else.
func (s *session) barrier(k int) {
	gs, b := s.gs, &s.o.bars[k]
	gs.mu.Lock()
	if b.done == nil {
		b.done = make(chan struct{})
	}
	b.count++
	if b.count == len(s.calls) {
		b.ready.Store(true)
		close(b.done)
	}
	done := b.done
	gs.mu.Unlock()
	if !spin(&b.ready) {
		<-done
	}
}

// spinFor is how long a waiting rank polls before it parks. Ranks usually arrive within
// microseconds of each other, and waking a parked goroutine on another processor costs
// more than that.
const spinFor = 20 * time.Microsecond

// spin polls flag for up to spinFor, yielding the processor between polls so that a rank
// it waits for can run even when ranks outnumber processors. It reports whether flag was
// set.
func spin(flag *atomic.Bool) bool {
	start := time.Now()
	for {
		if flag.Load() {
			return true
		}
		if time.Since(start) > spinFor {
			return false
		}
		runtime.Gosched()
	}
}

// leave ends this rank's part in the collective.
func (s *session) leave() {
	s.gs.mu.Lock()
	s.leaveLocked()
	s.gs.mu.Unlock()
}

func (s *session) leaveLocked() {
	s.o.left++
	if s.o.left == len(s.o.calls) {
		delete(s.gs.ops, s.step)
	}
}
