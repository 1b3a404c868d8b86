package cpu

import (
	"context"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"weak"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// residentPA compiles a paged_attention program over caches x4, x5 of nb blocks of bs
// slots (KV heads of D), resident when resident is set.
func residentPA(t *testing.T, dt tensor.DType, H, KV, D, bs int, resident bool) *Program {
	t.Helper()
	p := paProgram(t, "paged_attention", graph.Attrs{"scale": 0.125, "window": 0}, paTypes(dt, H, KV, D, bs)...)
	if resident {
		p.keepResident(func(name string) bool { return name == "x4" || name == "x5" })
	}
	return p
}

// TestResidentCacheSameBits: a program that keeps its caches (shape-only tensors passed,
// storage off the Go heap) computes the bits of one given zeroed caches, step after step
// (a prefill of one sequence, then decode tokens reading what earlier steps wrote), in f32
// and bf16; Resident names the caches; a shape change maps new storage; Release unmaps.
func TestResidentCacheSameBits(t *testing.T) {
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			const H, KV, D, bs, NB = 4, 2, 16, 4, 9
			rng := rand.New(rand.NewPCG(7, uint64(dt)))
			heap, kept := residentPA(t, dt, H, KV, D, bs, false), residentPA(t, dt, H, KV, D, bs, true)
			if got := kept.Resident(); !slices.Equal(got, []string{"x4", "x5"}) {
				t.Fatalf("Resident() = %v, want [x4 x5]", got)
			}
			if got := heap.Resident(); got != nil {
				t.Fatalf("Resident() of a program without resident inputs = %v, want none", got)
			}
			kc, vc := tensor.New(dt, NB, bs, KV, D), tensor.New(dt, NB, bs, KV, D)
			kShape, vShape := shapeOnly(dt, NB, bs, KV, D), shapeOnly(dt, NB, bs, KV, D)
			table := []int{5, 2, 7, 0} // blocks of the one sequence, out of order
			done := 0
			for step, n := range []int{6, 1, 1, 3, 1} {
				pos, slots, seqs := make([]int, n), make([]int, n), make([]int, n)
				for i := range n {
					p := done + i
					pos[i], slots[i] = p, table[p/bs]*bs+p%bs
				}
				q, k, v := paRand(rng, dt, 1, H, n, D), paRand(rng, dt, 1, KV, n, D), paRand(rng, dt, 1, KV, n, D)
				feeds := func(kc, vc *tensor.Tensor) map[string]*tensor.Tensor {
					return paFeeds(q, k, v, paI32([]int{1, n}, pos...), kc, vc, paI32([]int{n}, slots...),
						paI32([]int{n}, seqs...), paI32([]int{1, len(table)}, table...))
				}
				want, err := heap.Run(context.Background(), feeds(kc, vc))
				if err != nil {
					t.Fatalf("step %d, caches given: %v", step, err)
				}
				got, err := kept.Run(context.Background(), feeds(kShape, vShape))
				if err != nil {
					t.Fatalf("step %d, caches kept: %v", step, err)
				}
				if !slices.Equal(got[0].Float32s(), want[0].Float32s()) {
					t.Fatalf("step %d: the kept caches give other values than the given ones", step)
				}
				done += n
			}
			own := kept.resident.bufs[weak.Make(kShape)].t
			if !slices.Equal(own.Float32s(), kc.Float32s()) {
				t.Errorf("the kept K cache holds other values than the given one")
			}
			if got, want := kept.ResidentBytes(), int64(2*NB*bs*KV*D*dt.Size()); got != want {
				t.Errorf("ResidentBytes() = %d, want %d", got, want)
			}
			// A caller's tensor with elements is used as given, even for a resident input.
			kc2, vc2 := tensor.New(dt, NB, bs, KV, D), tensor.New(dt, NB, bs, KV, D)
			q, k, v := paRand(rng, dt, 1, H, 1, D), paRand(rng, dt, 1, KV, 1, D), paRand(rng, dt, 1, KV, 1, D)
			if _, err := kept.Run(context.Background(), paFeeds(q, k, v, paI32([]int{1, 1}, 0), kc2, vc2, paI32([]int{1}, 4),
				paI32([]int{1}, 0), paI32([]int{1, 1}, 1))); err != nil {
				t.Fatal(err)
			}
			if slices.Equal(kc2.Float32s(), tensor.New(dt, NB, bs, KV, D).Float32s()) {
				t.Errorf("a given resident cache with elements was not written")
			}
			// Other shape-only tensors: storage of their own, zeroed, of their shape.
			bigK, bigV := shapeOnly(dt, NB+3, bs, KV, D), shapeOnly(dt, NB+3, bs, KV, D)
			if _, err := kept.Run(context.Background(), paFeeds(q, k, v, paI32([]int{1, 1}, 0), bigK, bigV, paI32([]int{1}, 4),
				paI32([]int{1}, 0), paI32([]int{1, 1}, 1))); err != nil {
				t.Fatal(err)
			}
			if got := kept.resident.bufs[weak.Make(bigK)].t.Shape; !slices.Equal(got, bigK.Shape) {
				t.Errorf("a kept cache for a %v tensor is %v", bigK.Shape, got)
			}
			if got, want := kept.ResidentBytes(), int64(2*(2*NB+3)*bs*KV*D*dt.Size()); got != want {
				t.Errorf("ResidentBytes() with two pairs of caches = %d, want %d", got, want)
			}
			// One shape-only tensor for two resident inputs, or a tensor whose shape changed:
			// errors, not aliased or stale storage.
			_, err := kept.Run(context.Background(), paFeeds(q, k, v, paI32([]int{1, 1}, 0), bigK, bigK, paI32([]int{1}, 4),
				paI32([]int{1}, 0), paI32([]int{1, 1}, 1)))
			if err == nil || !strings.Contains(err.Error(), "same shape-only tensor") {
				t.Errorf("one tensor for both caches: error %v, want one naming the shared tensor", err)
			}
			bigV.Shape[0]++
			_, err = kept.Run(context.Background(), paFeeds(q, k, v, paI32([]int{1, 1}, 0), bigK, bigV, paI32([]int{1}, 4),
				paI32([]int{1}, 0), paI32([]int{1, 1}, 1)))
			if err == nil || !strings.Contains(err.Error(), "at an earlier run") {
				t.Errorf("a kept tensor that changed shape: error %v, want one naming both shapes", err)
			}
			runtime.KeepAlive(kShape) // their storage lives as long as they do
			runtime.KeepAlive(vShape)
			if err := kept.Release(); err != nil {
				t.Fatal(err)
			}
			if got := kept.ResidentBytes(); got != 0 {
				t.Errorf("ResidentBytes() after Release = %d, want 0", got)
			}
		})
	}
}

// TestResidentCacheOffHeap: a kept cache of 2x64 MiB adds nothing to the Go heap (the
// collector's heap goal is not raised by it) and, after a step writes a few slots, only
// their pages are resident (mincore).
func TestResidentCacheOffHeap(t *testing.T) {
	const H, KV, D, bs = 4, 2, 64, 16
	const NB = 64 << 20 / (bs * KV * D * 4) // 64 MiB a cache
	rng := rand.New(rand.NewPCG(8, 9))
	kept := residentPA(t, tensor.F32, H, KV, D, bs, true)
	defer kept.Release()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	kShape, vShape := shapeOnly(tensor.F32, NB, bs, KV, D), shapeOnly(tensor.F32, NB, bs, KV, D)
	const n = 20 // tokens: blocks 100 and 101 (two pages of each cache)
	pos, slots, seqs := make([]int, n), make([]int, n), make([]int, n)
	for i := range n {
		pos[i], slots[i] = i, 100*bs+i
	}
	q, k, v := paRand(rng, tensor.F32, 1, H, n, D), paRand(rng, tensor.F32, 1, KV, n, D), paRand(rng, tensor.F32, 1, KV, n, D)
	if _, err := kept.Run(context.Background(), paFeeds(q, k, v, paI32([]int{1, n}, pos...), kShape, vShape,
		paI32([]int{n}, slots...), paI32([]int{n}, seqs...), paI32([]int{1, 2}, 100, 101))); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapSys) - int64(before.HeapSys); grew > 16<<20 {
		t.Errorf("the Go heap grew by %d bytes for 128 MiB of kept caches, want them off the heap", grew)
	}
	for name, shape := range map[string]*tensor.Tensor{"x4": kShape, "x5": vShape} {
		b := kept.resident.bufs[weak.Make(shape)]
		res, ok := residentPages(b.mem)
		if !ok {
			t.Skip("mincore is not available here")
		}
		// 20 slots of 512 bytes: 10 KiB, three pages at most.
		if res > 4*4096 {
			t.Errorf("cache %s: %d bytes resident after writing 10 KiB of it, want its written pages only", name, res)
		}
		if res == 0 {
			t.Errorf("cache %s: nothing resident after a step wrote to it", name)
		}
	}
	runtime.KeepAlive(kShape)
	runtime.KeepAlive(vShape)
}

// shapeOnly is a tensor with a dtype and a shape but no elements (kvcache.NewCacheShapes).
func shapeOnly(dt tensor.DType, shape ...int) *tensor.Tensor {
	return &tensor.Tensor{DType: dt, Shape: shape}
}

// TestResidentCacheFreedWithTensor: the storage of a kept cache lives as long as the
// shape-only tensor it stands for (an engine's cache): once the tensors are garbage, it is
// unmapped.
func TestResidentCacheFreedWithTensor(t *testing.T) {
	const H, KV, D, bs, NB = 4, 2, 16, 4, 64
	rng := rand.New(rand.NewPCG(10, 11))
	kept := residentPA(t, tensor.F32, H, KV, D, bs, true)
	defer kept.Release()
	step := func() {
		q, k, v := paRand(rng, tensor.F32, 1, H, 1, D), paRand(rng, tensor.F32, 1, KV, 1, D), paRand(rng, tensor.F32, 1, KV, 1, D)
		if _, err := kept.Run(context.Background(), paFeeds(q, k, v, paI32([]int{1, 1}, 0), shapeOnly(tensor.F32, NB, bs, KV, D),
			shapeOnly(tensor.F32, NB, bs, KV, D), paI32([]int{1}, 0), paI32([]int{1}, 0), paI32([]int{1, 1}, 0))); err != nil {
			t.Fatal(err)
		}
	}
	step()
	if got, want := kept.ResidentBytes(), int64(2*NB*bs*KV*D*4); got != want {
		t.Fatalf("ResidentBytes() = %d, want %d", got, want)
	}
	for i := 0; kept.ResidentBytes() != 0; i++ {
		if i == 100 {
			t.Fatalf("ResidentBytes() = %d after the caches' tensors are gone, want 0", kept.ResidentBytes())
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}
