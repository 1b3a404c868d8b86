package local

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/tensor"
)

// newWorld makes a world of n ranks or fails the test.
func newWorld(t testing.TB, n int, opts Options) []*Comm {
	t.Helper()
	comms, err := New(n, opts)
	if err != nil {
		t.Fatal(err)
	}
	return comms
}

// run calls fn on every rank concurrently and returns each rank's error. It fails the test
// if the ranks do not all return within a minute (a hang).
func run(t testing.TB, comms []*Comm, fn func(c *Comm) error) []error {
	t.Helper()
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Go(func() { errs[i] = fn(c) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("ranks did not return within a minute")
	}
	return errs
}

// onArrival makes the world of comms report its ranks' calls as they arrive at collectives,
// before they wait for their peers. It must be called while no rank runs. The function it
// returns waits until each of ranks has arrived once more than it had been waited for (each
// arrival is waited for once); after a minute it fails the test and returns false.
func onArrival(t testing.TB, comms []*Comm) (wait func(ranks ...int) bool) {
	chs := make([]chan struct{}, len(comms))
	for i := range chs {
		chs[i] = make(chan struct{}, 1024)
	}
	comms[0].w.arrived = func(rank int) { chs[rank] <- struct{}{} }
	return func(ranks ...int) bool {
		for _, r := range ranks {
			select {
			case <-chs[r]:
			case <-time.After(time.Minute):
				t.Errorf("rank %d did not arrive within a minute", r)
				return false
			}
		}
		return true
	}
}

// noErrors fails the test on any rank's error.
func noErrors(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// worldGroup is the group of every rank, seen from rank.
func worldGroup(n, rank int) dist.Group {
	ranks := make([]int, n)
	for i := range ranks {
		ranks[i] = i
	}
	return dist.Group{Axis: dist.WorldAxis, Ranks: ranks, Index: rank}
}

// value is the test datum of rank r at element i: varied, signed, with bits below any
// half's precision, so that the order of summation shows.
func value(r, i int) float64 {
	return math.Sin(float64(r*7919+i*104729)) * 97.3
}

// input makes rank r's tensor of the given dtype and shape.
func input(dt tensor.DType, r int, shape ...int) *tensor.Tensor {
	t := tensor.New(dt, shape...)
	for i := range t.Numel() {
		v := value(r, i)
		switch dt {
		case tensor.F32:
			t.F32[i] = float32(v)
		case tensor.BF16:
			t.Half[i] = tensor.F32ToBF16(float32(v))
		case tensor.F16:
			t.Half[i] = tensor.F32ToF16(float32(v))
		case tensor.I32:
			t.I32[i] = int32(v * 1e7) // large enough that sums wrap sometimes
		case tensor.I64:
			t.I64[i] = int64(v * 1e15)
		case tensor.Bool:
			t.Bool[i] = v > 0
		}
	}
	return t
}

// fold is the reference reduction of element i over the given tensors, in order: f32
// accumulation, rounded once to the dtype.
func fold(ts []*tensor.Tensor, i int, op dist.ReduceOp) *tensor.Tensor {
	dt := ts[0].DType
	out := tensor.New(dt, 1)
	if dt == tensor.I32 {
		acc := ts[0].I32[i]
		for _, t := range ts[1:] {
			if op == dist.Sum {
				acc += t.I32[i]
			} else if t.I32[i] > acc {
				acc = t.I32[i]
			}
		}
		out.I32[0] = acc
		return out
	}
	acc := float32(ts[0].At(i))
	for _, t := range ts[1:] {
		v := float32(t.At(i))
		if op == dist.Sum {
			acc += v
		} else if v > acc || v != v {
			acc = v
		}
	}
	out.F32 = nil
	out.Half = nil
	switch dt {
	case tensor.F32:
		out.F32 = []float32{acc}
	case tensor.BF16:
		out.Half = []uint16{tensor.F32ToBF16(acc)}
	case tensor.F16:
		out.Half = []uint16{tensor.F32ToF16(acc)}
	}
	return out
}

// sameBits reports whether element i of a and element j of b have identical bits.
func sameBits(a *tensor.Tensor, i int, b *tensor.Tensor, j int) bool {
	switch a.DType {
	case tensor.F32:
		return math.Float32bits(a.F32[i]) == math.Float32bits(b.F32[j])
	case tensor.BF16, tensor.F16:
		return a.Half[i] == b.Half[j]
	case tensor.I32:
		return a.I32[i] == b.I32[j]
	case tensor.I64:
		return a.I64[i] == b.I64[j]
	case tensor.Bool:
		return a.Bool[i] == b.Bool[j]
	}
	return false
}

var (
	reducible = []tensor.DType{tensor.F32, tensor.BF16, tensor.F16, tensor.I32}
	allDTypes = []tensor.DType{tensor.F32, tensor.BF16, tensor.F16, tensor.I32, tensor.I64, tensor.Bool}
)

func TestAllReduce(t *testing.T) {
	ctx := context.Background()
	for _, n := range []int{1, 2, 3, 4} {
		for _, strategy := range []string{dist.StrategyOneShot, dist.StrategyTwoShot, dist.StrategyAuto} {
			comms := newWorld(t, n, Options{AllReduceStrategy: strategy})
			for _, dt := range reducible {
				for _, op := range []dist.ReduceOp{dist.Sum, dist.Max} {
					for _, m := range []int{0, 1, 33, 3001} {
						t.Run(fmt.Sprintf("n=%d/%s/%s/%s/m=%d", n, strategy, dt, op, m), func(t *testing.T) {
							ins := make([]*tensor.Tensor, n)
							outs := make([]*tensor.Tensor, n)
							for r := range n {
								ins[r] = input(dt, r, m)
								outs[r] = ins[r].Clone()
							}
							noErrors(t, run(t, comms, func(c *Comm) error {
								return c.AllReduce(ctx, worldGroup(n, c.Rank()), op, outs[c.Rank()])
							}))
							for i := range m {
								want := fold(ins, i, op)
								for r := range n {
									if !sameBits(outs[r], i, want, 0) {
										t.Fatalf("rank %d element %d: %v, want %v", r, i, outs[r].At(i), want.At(0))
									}
								}
							}
						})
					}
				}
			}
		}
	}
}

// TestAllReduceStrategiesAgree checks that oneshot and twoshot give the same bits, per call
// and for a 2-D tensor, on a group that is not the world.
func TestAllReduceStrategiesAgree(t *testing.T) {
	ctx := context.Background()
	comms := newWorld(t, 4, Options{})
	for _, dt := range reducible {
		res := map[string][]*tensor.Tensor{}
		for _, s := range []string{dist.StrategyOneShot, dist.StrategyTwoShot} {
			outs := make([]*tensor.Tensor, 4)
			noErrors(t, run(t, comms, func(c *Comm) error {
				if c.Rank() == 0 {
					return nil // the group is ranks 3, 1, 2, in that order
				}
				g, err := dist.NewGroup("ep", []int{3, 1, 2}, c.Rank())
				if err != nil {
					return err
				}
				outs[c.Rank()] = input(dt, c.Rank(), 37, 61)
				return c.AllReduceStrategy(ctx, g, dist.Sum, s, outs[c.Rank()])
			}))
			res[s] = outs
		}
		ins := []*tensor.Tensor{input(dt, 3, 37*61), input(dt, 1, 37*61), input(dt, 2, 37*61)} // group order
		for i := range 37 * 61 {
			want := fold(ins, i, dist.Sum)
			for r := 1; r < 4; r++ {
				for s, outs := range res {
					if !sameBits(outs[r], i, want, 0) {
						t.Fatalf("%s %s rank %d element %d: %v, want %v", dt, s, r, i, outs[r].At(i), want.At(0))
					}
				}
			}
		}
	}
}

// TestHalfRoundsOnce shows that bf16 and f16 reduce in f32 and round once: rounding after
// every addition would lose both small terms.
func TestHalfRoundsOnce(t *testing.T) {
	ctx := context.Background()
	comms := newWorld(t, 3, Options{})
	for _, tc := range []struct {
		dt    tensor.DType
		round func(float32) uint16
		small float32 // half an ulp of 1
	}{
		{tensor.BF16, tensor.F32ToBF16, 1.0 / 256},
		{tensor.F16, tensor.F32ToF16, 1.0 / 2048},
	} {
		for _, s := range []string{dist.StrategyOneShot, dist.StrategyTwoShot} {
			outs := make([]*tensor.Tensor, 3)
			noErrors(t, run(t, comms, func(c *Comm) error {
				v := map[int]float32{0: 1, 1: tc.small, 2: tc.small}[c.Rank()]
				outs[c.Rank()] = &tensor.Tensor{DType: tc.dt, Shape: []int{1}, Half: []uint16{tc.round(v)}}
				return c.AllReduceStrategy(ctx, worldGroup(3, c.Rank()), dist.Sum, s, outs[c.Rank()])
			}))
			want := tc.round(1 + 2*tc.small)
			if want == tc.round(1) || tc.round(1+tc.small) != tc.round(1) {
				t.Fatal("test values do not tell the roundings apart")
			}
			for r, o := range outs {
				if o.Half[0] != want {
					t.Errorf("%s %s rank %d: %#04x (%v), want %#04x", tc.dt, s, r, o.Half[0], o.At(0), want)
				}
			}
		}
	}
}

func TestAllReduceSpecialValues(t *testing.T) {
	ctx := context.Background()
	comms := newWorld(t, 2, Options{})
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	a := []float32{nan, 1, inf, float32(math.Copysign(0, -1)), math.MaxFloat32, -inf}
	b := []float32{1, nan, -inf, 0, math.MaxFloat32, 3}
	for _, tc := range []struct {
		op   dist.ReduceOp
		want []float32
	}{
		{dist.Sum, []float32{nan, nan, nan, 0, inf, -inf}},
		{dist.Max, []float32{nan, nan, inf, 0, math.MaxFloat32, 3}},
	} {
		outs := []*tensor.Tensor{tensor.FromF32(append([]float32(nil), a...), 6), tensor.FromF32(append([]float32(nil), b...), 6)}
		noErrors(t, run(t, comms, func(c *Comm) error {
			return c.AllReduce(ctx, worldGroup(2, c.Rank()), tc.op, outs[c.Rank()])
		}))
		for r, o := range outs {
			for i, w := range tc.want {
				got := o.F32[i]
				if !(got == w && math.Signbit(float64(got)) == math.Signbit(float64(w)) || got != got && w != w) {
					t.Errorf("%s rank %d element %d: %v, want %v", tc.op, r, i, got, w)
				}
			}
		}
	}
}

// coords unravels a row-major index.
func coords(i int, shape []int) []int {
	c := make([]int, len(shape))
	for k := len(shape) - 1; k >= 0; k-- {
		c[k] = i % shape[k]
		i /= shape[k]
	}
	return c
}

func ravel(c, shape []int) int {
	i := 0
	for k := range shape {
		i = i*shape[k] + c[k]
	}
	return i
}

func TestAllGather(t *testing.T) {
	ctx := context.Background()
	shape := []int{2, 3, 4}
	for _, n := range []int{1, 2, 3} {
		comms := newWorld(t, n, Options{})
		for _, dt := range allDTypes {
			for _, axis := range []int{0, 1, 2, -1, -3} {
				t.Run(fmt.Sprintf("n=%d/%s/axis=%d", n, dt, axis), func(t *testing.T) {
					ins := make([]*tensor.Tensor, n)
					outs := make([]*tensor.Tensor, n)
					noErrors(t, run(t, comms, func(c *Comm) error {
						ins[c.Rank()] = input(dt, c.Rank(), shape...)
						var err error
						outs[c.Rank()], err = c.AllGather(ctx, worldGroup(n, c.Rank()), ins[c.Rank()], axis)
						return err
					}))
					ax := (axis + 3) % 3
					want := append([]int(nil), shape...)
					want[ax] *= n
					for r, o := range outs {
						if fmt.Sprint(o.Shape) != fmt.Sprint(want) || o.DType != dt {
							t.Fatalf("rank %d: %s%v, want %s%v", r, o.DType, o.Shape, dt, want)
						}
						for i := range o.Numel() {
							c := coords(i, want)
							src := c[ax] / shape[ax]
							c[ax] %= shape[ax]
							if !sameBits(o, i, ins[src], ravel(c, shape)) {
								t.Fatalf("rank %d element %v: %v, want rank %d's %v", r, coords(i, want), o.At(i), src, c)
							}
						}
					}
				})
			}
		}
	}
}

func TestReduceScatter(t *testing.T) {
	ctx := context.Background()
	for _, n := range []int{1, 2, 4} {
		comms := newWorld(t, n, Options{})
		for _, dt := range reducible {
			for _, op := range []dist.ReduceOp{dist.Sum, dist.Max} {
				for _, axis := range []int{0, 1, -1} {
					t.Run(fmt.Sprintf("n=%d/%s/%s/axis=%d", n, dt, op, axis), func(t *testing.T) {
						shape := []int{4, 8, 12}
						ins := make([]*tensor.Tensor, n)
						outs := make([]*tensor.Tensor, n)
						noErrors(t, run(t, comms, func(c *Comm) error {
							ins[c.Rank()] = input(dt, c.Rank(), shape...)
							var err error
							outs[c.Rank()], err = c.ReduceScatter(ctx, worldGroup(n, c.Rank()), op, ins[c.Rank()], axis)
							return err
						}))
						ax := (axis + 3) % 3
						piece := append([]int(nil), shape...)
						piece[ax] /= n
						for r, o := range outs {
							if fmt.Sprint(o.Shape) != fmt.Sprint(piece) {
								t.Fatalf("rank %d: shape %v, want %v", r, o.Shape, piece)
							}
							for i := range o.Numel() {
								c := coords(i, piece)
								c[ax] += r * piece[ax]
								want := fold(ins, ravel(c, shape), op)
								if !sameBits(o, i, want, 0) {
									t.Fatalf("rank %d element %v: %v, want %v", r, coords(i, piece), o.At(i), want.At(0))
								}
							}
						}
					})
				}
			}
		}
	}
}

func TestAllToAll(t *testing.T) {
	ctx := context.Background()
	shape := []int{4, 6, 8}
	for _, n := range []int{1, 2} {
		comms := newWorld(t, n, Options{})
		for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.I64, tensor.Bool} {
			for sa := range 3 {
				for ca := range 3 {
					t.Run(fmt.Sprintf("n=%d/%s/split=%d/concat=%d", n, dt, sa, ca), func(t *testing.T) {
						ins := make([]*tensor.Tensor, n)
						outs := make([]*tensor.Tensor, n)
						noErrors(t, run(t, comms, func(c *Comm) error {
							ins[c.Rank()] = input(dt, c.Rank(), shape...)
							var err error
							outs[c.Rank()], err = c.AllToAll(ctx, worldGroup(n, c.Rank()), ins[c.Rank()], sa-3, ca)
							return err
						}))
						piece := append([]int(nil), shape...)
						piece[sa] /= n
						want := append([]int(nil), piece...)
						want[ca] *= n
						for r, o := range outs {
							if fmt.Sprint(o.Shape) != fmt.Sprint(want) {
								t.Fatalf("rank %d: shape %v, want %v", r, o.Shape, want)
							}
							for i := range o.Numel() {
								c := coords(i, want)
								src := c[ca] / piece[ca]
								c[ca] %= piece[ca]
								c[sa] += r * piece[sa]
								if !sameBits(o, i, ins[src], ravel(c, shape)) {
									t.Fatalf("rank %d element %v: %v, want rank %d's %v", r, coords(i, want), o.At(i), src, c)
								}
							}
						}
					})
				}
			}
		}
	}
}

func TestBroadcastAndBarrier(t *testing.T) {
	ctx := context.Background()
	comms := newWorld(t, 3, Options{})
	for _, dt := range allDTypes {
		for root := range 3 {
			outs := make([]*tensor.Tensor, 3)
			noErrors(t, run(t, comms, func(c *Comm) error {
				outs[c.Rank()] = input(dt, c.Rank(), 5, 7)
				return c.Broadcast(ctx, worldGroup(3, c.Rank()), outs[c.Rank()], root)
			}))
			want := input(dt, root, 5, 7)
			for r, o := range outs {
				for i := range 35 {
					if !sameBits(o, i, want, i) {
						t.Fatalf("%s root %d: rank %d element %d differs", dt, root, r, i)
					}
				}
			}
		}
	}
	// A barrier holds every rank until the last arrives: rank 2 comes once ranks 0 and 1
	// wait in it.
	waitArrived := onArrival(t, comms)
	var mu sync.Mutex
	arrived := 0
	noErrors(t, run(t, comms, func(c *Comm) error {
		if c.Rank() == 2 && !waitArrived(0, 1) {
			return errors.New("ranks 0 and 1 did not reach the barrier")
		}
		mu.Lock()
		arrived++
		mu.Unlock()
		if err := c.Barrier(ctx, worldGroup(3, c.Rank())); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if arrived != 3 {
			return fmt.Errorf("left the barrier with %d of 3 ranks arrived", arrived)
		}
		return nil
	}))
}

func TestNewErrors(t *testing.T) {
	for _, tc := range []struct {
		n    int
		opts Options
		err  string
	}{
		{0, Options{}, "world size 0"},
		{2, Options{Timeout: -time.Second}, "negative timeout"},
		{2, Options{AllReduceStrategy: "nccl"}, `cannot run strategy "nccl"`},
		{2, Options{AllReduceStrategy: "ring"}, `unknown allreduce_strategy "ring"`},
	} {
		if _, err := New(tc.n, tc.opts); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("New(%d, %+v): %v, want %q", tc.n, tc.opts, err, tc.err)
		}
	}
	comms := newWorld(t, 3, Options{})
	if comms[2].Rank() != 2 || comms[2].Size() != 3 || comms[0].w.timeout != DefaultTimeout {
		t.Errorf("rank %d size %d timeout %v", comms[2].Rank(), comms[2].Size(), comms[0].w.timeout)
	}
}
