package memplan

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestLifetimes(t *testing.T) {
	// Values: 0, 1 inputs; 2 = f(0); 3 = view of 2; 4 = g(3, 1); 5 never touched; 6 = h(4)
	// is an output.
	steps := []Step{
		{In: []int{0}, Out: []int{2}},
		{In: []int{3, 1}, Out: []int{4}},
		{In: []int{4}, Out: []int{6}},
	}
	root := []int{0, 1, 2, 2, 4, 5, 6}
	live := Lifetimes(7, root, []int{0, 1}, steps, []int{6})
	want := map[int]Interval{0: {Before, 0}, 1: {Before, 1}, 2: {0, 1}, 4: {1, 2}, 6: {2, 3}}
	for v, w := range want {
		if live[v] != w {
			t.Errorf("value %d lives %v, want %v", v, live[v], w)
		}
	}
	if live[5].Used() || live[3].Used() {
		t.Errorf("value 5 (untouched) %v or 3 (a view: its root holds the range) %v counts as used", live[5], live[3])
	}
	// Without roots every value has its own range, and without inputs and outputs only the
	// steps count.
	live = Lifetimes(7, nil, nil, steps, nil)
	if live[3] != (Interval{1, 1}) || live[2] != (Interval{0, 0}) || live[6] != (Interval{2, 2}) || live[1] != (Interval{1, 1}) {
		t.Errorf("plain lifetimes %v", live)
	}
}

func TestIntervalOverlaps(t *testing.T) {
	for _, c := range []struct {
		a, b Interval
		want bool
	}{
		{Interval{0, 2}, Interval{2, 3}, true},
		{Interval{0, 1}, Interval{2, 3}, false},
		{Interval{Before, Before}, Interval{Before, 0}, true},
		{Interval{1, 1}, Interval{0, 5}, true},
	} {
		if c.a.Overlaps(c.b) != c.want || c.b.Overlaps(c.a) != c.want {
			t.Errorf("%v overlaps %v: want %v", c.a, c.b, c.want)
		}
	}
}

// Place keeps buffers alive at the same time apart, aligns them, reuses memory across
// disjoint lifetimes and gives one layout for one input.
func TestPlace(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 7))
	for trial := range 200 {
		n := 1 + rng.IntN(40)
		bufs := make([]Buffer, n)
		for i := range bufs {
			first := rng.IntN(30) - 1
			bufs[i] = Buffer{Size: int64(rng.IntN(5000)), Live: Interval{first, first + rng.IntN(6)}}
		}
		const align = 256
		offs, size := Place(bufs, align)
		total := int64(0)
		for i, a := range bufs {
			ra := (a.Size + align - 1) / align * align
			total += ra
			if offs[i]%align != 0 || offs[i] < 0 || offs[i]+ra > size {
				t.Fatalf("trial %d: buffer %d at %d (size %d) misaligned or outside the arena of %d", trial, i, offs[i], a.Size, size)
			}
			for j, b := range bufs[:i] {
				rb := (b.Size + align - 1) / align * align
				if a.Live.Overlaps(b.Live) && offs[i] < offs[j]+rb && offs[j] < offs[i]+ra {
					t.Fatalf("trial %d: buffers %d %v and %d %v overlap while both alive", trial, i, a, j, b)
				}
			}
		}
		if size > total {
			t.Fatalf("trial %d: arena %d is larger than all buffers together (%d)", trial, size, total)
		}
		again, size2 := Place(slices.Clone(bufs), align)
		if !slices.Equal(offs, again) || size != size2 {
			t.Fatalf("trial %d: two layouts of the same buffers", trial)
		}
	}
}

func TestPlaceLayout(t *testing.T) {
	// Largest first at 0; b, alive with a, above it; c, alive only after a ends, reuses 0;
	// d, of a's size and alive with nobody, also at 0.
	bufs := []Buffer{
		{Size: 100, Live: Interval{0, 1}},  // b
		{Size: 1000, Live: Interval{0, 2}}, // a
		{Size: 300, Live: Interval{3, 4}},  // c
		{Size: 1000, Live: Interval{5, 5}}, // d
	}
	offs, size := Place(bufs, 256)
	if want := []int64{1024, 0, 0, 0}; !slices.Equal(offs, want) || size != 1280 {
		t.Errorf("offsets %v size %d, want %v 1280", offs, size, want)
	}
	if offs, size := Place(nil, 256); len(offs) != 0 || size != 0 {
		t.Errorf("no buffers: %v %d", offs, size)
	}
}
