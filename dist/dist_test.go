package dist

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

func TestParseMesh(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // String() of the mesh; "" when an error is expected
		size int
		err  string
	}{
		{in: "tp=4", want: "tp=4", size: 4},
		{in: "tp=2,dp=2", want: "tp=2,dp=2", size: 4},
		{in: " tp = 2 , dp=3,ep=1 ", want: "tp=2,dp=3,ep=1", size: 6},
		{in: "tp=1", want: "tp=1", size: 1},
		{in: "x_1=2", want: "x_1=2", size: 2},
		{in: "", err: "empty mesh"},
		{in: "tp", err: `"tp" is not name=size`},
		{in: "tp=two", err: `size of axis "tp"`},
		{in: "tp=0", err: "axis tp has size 0"},
		{in: "tp=-2", err: "axis tp has size -2"},
		{in: "tp=2,tp=2", err: `axis "tp" appears twice`},
		{in: "1tp=2", err: `"1tp" is not a valid axis name`},
		{in: "=2", err: `"" is not a valid axis name`},
		{in: "world=2", err: `"world" is not a valid axis name`},
		{in: "tp=2,", err: `"" is not name=size`},
		{in: "a=1024,b=1024,c=2", err: "more than 1048576 ranks"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			m, err := ParseMesh(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseMesh(%q) error %v, want one containing %q", tc.in, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.String() != tc.want || m.Size() != tc.size {
				t.Errorf("ParseMesh(%q) = %q of %d ranks, want %q of %d", tc.in, m, m.Size(), tc.want, tc.size)
			}
			back, err := ParseMesh(m.String())
			if err != nil || back.String() != m.String() {
				t.Errorf("round trip: %q, %v", back, err)
			}
		})
	}
}

func mustMesh(t *testing.T, s string) Mesh {
	t.Helper()
	m, err := ParseMesh(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestMeshLayout checks the documented rank layout: the first axis is innermost, so tp
// peers are adjacent ranks.
func TestMeshLayout(t *testing.T) {
	m := mustMesh(t, "tp=2,dp=2")
	for _, tc := range []struct {
		rank   int
		coords []int
		tp, dp []int
		tpIdx  int
		dpIdx  int
	}{
		{0, []int{0, 0}, []int{0, 1}, []int{0, 2}, 0, 0},
		{1, []int{1, 0}, []int{0, 1}, []int{1, 3}, 1, 0},
		{2, []int{0, 1}, []int{2, 3}, []int{0, 2}, 0, 1},
		{3, []int{1, 1}, []int{2, 3}, []int{1, 3}, 1, 1},
	} {
		c, err := m.Coords(tc.rank)
		if err != nil || !slices.Equal(c, tc.coords) {
			t.Errorf("Coords(%d) = %v, %v; want %v", tc.rank, c, err, tc.coords)
		}
		if r, err := m.Rank(c); err != nil || r != tc.rank {
			t.Errorf("Rank(%v) = %d, %v; want %d", c, r, err, tc.rank)
		}
		for _, ax := range []struct {
			name  string
			ranks []int
			idx   int
		}{{"tp", tc.tp, tc.tpIdx}, {"dp", tc.dp, tc.dpIdx}, {WorldAxis, []int{0, 1, 2, 3}, tc.rank}} {
			g, err := m.Group(tc.rank, ax.name)
			if err != nil {
				t.Fatal(err)
			}
			if g.Axis != ax.name || !slices.Equal(g.Ranks, ax.ranks) || g.Index != ax.idx || g.Rank() != tc.rank {
				t.Errorf("Group(%d, %s) = %+v, want ranks %v index %d", tc.rank, ax.name, g, ax.ranks, ax.idx)
			}
			if err := g.Validate(tc.rank, m.Size()); err != nil {
				t.Errorf("Group(%d, %s): %v", tc.rank, ax.name, err)
			}
		}
	}
	if s := fmt.Sprint(mustGroup(t, m, 3, "dp")); s != "dp[1 3]" {
		t.Errorf("group prints %q", s)
	}
}

func mustGroup(t *testing.T, m Mesh, rank int, axis string) Group {
	t.Helper()
	g, err := m.Group(rank, axis)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestMeshGroups3D checks on a 3-axis mesh that the groups along each axis partition the
// ranks, and that every group member sees the same group.
func TestMeshGroups3D(t *testing.T) {
	m := mustMesh(t, "tp=2,ep=3,dp=2")
	if sz, _ := m.AxisSize("ep"); sz != 3 || m.Size() != 12 {
		t.Fatalf("sizes: ep %d world %d", sz, m.Size())
	}
	for _, ax := range m.Axes() {
		seen := map[int]bool{}
		for r := range m.Size() {
			g := mustGroup(t, m, r, ax.Name)
			if g.Size() != ax.Size {
				t.Errorf("%s group of %d has %d ranks", ax.Name, r, g.Size())
			}
			for i, peer := range g.Ranks {
				pg := mustGroup(t, m, peer, ax.Name)
				if !slices.Equal(pg.Ranks, g.Ranks) || pg.Index != i {
					t.Errorf("rank %d sees %s group %v, its peer %d sees %v at %d", r, ax.Name, g.Ranks, peer, pg.Ranks, pg.Index)
				}
				rc, _ := m.Coords(r)
				pc, _ := m.Coords(peer)
				for k, a := range m.Axes() {
					if a.Name != ax.Name && rc[k] != pc[k] {
						t.Errorf("ranks %d and %d share a %s group but differ on %s", r, peer, ax.Name, a.Name)
					}
				}
			}
			if g.Index == 0 {
				for _, p := range g.Ranks {
					if seen[p] {
						t.Errorf("rank %d in two %s groups", p, ax.Name)
					}
					seen[p] = true
				}
			}
		}
		if len(seen) != m.Size() {
			t.Errorf("%s groups cover %d of %d ranks", ax.Name, len(seen), m.Size())
		}
	}
}

func TestMeshErrors(t *testing.T) {
	m := mustMesh(t, "tp=2,dp=2")
	check := func(name string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", name, err, want)
		}
	}
	_, err := m.Coords(4)
	check("Coords(4)", err, "rank 4 out of range for mesh \"tp=2,dp=2\" of 4 ranks")
	_, err = m.Coords(-1)
	check("Coords(-1)", err, "rank -1 out of range")
	_, err = m.Rank([]int{0})
	check("Rank short", err, "1 coordinates for mesh")
	_, err = m.Rank([]int{2, 0})
	check("Rank big", err, "coordinate 2 out of range for axis tp=2")
	_, err = m.Group(0, "pp")
	check("Group pp", err, `has no axis "pp"`)
	_, err = m.Group(9, "tp")
	check("Group 9", err, "rank 9 out of range")
	_, err = m.AxisSize("pp")
	check("AxisSize pp", err, `has no axis "pp"`)
	_, err = NewMesh()
	check("NewMesh()", err, "at least one axis")
	var zero Mesh
	if zero.Size() != 1 || zero.String() != "" {
		t.Errorf("zero mesh: size %d, %q", zero.Size(), zero)
	}
}

func TestGroupValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		g    Group
		rank int
		err  string
	}{
		{"ok", Group{Axis: "tp", Ranks: []int{2, 3}, Index: 1}, 3, ""},
		{"no axis", Group{Ranks: []int{0}}, 0, "has no axis name"},
		{"empty", Group{Axis: "tp"}, 0, "has no ranks"},
		{"out of world", Group{Axis: "tp", Ranks: []int{0, 4}}, 0, "rank 4 out of range for a world of 4"},
		{"negative", Group{Axis: "tp", Ranks: []int{-1, 0}, Index: 1}, 0, "rank -1 out of range"},
		{"twice", Group{Axis: "tp", Ranks: []int{1, 1}}, 1, "lists rank 1 twice"},
		{"bad index", Group{Axis: "tp", Ranks: []int{0, 1}, Index: 2}, 0, "index 2 out of range"},
		{"not me", Group{Axis: "tp", Ranks: []int{0, 1}, Index: 0}, 1, "index 0 is rank 0, not the caller's rank 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.g.Validate(tc.rank, 4)
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("error %v, want %q", err, tc.err)
			}
		})
	}
	g, err := NewGroup("ep", []int{5, 1, 3}, 3)
	if err != nil || g.Index != 2 || g.Rank() != 3 {
		t.Errorf("NewGroup = %+v, %v", g, err)
	}
	if _, err := NewGroup("ep", []int{5, 1}, 3); err == nil {
		t.Error("NewGroup without the caller: no error")
	}
	if _, err := NewGroup("ep", []int{3, 3}, 3); err == nil {
		t.Error("NewGroup with a repeated rank: no error")
	}
	if (Group{Axis: "x", Ranks: []int{1}, Index: 4}).Rank() != -1 {
		t.Error("Rank of a bad index is not -1")
	}
}

func TestReduceOp(t *testing.T) {
	for _, op := range []ReduceOp{Sum, Max} {
		back, err := ParseReduceOp(op.String())
		if err != nil || back != op {
			t.Errorf("ParseReduceOp(%q) = %v, %v", op, back, err)
		}
	}
	if _, err := ParseReduceOp("mean"); err == nil {
		t.Error("ParseReduceOp(mean): no error")
	}
	if s := ReduceOp(0).String(); s != "reduceop(0)" {
		t.Errorf("zero op prints %q", s)
	}
	for dt, want := range map[tensor.DType]bool{tensor.F32: true, tensor.BF16: true, tensor.F16: true, tensor.I32: true, tensor.I64: false, tensor.Bool: false} {
		if Reducible(dt) != want {
			t.Errorf("Reducible(%s) = %v", dt, !want)
		}
	}
}

func TestStrategy(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{"", StrategyAuto, ""},
		{"auto", StrategyAuto, ""},
		{"nccl", StrategyNCCL, ""},
		{"oneshot", StrategyOneShot, ""},
		{"twoshot", StrategyTwoShot, ""},
		{"ring", "", `unknown allreduce_strategy "ring"`},
	} {
		got, err := ParseStrategy(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseStrategy(%q) error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseStrategy(%q) = %q, %v", tc.in, got, err)
		}
	}
	c := Crossover{TwoShotFrom: map[int]int{2: 1000}, Scale: 1600}
	for _, tc := range []struct {
		bytes, n int
		in, want string
	}{
		{999, 2, "auto", StrategyOneShot},
		{1000, 2, "auto", StrategyTwoShot},
		{1000, 2, "", StrategyTwoShot},
		{99, 4, "auto", StrategyOneShot},
		{100, 4, "auto", StrategyTwoShot},
		{1 << 30, 1, "auto", StrategyOneShot},
		{0, 4, "auto", StrategyOneShot},
		{10, 4, "twoshot", StrategyTwoShot},
		{1 << 30, 4, "oneshot", StrategyOneShot},
		{1 << 30, 4, "nccl", StrategyNCCL},
	} {
		if got := c.Strategy(tc.bytes, tc.n, tc.in); got != tc.want {
			t.Errorf("Strategy(%d, %d, %q) = %q, want %q", tc.bytes, tc.n, tc.in, got, tc.want)
		}
	}
	for _, tc := range []struct{ bytes, n int }{{16 << 10, 2}, {4 << 10, 4}, {1 << 10, 8}, {7281, 3}} {
		if StrategyFor(tc.bytes-1, tc.n, "auto") != StrategyOneShot || StrategyFor(tc.bytes, tc.n, "auto") != StrategyTwoShot {
			t.Errorf("local crossover for %d ranks is not at %d bytes", tc.n, tc.bytes)
		}
	}
	// StrategyFor follows LocalCrossover around each crossover it lists.
	for n, from := range LocalCrossover.TwoShotFrom {
		if got := StrategyFor(from-1, n, StrategyAuto); got != StrategyOneShot {
			t.Errorf("StrategyFor(%d, %d) = %s", from-1, n, got)
		}
		if got := StrategyFor(from, n, StrategyAuto); got != StrategyTwoShot {
			t.Errorf("StrategyFor(%d, %d) = %s", from, n, got)
		}
	}
}

func TestResolveBackend(t *testing.T) {
	for _, tc := range []struct {
		name, device, want, err string
	}{
		{"", "cpu", BackendLocal, ""},
		{"auto", "cpu", BackendLocal, ""},
		{"auto", "cuda", BackendNCCL, ""},
		{"local", "cpu", BackendLocal, ""},
		{"local", "cuda", BackendLocal, ""},
		{"nccl", "cuda", BackendNCCL, ""},
		{"nccl", "cpu", "", `dist_backend "nccl" needs a cuda device`},
		{"mpi", "cpu", "", `unknown dist_backend "mpi"`},
		{"auto", "tpu", "", `unknown device "tpu"`},
	} {
		got, err := ResolveBackend(tc.name, tc.device)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ResolveBackend(%q, %q) error %v, want %q", tc.name, tc.device, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ResolveBackend(%q, %q) = %q, %v; want %q", tc.name, tc.device, got, err, tc.want)
		}
	}
}

// plainComm is a Communicator without per-call strategies; it records AllReduce calls.
type plainComm struct {
	Communicator
	calls int
}

func (c *plainComm) AllReduce(ctx context.Context, g Group, op ReduceOp, t *tensor.Tensor) error {
	c.calls++
	return nil
}

type strategyComm struct {
	plainComm
	got string
}

func (c *strategyComm) AllReduceStrategy(ctx context.Context, g Group, op ReduceOp, strategy string, t *tensor.Tensor) error {
	c.got = strategy
	return nil
}

func TestAllReduceWith(t *testing.T) {
	ctx, g, x := context.Background(), Group{Axis: "tp", Ranks: []int{0}}, tensor.New(tensor.F32, 2)
	p := &plainComm{}
	if err := AllReduceWith(ctx, p, g, Sum, "auto", x); err != nil || p.calls != 1 {
		t.Errorf("auto on a plain communicator: %v, %d calls", err, p.calls)
	}
	if err := AllReduceWith(ctx, p, g, Sum, "oneshot", x); err == nil || !strings.Contains(err.Error(), "chooses its own algorithm") {
		t.Errorf("oneshot on a plain communicator: %v", err)
	}
	if err := AllReduceWith(ctx, p, g, Sum, "ring", x); err == nil || !strings.Contains(err.Error(), "unknown allreduce_strategy") {
		t.Errorf("ring: %v", err)
	}
	s := &strategyComm{}
	if err := AllReduceWith(ctx, s, g, Sum, "twoshot", x); err != nil || s.got != "twoshot" {
		t.Errorf("twoshot: %v, got %q", err, s.got)
	}
}

func TestErrorFormat(t *testing.T) {
	e := &Error{Collective: "all_reduce", Group: Group{Axis: "tp", Ranks: []int{2, 3}, Index: 0}, Rank: 2, Step: 7, Peers: []int{3},
		Err: fmt.Errorf("rank 3 did not arrive within 1s: %w", ErrTimeout)}
	want := "dist: all_reduce over group tp[2 3] (rank 2, call 7 on the group): rank 3 did not arrive within 1s: timed out"
	if e.Error() != want {
		t.Errorf("got  %s\nwant %s", e, want)
	}
	if !errors.Is(e, ErrTimeout) {
		t.Error("errors.Is(ErrTimeout) is false")
	}
}
