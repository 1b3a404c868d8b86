// Package memplan plans the memory of a straight-line program of steps: how long each
// value lives (Lifetimes) and, for a backend that lays its intermediates out in one arena,
// where each buffer goes (Place). It knows nothing of devices or tensors: values are
// numbers, steps are the values they read and write, buffers are sizes in bytes. The CUDA
// executor lays its arena out with it per binding of the symbolic dimensions; the CPU
// executor frees each intermediate after its last use by it.
package memplan

import (
	"math"
	"sort"
)

// Step is one step of a program: the values it reads and the values it writes.
type Step struct {
	In, Out []int
}

// Interval is the live range of a value in step indices, both ends included: from the first
// step that reads or writes it to the last. Graph inputs count as written at step -1
// (Before), graph outputs as read at step len(steps). A value no step touches has First >
// Last (see Used).
type Interval struct {
	First, Last int
}

// Before is the step at which a program's inputs are written: before its first step.
const Before = -1

// unused is the interval of a value nothing touches.
var unused = Interval{First: math.MaxInt, Last: math.MinInt}

// Used reports whether some step (or the program's inputs or outputs) touches the value.
func (iv Interval) Used() bool { return iv.First <= iv.Last }

// Overlaps reports whether two live ranges share a step.
func (iv Interval) Overlaps(o Interval) bool { return iv.First <= o.Last && o.First <= iv.Last }

// Lifetimes returns the live range of each of n values over steps, with inputs written
// before the first step and outputs read after the last. root, when not nil, maps each value
// to the value whose memory it uses (a view's input, say; root[v] == v for a value with its
// own): a use of a value counts as a use of its root, and only roots' ranges are meaningful
// (the others are left unused).
func Lifetimes(n int, root []int, inputs []int, steps []Step, outputs []int) []Interval {
	live := make([]Interval, n)
	for i := range live {
		live[i] = unused
	}
	touch := func(v, step int) {
		if root != nil {
			v = root[v]
		}
		live[v].First = min(live[v].First, step)
		live[v].Last = max(live[v].Last, step)
	}
	for _, v := range inputs {
		touch(v, Before)
	}
	for i, st := range steps {
		for _, v := range st.In {
			touch(v, i)
		}
		for _, v := range st.Out {
			touch(v, i)
		}
	}
	for _, v := range outputs {
		touch(v, len(steps))
	}
	return live
}

// Buffer is memory to place in an arena: Size bytes, in use over Live.
type Buffer struct {
	Size int64
	Live Interval
}

// Place lays bufs out in one arena and returns each buffer's byte offset (by index in bufs)
// and the arena's size. Sizes are rounded up to a multiple of align (> 0), so every offset
// is one; buffers whose live ranges overlap never share a byte. Greedy by size: the largest
// buffer first (equal sizes in the order given), each at the lowest offset that clears every
// buffer already placed and alive at the same time. The layout depends only on bufs and
// align.
func Place(bufs []Buffer, align int64) (offsets []int64, size int64) {
	type item struct {
		idx  int
		size int64
		live Interval
	}
	items := make([]item, len(bufs))
	for i, b := range bufs {
		items[i] = item{idx: i, size: (b.Size + align - 1) / align * align, live: b.Live}
	}
	sort.SliceStable(items, func(i, j int) bool { return items[i].size > items[j].size })
	type placed struct {
		off, end int64
		live     Interval
	}
	offsets = make([]int64, len(bufs))
	var done []placed
	for _, b := range items {
		var clash []placed
		for _, q := range done {
			if q.live.Overlaps(b.live) {
				clash = append(clash, q)
			}
		}
		sort.Slice(clash, func(i, j int) bool { return clash[i].off < clash[j].off })
		off := int64(0)
		for _, q := range clash {
			if off+b.size <= q.off {
				break
			}
			off = max(off, q.end)
		}
		offsets[b.idx] = off
		size = max(size, off+b.size)
		done = append(done, placed{off, off + b.size, b.live})
	}
	return offsets, size
}
