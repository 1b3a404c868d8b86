package local

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/tensor"
)

func mustMesh(t testing.TB, s string) dist.Mesh {
	t.Helper()
	m, err := dist.ParseMesh(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func mustGroup(m dist.Mesh, rank int, axis string) (dist.Group, error) {
	g, err := m.Group(rank, axis)
	if err != nil {
		return dist.Group{}, fmt.Errorf("rank %d: %w", rank, err)
	}
	return g, nil
}

// TestMesh2D: 4 ranks as tp=2,dp=2. Collectives over the tp group stay within one dp
// replica; the world group gives a different answer.
func TestMesh2D(t *testing.T) {
	ctx := context.Background()
	m := mustMesh(t, "tp=2,dp=2")
	comms := newWorld(t, m.Size(), Options{})
	// Rank r holds [r+1, 10(r+1)]: every sum below tells which ranks took part.
	x := func(r int) *tensor.Tensor { return tensor.FromI32([]int32{int32(r + 1), int32(10 * (r + 1))}, 2) }
	for _, tc := range []struct {
		axis string
		want [][]int32 // by rank
	}{
		{"tp", [][]int32{{3, 30}, {3, 30}, {7, 70}, {7, 70}}},                   // {0,1} and {2,3}
		{"dp", [][]int32{{4, 40}, {6, 60}, {4, 40}, {6, 60}}},                   // {0,2} and {1,3}
		{dist.WorldAxis, [][]int32{{10, 100}, {10, 100}, {10, 100}, {10, 100}}}, // everyone
	} {
		for _, strategy := range []string{dist.StrategyOneShot, dist.StrategyTwoShot} {
			outs := make([]*tensor.Tensor, 4)
			noErrors(t, run(t, comms, func(c *Comm) error {
				g, err := mustGroup(m, c.Rank(), tc.axis)
				if err != nil {
					return err
				}
				outs[c.Rank()] = x(c.Rank())
				return c.AllReduceStrategy(ctx, g, dist.Sum, strategy, outs[c.Rank()])
			}))
			for r, o := range outs {
				if !slices.Equal(o.I32, tc.want[r]) {
					t.Errorf("all_reduce over %s (%s): rank %d got %v, want %v", tc.axis, strategy, r, o.I32, tc.want[r])
				}
			}
		}
	}
	// A tp all_reduce differs from the world's on every rank: it did not mix replicas.
	// all_gather over tp gathers only the replica's two ranks, in tp order.
	gathered := make([]*tensor.Tensor, 4)
	noErrors(t, run(t, comms, func(c *Comm) error {
		g, err := mustGroup(m, c.Rank(), "tp")
		if err != nil {
			return err
		}
		gathered[c.Rank()], err = c.AllGather(ctx, g, x(c.Rank()), 0)
		return err
	}))
	for r, o := range gathered {
		base := int32(r/2*2 + 1)
		if want := []int32{base, 10 * base, base + 1, 10 * (base + 1)}; !slices.Equal(o.I32, want) {
			t.Errorf("all_gather over tp: rank %d got %v, want %v", r, o.I32, want)
		}
	}
	// Float data reduced over tp then dp, and over the world, is bit-identical on every
	// rank, whichever groups a rank belongs to.
	f := func(r int) *tensor.Tensor { return input(tensor.F32, r, 1000) }
	twoStep, world := make([]*tensor.Tensor, 4), make([]*tensor.Tensor, 4)
	noErrors(t, run(t, comms, func(c *Comm) error {
		tp, err := mustGroup(m, c.Rank(), "tp")
		if err != nil {
			return err
		}
		dp, _ := mustGroup(m, c.Rank(), "dp")
		w, _ := mustGroup(m, c.Rank(), dist.WorldAxis)
		twoStep[c.Rank()], world[c.Rank()] = f(c.Rank()), f(c.Rank())
		if err := c.AllReduce(ctx, tp, dist.Sum, twoStep[c.Rank()]); err != nil {
			return err
		}
		if err := c.AllReduce(ctx, dp, dist.Sum, twoStep[c.Rank()]); err != nil {
			return err
		}
		return c.AllReduce(ctx, w, dist.Sum, world[c.Rank()])
	}))
	for r := 1; r < 4; r++ {
		if !slices.Equal(twoStep[r].F32, twoStep[0].F32) || !slices.Equal(world[r].F32, world[0].F32) {
			t.Fatalf("rank %d's result differs from rank 0's", r)
		}
	}
}

// TestDisjointGroupsConcurrent: the tp group of dp replica 1 completes while replica 0's tp
// group waits, so disjoint groups do not block each other.
func TestDisjointGroupsConcurrent(t *testing.T) {
	ctx := context.Background()
	m := mustMesh(t, "tp=2,dp=2")
	comms := newWorld(t, 4, Options{Timeout: 30 * time.Second})
	replica1Done := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var order []int
	noErrors(t, run(t, comms, func(c *Comm) error {
		g, err := mustGroup(m, c.Rank(), "tp")
		if err != nil {
			return err
		}
		if c.Rank() == 0 {
			<-replica1Done // rank 0 arrives only after replica 1 has finished
		}
		if err := c.AllReduce(ctx, g, dist.Sum, input(tensor.F32, c.Rank(), 4096)); err != nil {
			return err
		}
		mu.Lock()
		order = append(order, c.Rank())
		if len(order) == 2 && order[0] >= 2 && order[1] >= 2 {
			once.Do(func() { close(replica1Done) })
		}
		mu.Unlock()
		return nil
	}))
	if len(order) != 4 || order[0] < 2 || order[1] < 2 {
		t.Errorf("completion order %v, want replica 1 (ranks 2, 3) first", order)
	}
}

// TestConcurrentGroupsOneRank: each rank runs tp and dp collectives from two goroutines at
// once, many steps each, with random strategies and sizes; integer sums check every step.
func TestConcurrentGroupsOneRank(t *testing.T) {
	ctx := context.Background()
	m := mustMesh(t, "tp=2,dp=2")
	comms := newWorld(t, 4, Options{})
	const steps = 60
	noErrors(t, run(t, comms, func(c *Comm) error {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for k, axis := range []string{"tp", "dp"} {
			wg.Go(func() {
				g, err := mustGroup(m, c.Rank(), axis)
				if err != nil {
					errs[k] = err
					return
				}
				rng := rand.New(rand.NewPCG(uint64(k), 7)) // the same sequence on every rank
				for step := range steps {
					size := 1 + rng.IntN(20000)
					strategy := []string{"oneshot", "twoshot", "auto"}[rng.IntN(3)]
					x := tensor.New(tensor.I32, size)
					for i := range x.I32 {
						x.I32[i] = int32(c.Rank()*1000 + step + i)
					}
					if err := c.AllReduceStrategy(ctx, g, dist.Sum, strategy, x); err != nil {
						errs[k] = err
						return
					}
					var want int32
					for _, r := range g.Ranks {
						want += int32(r*1000 + step)
					}
					for i, v := range x.I32 {
						if v != want+int32(len(g.Ranks)*i) {
							errs[k] = fmt.Errorf("%s step %d element %d: %d, want %d", axis, step, i, v, want+int32(len(g.Ranks)*i))
							return
						}
					}
					if rng.IntN(4) == 0 {
						if _, err := c.AllGather(ctx, g, x, 0); err != nil {
							errs[k] = err
							return
						}
					}
				}
			})
		}
		wg.Wait()
		return firstErr(errs...)
	}))
	for _, c := range comms {
		for _, gs := range c.w.groups {
			if len(gs.ops) != 0 {
				t.Errorf("group %v keeps %d finished steps", gs.ranks, len(gs.ops))
			}
		}
	}
}
