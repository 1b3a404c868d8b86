package nccl

import (
	"errors"
	"strings"
	"testing"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/tensor"
)

// fakeWorld is a World without NCCL behind it: its communicators have no handle, which is
// enough for every check made before a call reaches NCCL.
func fakeWorld(t *testing.T, mesh string, rank int) *World {
	t.Helper()
	m, err := dist.ParseMesh(mesh)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(rank, m, Options{}, nil)
	w.setWorld(0)
	for _, a := range m.Axes() {
		g, err := m.Group(rank, a.Name)
		if err != nil {
			t.Fatal(err)
		}
		w.axes[a.Name] = &Comm{w: w, group: g}
	}
	w.comms = nil // nothing to abort
	return w
}

func TestNCCLTypes(t *testing.T) {
	for _, tc := range []struct {
		dt     tensor.DType
		reduce bool
		want   cubind.NCCLDataType
		err    string
	}{
		{tensor.F32, true, cubind.NCCLFloat32, ""},
		{tensor.BF16, true, cubind.NCCLBfloat16, ""},
		{tensor.F16, true, cubind.NCCLFloat16, ""},
		{tensor.I32, true, cubind.NCCLInt32, ""},
		{tensor.I64, true, cubind.NCCLInt64, ""},
		{tensor.Bool, false, cubind.NCCLUint8, ""},
		{tensor.Bool, true, 0, "bool does not reduce"},
		{tensor.Invalid, false, 0, "not supported"},
	} {
		got, err := ncclType(tc.dt, tc.reduce)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ncclType(%s, reduce=%v) = %v, %v; want an error with %q", tc.dt, tc.reduce, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want || got.Size() != tc.dt.Size() {
			t.Errorf("ncclType(%s, reduce=%v) = %v, %v; want %v of the same size", tc.dt, tc.reduce, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		op   dist.ReduceOp
		want cubind.NCCLRedOp
		ok   bool
	}{{dist.Sum, cubind.NCCLSum, true}, {dist.Max, cubind.NCCLMax, true}, {0, 0, false}} {
		got, err := ncclOp(tc.op)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ncclOp(%v) = %v, %v", tc.op, got, err)
		}
	}
}

// Invalid calls fail before NCCL with a *dist.Error naming the collective, group and rank.
func TestCollectiveArgumentErrors(t *testing.T) {
	w := fakeWorld(t, "tp=2,dp=2", 3)
	c, err := w.Axis("tp")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, collective, want string
		call                   func() error
	}{
		{"bool all_reduce", "all_reduce", "bool does not reduce", func() error { return c.AllReduce(1, 1, 4, tensor.Bool, dist.Sum, 0) }},
		{"no op", "all_reduce", "reduce op reduceop(0)", func() error { return c.AllReduce(1, 1, 4, tensor.F32, 0, 0) }},
		{"negative count", "all_gather", "negative count -1", func() error { return c.AllGather(1, 1, -1, tensor.F32, 0) }},
		{"bool reduce_scatter", "reduce_scatter", "bool does not reduce", func() error { return c.ReduceScatter(1, 1, 4, tensor.Bool, dist.Max, 0) }},
		{"invalid dtype", "all_to_all", "not supported", func() error { return c.AllToAll(1, 1, 4, tensor.Invalid, 0) }},
		{"root out of range", "broadcast", "root 2 out of range for a group of 2", func() error { return c.Broadcast(1, 4, tensor.BF16, 2, 0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var de *dist.Error
			if !errors.As(err, &de) || de.Collective != tc.collective || de.Rank != 3 || de.Group.String() != "tp[2 3]" ||
				!strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v; want a *dist.Error for %s over tp[2 3] on rank 3 saying %q", err, tc.collective, tc.want)
			}
		})
	}
	// Empty calls need no NCCL.
	for name, call := range map[string]func() error{
		"all_reduce":     func() error { return c.AllReduce(1, 1, 0, tensor.F32, dist.Sum, 0) },
		"all_gather":     func() error { return c.AllGather(1, 1, 0, tensor.BF16, 0) },
		"reduce_scatter": func() error { return c.ReduceScatter(1, 1, 0, tensor.I64, dist.Sum, 0) },
		"all_to_all":     func() error { return c.AllToAll(1, 1, 0, tensor.Bool, 0) },
		"broadcast":      func() error { return c.Broadcast(1, 0, tensor.I32, 1, 0) },
	} {
		if err := call(); err != nil {
			t.Errorf("empty %s: %v", name, err)
		}
	}
}

func TestWorldGroupLookup(t *testing.T) {
	w := fakeWorld(t, "tp=2,dp=2", 1)
	m := w.Mesh()
	for _, axis := range []string{"tp", "dp", dist.WorldAxis} {
		g, err := m.Group(1, axis)
		if err != nil {
			t.Fatal(err)
		}
		c, err := w.Group(g)
		if err != nil || c.Group().String() != g.String() || c.Size() != g.Size() {
			t.Errorf("Group(%s) = %v, %v", g, c, err)
		}
	}
	for _, tc := range []struct {
		g    dist.Group
		want string
	}{
		{dist.Group{Axis: "ep", Ranks: []int{0, 1}, Index: 1}, `mesh "tp=2,dp=2" has no axis "ep"`},
		{dist.Group{Axis: "tp", Ranks: []int{2, 3}, Index: 0}, "group tp[2 3] is not this rank's group along tp in mesh \"tp=2,dp=2\", which is tp[0 1]"},
		{dist.Group{Axis: "dp", Ranks: []int{1, 3}, Index: 1}, "is not this rank's group"},
	} {
		if _, err := w.Group(tc.g); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "rank 1") {
			t.Errorf("Group(%s): got %v, want an error naming rank 1 and saying %q", tc.g, err, tc.want)
		}
	}
	if _, err := w.Axis("pp"); err == nil || !strings.Contains(err.Error(), `no axis "pp"`) {
		t.Errorf("Axis(pp): got %v", err)
	}
}

// After an abort every call fails with dist.ErrBroken, wrapping the first cause, and a
// peer's failure breaks the world at the next call.
func TestBrokenWorld(t *testing.T) {
	w := fakeWorld(t, "tp=2", 0)
	c, _ := w.Axis("tp")
	cause := errors.New("boom")
	if got := w.Abort(cause); got != cause {
		t.Fatalf("Abort returned %v", got)
	}
	if got := w.Abort(errors.New("second")); got != cause {
		t.Errorf("second Abort returned %v, want the first cause", got)
	}
	err := c.AllReduce(1, 1, 8, tensor.F32, dist.Sum, 0)
	if !errors.Is(err, dist.ErrBroken) || !errors.Is(err, cause) {
		t.Errorf("got %v, want dist.ErrBroken wrapping boom", err)
	}

	b := &board{}
	w = fakeWorld(t, "tp=2", 0)
	w.peers = &boardView{b: b, rank: 0}
	c, _ = w.Axis("tp")
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	(&boardView{b: b, rank: 1}).Abort("out of memory")
	err = c.Broadcast(1, 8, tensor.F32, 0, 0)
	var de *dist.Error
	if !errors.As(err, &de) || !errors.Is(err, dist.ErrPeerFailed) || !slices1(de.Peers) || !strings.Contains(err.Error(), "rank 1 aborted: out of memory") {
		t.Errorf("got %v; want a broadcast error naming rank 1 as the failed peer", err)
	}
	if _, ok := w.peers.(*boardView); !ok || b.failures[len(b.failures)-1].Rank != 0 {
		t.Errorf("rank 0 did not tell the board it aborted: %v", b.failures)
	}
}

func slices1(peers []int) bool { return len(peers) == 1 && peers[0] == 1 }
