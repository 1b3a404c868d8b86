package kvcache

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

func spec2() Spec {
	return Spec{BlockSize: 16, Layers: []LayerSpec{
		{K: "kv_cache.0.k", V: "kv_cache.0.v", KVHeads: 2, HeadDim: 8, DType: tensor.F32},
		{K: "kv_cache.1.k", V: "kv_cache.1.v", KVHeads: 2, HeadDim: 8, DType: tensor.BF16},
	}}
}

func TestSpec(t *testing.T) {
	s := spec2()
	// 2 (K,V) * 16 slots * 2 heads * 8 * (4 + 2 bytes)
	if got, want := s.BlockBytes(), int64(2*16*2*8*(4+2)); got != want {
		t.Errorf("BlockBytes = %d, want %d", got, want)
	}
	for _, tc := range []struct {
		budget, block int64
		want          int
	}{{10000, 3072, 3}, {3071, 3072, 0}, {0, 3072, 0}, {100, 0, 0}, {-1, 5, 0}} {
		if got := NumBlocks(tc.budget, tc.block); got != tc.want {
			t.Errorf("NumBlocks(%d, %d) = %d, want %d", tc.budget, tc.block, got, tc.want)
		}
	}
	bad := []Spec{
		{BlockSize: 0, Layers: s.Layers},
		{BlockSize: 16},
		{BlockSize: 16, Layers: []LayerSpec{{K: "a", V: "b", KVHeads: 0, HeadDim: 8, DType: tensor.F32}}},
		{BlockSize: 16, Layers: []LayerSpec{{K: "a", V: "b", KVHeads: 1, HeadDim: 8, DType: tensor.I32}}},
		{BlockSize: 16, Layers: []LayerSpec{{K: "a", V: "a", KVHeads: 1, HeadDim: 8, DType: tensor.F32}}},
	}
	for _, b := range bad {
		if err := b.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", b)
		}
	}
}

func TestCache(t *testing.T) {
	c, err := NewCache(spec2(), 5)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.K[1].Shape, []int{5, 16, 2, 8}) || c.K[1].DType != tensor.BF16 || c.V[0].DType != tensor.F32 {
		t.Errorf("layer shapes %v %s / %s", c.K[1].Shape, c.K[1].DType, c.V[0].DType)
	}
	if c.Bytes() != 5*spec2().BlockBytes() {
		t.Errorf("Bytes = %d", c.Bytes())
	}
	in := map[string]*tensor.Tensor{}
	c.Bind(in)
	if len(in) != 4 || in["kv_cache.1.v"] != c.V[1] {
		t.Errorf("Bind gave %v", in)
	}
	if _, err := NewCache(spec2(), 0); err == nil {
		t.Error("NewCache with 0 blocks succeeded")
	}
}

func TestAllocator(t *testing.T) {
	a, err := NewAllocator(4, 4)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		op     string // reserve, free
		seq    SeqID
		tokens int
		err    bool
		blocks []int32 // seq's table afterwards
		free   int
	}{
		{"reserve", 1, 5, false, []int32{0, 1}, 2},
		{"reserve", 1, 8, false, []int32{0, 1}, 2}, // still fits two blocks
		{"reserve", 2, 0, false, nil, 2},
		{"reserve", 2, 9, true, nil, 2}, // needs 3, all or nothing
		{"reserve", 2, 4, false, []int32{2}, 1},
		{"reserve", 1, 9, false, []int32{0, 1, 3}, 0},
		{"reserve", 2, 5, true, []int32{2}, 0},
		{"free", 1, 0, false, nil, 3},
		{"reserve", 2, 16, false, []int32{2, 0, 1, 3}, 0}, // freed blocks are reused, first block first
		{"free", 2, 0, false, nil, 4},
		{"free", 9, 0, false, nil, 4}, // unknown: no-op
	}
	for i, s := range steps {
		var err error
		switch s.op {
		case "reserve":
			can := a.CanReserve(s.seq, s.tokens)
			err = a.Reserve(s.seq, s.tokens)
			if can != (err == nil) {
				t.Errorf("step %d: CanReserve %v but Reserve: %v", i, can, err)
			}
		case "free":
			a.Free(s.seq)
		}
		if (err != nil) != s.err || err != nil && !errors.Is(err, ErrOutOfBlocks) {
			t.Errorf("step %d (%s seq %d, %d tokens): err %v, want error %v", i, s.op, s.seq, s.tokens, err, s.err)
		}
		if got := a.Blocks(s.seq); !slices.Equal(got, s.blocks) {
			t.Errorf("step %d: blocks %v, want %v", i, got, s.blocks)
		}
		if st := a.Stats(); st.Free != s.free || st.Used != 4-s.free || st.Blocks != 4 {
			t.Errorf("step %d: stats %+v, want %d free", i, st, s.free)
		}
	}
	if st := a.Stats(); st.Peak != 4 || st.Sequences != 0 {
		t.Errorf("final stats %+v", st)
	}
}

func TestSlot(t *testing.T) {
	a, _ := NewAllocator(8, 4)
	_ = a.Reserve(1, 3)  // block 0
	_ = a.Reserve(2, 4)  // block 1
	_ = a.Reserve(1, 10) // blocks 0, 2, 3
	for _, tc := range []struct {
		seq  SeqID
		pos  int
		want int32
		err  bool
	}{
		{1, 0, 0, false}, {1, 3, 3, false}, {1, 4, 8, false}, {1, 9, 13, false}, {1, 11, 15, false},
		{1, 12, 0, true}, {1, -1, 0, true}, {2, 2, 6, false}, {3, 0, 0, true},
	} {
		got, err := a.Slot(tc.seq, tc.pos)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("Slot(%d, %d) = %d, %v; want %d (error %v)", tc.seq, tc.pos, got, err, tc.want, tc.err)
		}
	}
	if got := a.AppendBlocks([]int32{-1}, 1); !slices.Equal(got, []int32{-1, 0, 2, 3}) {
		t.Errorf("AppendBlocks = %v", got)
	}
}

func TestAllocatorBadArgs(t *testing.T) {
	for _, tc := range [][2]int{{0, 16}, {4, 0}, {-1, 4}} {
		if _, err := NewAllocator(tc[0], tc[1]); err == nil {
			t.Errorf("NewAllocator(%d, %d) succeeded", tc[0], tc[1])
		}
	}
}

// TestAllocatorConcurrent runs reservations and frees from several goroutines; with -race it
// checks the locking, and at the end every block must be free again with no block handed out
// twice meanwhile.
func TestAllocatorConcurrent(t *testing.T) {
	a, _ := NewAllocator(64, 2)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				seq := SeqID(g*1000 + i)
				if err := a.Reserve(seq, 1+i%9); err != nil && !errors.Is(err, ErrOutOfBlocks) {
					t.Error(err)
				}
				_ = a.Stats()
				a.Free(seq)
			}
		})
	}
	wg.Wait()
	st := a.Stats()
	if st.Free != 64 || st.Sequences != 0 {
		t.Fatalf("after all frees: %+v", st)
	}
	seen := map[int32]bool{}
	for _, b := range a.free {
		if seen[b] || b < 0 || b >= 64 {
			t.Fatalf("free list holds block %d twice or out of range: %v", b, a.free)
		}
		seen[b] = true
	}
}

// Shape-only caches describe the same tensors as NewCache's, holding no elements.
func TestCacheShapes(t *testing.T) {
	full, err := NewCache(spec2(), 5)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCacheShapes(spec2(), 5)
	if err != nil {
		t.Fatal(err)
	}
	for i := range full.K {
		for _, p := range [][2]*tensor.Tensor{{c.K[i], full.K[i]}, {c.V[i], full.V[i]}} {
			if p[0].DType != p[1].DType || !slices.Equal(p[0].Shape, p[1].Shape) || p[0].Len() != 0 {
				t.Errorf("layer %d: shape-only %s%v holding %d, full %s%v", i, p[0].DType, p[0].Shape, p[0].Len(), p[1].DType, p[1].Shape)
			}
		}
	}
	if _, err := NewCacheShapes(spec2(), 0); err == nil {
		t.Error("NewCacheShapes accepted 0 blocks")
	}
}
