package dist_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/dist/local"
	"github.com/loom-ml/loom/tensor"
)

func TestBindErrors(t *testing.T) {
	m, err := dist.ParseMesh("tp=2,dp=2")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		c    dist.Collective
		rank int
		err  string
	}{
		{"op", dist.Collective{Op: "all_sum", Group: "tp", GroupSize: 2}, 0, `bind "all_sum": not a collective op`},
		{"axis", dist.Collective{Op: "all_reduce", Group: "pp", GroupSize: 2}, 0, `has no axis "pp"`},
		{"size", dist.Collective{Op: "all_gather", Group: "tp", GroupSize: 4}, 0, `built for group_size 4, mesh "tp=2,dp=2" has tp=2`},
		{"rank", dist.Collective{Op: "all_to_all", Group: "dp", GroupSize: 2}, 4, "rank 4 out of range"},
		{"reduce", dist.Collective{Op: "reduce_scatter", Group: "tp", GroupSize: 2, Reduce: "mean"}, 0, `unknown reduce op "mean"`},
		{"strategy", dist.Collective{Op: "all_reduce", Group: "tp", GroupSize: 2, Strategy: "ring"}, 0, `unknown allreduce_strategy "ring"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.c.Bind(m, tc.rank); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Bind: %v, want %q", err, tc.err)
			}
		})
	}
	b, err := dist.Collective{Op: "all_reduce", Group: "world", GroupSize: 4}.Bind(m, 1)
	if err != nil {
		t.Fatal(err)
	}
	comms, err := local.New(4, local.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Run(context.Background(), comms[2], tensor.New(tensor.F32, 2)); err == nil || !strings.Contains(err.Error(), "bound for rank 1 of 4 runs on a communicator of rank 2 of 4") {
		t.Errorf("Run on another rank: %v", err)
	}
}

// TestBindRun binds one collective of each kind on a tp=2,dp=2 mesh and runs it on the
// local backend: the groups come from the mesh, never the world.
func TestBindRun(t *testing.T) {
	m, err := dist.ParseMesh("tp=2,dp=2")
	if err != nil {
		t.Fatal(err)
	}
	comms, err := local.New(m.Size(), local.Options{})
	if err != nil {
		t.Fatal(err)
	}
	x := func(r int) *tensor.Tensor { return tensor.FromI32([]int32{int32(10*r + 1), int32(10*r + 2)}, 1, 2) }
	for _, tc := range []struct {
		c    dist.Collective
		want [][]int32 // by rank
	}{
		{dist.Collective{Op: "all_reduce", Group: "tp", GroupSize: 2}, [][]int32{{12, 14}, {12, 14}, {52, 54}, {52, 54}}},
		{dist.Collective{Op: "all_reduce", Group: "dp", GroupSize: 2, Reduce: "max", Strategy: "twoshot"}, [][]int32{{21, 22}, {31, 32}, {21, 22}, {31, 32}}},
		{dist.Collective{Op: "all_gather", Group: "dp", GroupSize: 2, Axis: 0}, [][]int32{{1, 2, 21, 22}, {11, 12, 31, 32}, {1, 2, 21, 22}, {11, 12, 31, 32}}},
		{dist.Collective{Op: "reduce_scatter", Group: "tp", GroupSize: 2, Axis: 1}, [][]int32{{12}, {14}, {52}, {54}}},
		{dist.Collective{Op: "all_to_all", Group: "tp", GroupSize: 2, SplitAxis: 1, ConcatAxis: 0}, [][]int32{{1, 11}, {2, 12}, {21, 31}, {22, 32}}},
	} {
		t.Run(tc.c.Op+"/"+tc.c.Group, func(t *testing.T) {
			outs := make([]*tensor.Tensor, len(comms))
			errs := make([]error, len(comms))
			var wg sync.WaitGroup
			for r, c := range comms {
				wg.Go(func() {
					b, err := tc.c.Bind(m, r)
					if err != nil {
						errs[r] = err
						return
					}
					outs[r], errs[r] = b.Run(context.Background(), c, x(r))
				})
			}
			wg.Wait()
			for r := range comms {
				if errs[r] != nil {
					t.Fatalf("rank %d: %v", r, errs[r])
				}
				if !slices.Equal(outs[r].I32, tc.want[r]) {
					t.Errorf("rank %d: %v, want %v", r, outs[r].I32, tc.want[r])
				}
			}
		})
	}
}
