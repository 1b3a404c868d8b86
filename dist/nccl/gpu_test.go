package nccl

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/internal/gputest"
	"github.com/loom-ml/loom/tensor"
)

// The GPU tests need 2 GPUs. They skip, saying how many were found, where there are fewer
// (or no NCCL); with LOOM_REQUIRE_GPU=1 that is a failure instead (see internal/gputest).
// Results are compared bit for bit with values computed on the host: with two ranks a sum
// is one correctly rounded addition.

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" { // a rank started by a multi-process test
		os.Exit(runRole(role))
	}
	os.Exit(m.Run())
}

// needGPUs skips (or, with LOOM_REQUIRE_GPU=1, fails) the test unless n GPUs and NCCL can
// be used.
func needGPUs(t testing.TB, n int) {
	t.Helper()
	found, err := 0, cubind.Available()
	if err == nil {
		found, err = cubind.DeviceCount()
	}
	gputest.Need(t, n, found, err)
	gputest.Missing(t, "NCCL", cubind.NCCLAvailable())
}

// initWorlds makes in-process worlds on GPUs 0..n-1 for mesh, closed at the end of the
// test.
func initWorlds(t *testing.T, mesh string) []*World {
	t.Helper()
	m, err := dist.ParseMesh(mesh)
	if err != nil {
		t.Fatal(err)
	}
	needGPUs(t, m.Size())
	devs := make([]int, m.Size())
	for i := range devs {
		devs[i] = i
	}
	ws, err := InitAll(devs, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		onRanks(t, ws, func(w *World, _ cubind.Stream) error { return w.Close() })
	})
	return ws
}

// onRanks runs f for every world at once, each in a goroutine locked to its thread with
// the world's context current and a fresh stream, and reports the errors by rank.
func onRanks(t *testing.T, ws []*World, f func(w *World, s cubind.Stream) error) {
	t.Helper()
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for r, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if err := w.Context().SetCurrent(); err != nil {
				errs[r] = err
				return
			}
			s, err := cubind.StreamCreate(cubind.StreamNonBlocking)
			if err != nil {
				errs[r] = err
				return
			}
			errs[r] = f(w, s)
			if err := s.Destroy(); err != nil && errs[r] == nil {
				errs[r] = err
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// hostData holds the values of one buffer, exactly representable in its dtype.
type hostData []float64

func randomData(dt tensor.DType, n int, rng *rand.Rand) hostData {
	d := make(hostData, n)
	for i := range d {
		if dt.IsInt() {
			d[i] = float64(rng.IntN(201) - 100)
		} else {
			d[i] = roundTo(dt, rng.Float64()*8-4)
		}
	}
	return d
}

// roundTo rounds x to the nearest value of dt (ties to even).
func roundTo(dt tensor.DType, x float64) float64 {
	switch dt {
	case tensor.F32:
		return float64(float32(x))
	case tensor.BF16:
		return float64(tensor.BF16ToF32(tensor.F32ToBF16(float32(x))))
	case tensor.F16:
		return float64(tensor.F16ToF32(tensor.F32ToF16(float32(x))))
	}
	return x
}

func (d hostData) bytes(dt tensor.DType) []byte {
	b := make([]byte, len(d)*dt.Size())
	for i, v := range d {
		p := b[i*dt.Size():]
		switch dt {
		case tensor.F32:
			binary.LittleEndian.PutUint32(p, math.Float32bits(float32(v)))
		case tensor.BF16:
			binary.LittleEndian.PutUint16(p, tensor.F32ToBF16(float32(v)))
		case tensor.F16:
			binary.LittleEndian.PutUint16(p, tensor.F32ToF16(float32(v)))
		case tensor.I32:
			binary.LittleEndian.PutUint32(p, uint32(int32(v)))
		case tensor.I64:
			binary.LittleEndian.PutUint64(p, uint64(int64(v)))
		}
	}
	return b
}

func fromBytes(dt tensor.DType, b []byte) hostData {
	d := make(hostData, len(b)/dt.Size())
	for i := range d {
		p := b[i*dt.Size():]
		switch dt {
		case tensor.F32:
			d[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(p)))
		case tensor.BF16:
			d[i] = float64(tensor.BF16ToF32(binary.LittleEndian.Uint16(p)))
		case tensor.F16:
			d[i] = float64(tensor.F16ToF32(binary.LittleEndian.Uint16(p)))
		case tensor.I32:
			d[i] = float64(int32(binary.LittleEndian.Uint32(p)))
		case tensor.I64:
			d[i] = float64(int64(binary.LittleEndian.Uint64(p)))
		}
	}
	return d
}

// devBuf is a device buffer of one rank.
type devBuf struct {
	p cubind.DevicePtr
	n int // bytes
}

func upload(b []byte, s cubind.Stream) (devBuf, error) {
	p, err := cubind.MemAlloc(uint64(max(len(b), 1)))
	if err != nil {
		return devBuf{}, err
	}
	if err := cubind.MemcpyHtoDAsync(p, b, s); err != nil {
		cubind.MemFree(p)
		return devBuf{}, err
	}
	return devBuf{p, len(b)}, nil
}

func (d devBuf) download(s cubind.Stream) ([]byte, error) {
	b := make([]byte, d.n)
	err := cubind.MemcpyDtoHAsync(b, d.p, s)
	return b, err
}

// compare checks got against want bit for bit (as values of dt) and describes the first
// differences.
func compare(what string, dt tensor.DType, got, want hostData) error {
	if len(got) != len(want) {
		return fmt.Errorf("%s: %d elements, want %d", what, len(got), len(want))
	}
	bad := 0
	var first string
	for i := range got {
		if got[i] != want[i] {
			if bad == 0 {
				first = fmt.Sprintf("element %d = %v, want %v", i, got[i], want[i])
			}
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("%s (%s): %d of %d elements differ; first: %s", what, dt, bad, len(got), first)
	}
	return nil
}

func sumOf(dt tensor.DType, a, b hostData) hostData {
	out := make(hostData, len(a))
	for i := range a {
		out[i] = roundTo(dt, a[i]+b[i])
	}
	return out
}

func maxOf(a, b hostData) hostData {
	out := make(hostData, len(a))
	for i := range a {
		out[i] = math.Max(a[i], b[i])
	}
	return out
}

func concat(parts ...hostData) hostData {
	var out hostData
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// TestCollectives checks every collective on 2 GPUs against the host, for several dtypes
// and counts (odd ones included): all_reduce sum out of place and max in place,
// all_gather, reduce_scatter, all_to_all and broadcast from rank 1.
func TestCollectives(t *testing.T) {
	ws := initWorlds(t, "tp=2")
	type rankIO struct{ a, b hostData } // a: count elements, b: 2*count
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16, tensor.I32, tensor.I64} {
		counts := []int{1, 7, 1000, 4097, 1<<20 + 3}
		if dt != tensor.F32 && dt != tensor.BF16 {
			counts = []int{5, 4097}
		}
		for _, count := range counts {
			t.Run(fmt.Sprintf("%s/%d", dt, count), func(t *testing.T) {
				in := make([]rankIO, 2)
				for r := range in {
					rng := rand.New(rand.NewPCG(uint64(count), uint64(r)))
					in[r] = rankIO{randomData(dt, count, rng), randomData(dt, 2*count, rng)}
				}
				names := []string{"all_reduce sum", "all_reduce max (in place)", "all_gather", "reduce_scatter", "all_to_all", "broadcast from rank 1"}
				want := func(r int) []hostData {
					piece := func(d hostData, i int) hostData { return d[i*count : (i+1)*count] }
					return []hostData{
						sumOf(dt, in[0].a, in[1].a),
						maxOf(in[0].a, in[1].a),
						concat(in[0].a, in[1].a),
						sumOf(dt, piece(in[0].b, r), piece(in[1].b, r)),
						concat(piece(in[0].b, r), piece(in[1].b, r)),
						in[1].a,
					}
				}
				got := make([][]hostData, 2)
				onRanks(t, ws, func(w *World, s cubind.Stream) error {
					r := w.Rank()
					c, err := w.Axis("tp")
					if err != nil {
						return err
					}
					var bufs []devBuf
					defer func() {
						for _, b := range bufs {
							cubind.MemFree(b.p)
						}
					}()
					alloc := func(b []byte) cubind.DevicePtr {
						d, e := upload(b, s)
						if e != nil && err == nil {
							err = e
						}
						bufs = append(bufs, d)
						return d.p
					}
					esz := dt.Size()
					a, b := in[r].a.bytes(dt), in[r].b.bytes(dt)
					outs := []cubind.DevicePtr{
						alloc(make([]byte, count*esz)),   // all_reduce sum
						alloc(a),                         // all_reduce max, in place
						alloc(make([]byte, 2*count*esz)), // all_gather
						alloc(make([]byte, count*esz)),   // reduce_scatter
						alloc(make([]byte, 2*count*esz)), // all_to_all
						alloc(a),                         // broadcast
					}
					src, srcB := alloc(a), alloc(b)
					if err != nil {
						return err
					}
					for _, call := range []error{
						c.AllReduce(src, outs[0], count, dt, dist.Sum, s),
						c.AllReduce(outs[1], outs[1], count, dt, dist.Max, s),
						c.AllGather(src, outs[2], count, dt, s),
						c.ReduceScatter(srcB, outs[3], count, dt, dist.Sum, s),
						c.AllToAll(srcB, outs[4], count, dt, s),
						c.Broadcast(outs[5], count, dt, 1, s),
					} {
						if call != nil {
							return call
						}
					}
					if err := w.Sync(context.Background(), s); err != nil {
						return err
					}
					got[r] = make([]hostData, len(outs))
					for i := range outs {
						raw, err := bufs[i].download(s)
						if err != nil {
							return err
						}
						got[r][i] = fromBytes(dt, raw)
					}
					return nil
				})
				if t.Failed() {
					return
				}
				for r := range 2 {
					for i, w := range want(r) {
						if err := compare(fmt.Sprintf("rank %d %s", r, names[i]), dt, got[r][i], w); err != nil {
							t.Error(err)
						}
					}
				}
			})
		}
	}
}

// TestSplitGroups checks the communicators ncclCommSplit makes: with tp=1,dp=2 each rank
// is alone in its tp group (a reduction leaves its values) while dp spans both; with
// tp=2,dp=1 it is the other way round.
func TestSplitGroups(t *testing.T) {
	for _, tc := range []struct{ mesh, alone, both string }{{"tp=1,dp=2", "tp", "dp"}, {"tp=2,dp=1", "dp", "tp"}} {
		t.Run(tc.mesh, func(t *testing.T) {
			ws := initWorlds(t, tc.mesh)
			const count = 333
			in := [2][]float32{}
			for r := range in {
				in[r] = make([]float32, count)
				for i := range in[r] {
					in[r][i] = float32(r*1000 + i)
				}
			}
			onRanks(t, ws, func(w *World, s cubind.Stream) error {
				r := w.Rank()
				alone, err := w.Axis(tc.alone)
				if err != nil {
					return err
				}
				both, err := w.Axis(tc.both)
				if err != nil {
					return err
				}
				if alone.Size() != 1 || both.Size() != 2 || alone.Handle() == both.Handle() || both.Handle() != ws[r].world.Handle() {
					return fmt.Errorf("%s has %d ranks (handle %#x), %s %d (handle %#x), world handle %#x",
						tc.alone, alone.Size(), alone.Handle(), tc.both, both.Size(), both.Handle(), ws[r].world.Handle())
				}
				p, err := cubind.MemAlloc(2 * count * 4)
				if err != nil {
					return err
				}
				defer cubind.MemFree(p)
				q := p + count*4
				if err := cubind.MemcpyHtoDAsync(p, in[r], s); err != nil {
					return err
				}
				if err := cubind.MemcpyHtoDAsync(q, in[r], s); err != nil {
					return err
				}
				if err := alone.AllReduce(p, p, count, tensor.F32, dist.Sum, s); err != nil {
					return err
				}
				if err := both.AllReduce(q, q, count, tensor.F32, dist.Sum, s); err != nil {
					return err
				}
				if err := w.Sync(context.Background(), s); err != nil {
					return err
				}
				got := make([]float32, 2*count)
				if err := cubind.MemcpyDtoHAsync(got, p, s); err != nil {
					return err
				}
				for i := range count {
					if got[i] != in[r][i] || got[count+i] != in[0][i]+in[1][i] {
						return fmt.Errorf("element %d: %s gives %v (want %v), %s gives %v (want %v)",
							i, tc.alone, got[i], in[r][i], tc.both, got[count+i], in[0][i]+in[1][i])
					}
				}
				return nil
			})
		})
	}
}

// TestSyncTimesOutAndAborts: after one all_reduce together, rank 0 all-reduces alone. Its Sync gives up after the
// timeout, aborts its communicator (stopping the spinning kernel) and says so; rank 1 then
// learns that rank 0 aborted and fails at once.
func TestSyncTimesOutAndAborts(t *testing.T) {
	ws := initWorlds(t, "tp=2")
	ws[0].SetTimeout(2 * time.Second)
	rank0Done := make(chan struct{})
	onRanks(t, ws, func(w *World, s cubind.Stream) error {
		c, err := w.Axis("tp")
		if err != nil {
			return err
		}
		p, err := cubind.MemAlloc(4096)
		if err != nil {
			return err
		}
		defer cubind.MemFree(p)
		// Both ranks all-reduce once first: NCCL connects the ranks at their first
		// collective, and that handshake would block the lone rank inside the call.
		if err := c.AllReduce(p, p, 1024, tensor.F32, dist.Sum, s); err != nil {
			return err
		}
		if err := w.Sync(context.Background(), s); err != nil {
			return err
		}
		if w.Rank() == 1 {
			<-rank0Done
			err := c.AllReduce(p, p, 1024, tensor.F32, dist.Sum, s)
			var de *dist.Error
			if !errors.As(err, &de) || !errors.Is(err, dist.ErrBroken) || !errors.Is(err, dist.ErrPeerFailed) ||
				!strings.Contains(err.Error(), "rank 0 aborted") {
				return fmt.Errorf("after rank 0 aborted, got %v; want a broken world naming rank 0", err)
			}
			return nil
		}
		defer close(rank0Done)
		if err := c.AllReduce(p, p, 1024, tensor.F32, dist.Sum, s); err != nil {
			return err
		}
		start := time.Now()
		err = w.Sync(context.Background(), s)
		took := time.Since(start)
		t.Logf("rank 0 alone: Sync returned after %v: %v", took.Round(time.Millisecond), err)
		if !errors.Is(err, dist.ErrTimeout) || took < 2*time.Second || took > 20*time.Second {
			return fmt.Errorf("Sync after %v: %v; want dist.ErrTimeout after about 2s", took, err)
		}
		if !errors.Is(w.Err(), dist.ErrBroken) {
			return fmt.Errorf("world not broken after the timeout: %v", w.Err())
		}
		return nil
	})
}

// AllGatherBytes gives every rank every rank's bytes, of different lengths (none too), in
// rank order, and refuses more than MaxExchangeBytes.
func TestAllGatherBytes(t *testing.T) {
	ws := initWorlds(t, "tp=2")
	mine := [][]byte{[]byte("rank zero's description"), nil}
	onRanks(t, ws, func(w *World, _ cubind.Stream) error {
		all, err := w.AllGatherBytes(context.Background(), mine[w.Rank()])
		if err != nil {
			return err
		}
		if len(all) != 2 || !bytes.Equal(all[0], mine[0]) || len(all[1]) != 0 {
			return fmt.Errorf("got %q, want %q", all, mine)
		}
		if _, err := w.AllGatherBytes(context.Background(), make([]byte, MaxExchangeBytes+1)); err == nil {
			return fmt.Errorf("an exchange of %d bytes did not fail", MaxExchangeBytes+1)
		}
		return nil
	})
}
