package cuda

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/internal/gputest"
	"github.com/loom-ml/loom/tensor"
)

// The peer all-reduce tests need two GPUs that reach each other (GPU 0 is the test device,
// GPU 1 is opened once and kept for the test binary's life). With fewer they skip, saying
// how many were found; with LOOM_REQUIRE_GPU=1 they fail instead (see requireGPU).

var (
	peerOnce sync.Once
	peerDev1 *Device
	peerErr  error
)

// peerDevs returns GPUs 0 and 1, or skips the test (fails it with LOOM_REQUIRE_GPU=1).
func peerDevs(t *testing.T) []*Device {
	t.Helper()
	d0 := gpu(t)
	requireGPU(t, 2)
	peerOnce.Do(func() { peerDev1, peerErr = Open(1) })
	if peerErr != nil {
		t.Fatalf("GPU 1: %v", peerErr)
	}
	return []*Device{d0, peerDev1}
}

// peerGroup makes a group of devs closed at the end of the test.
func peerGroup(t *testing.T, devs []*Device, maxBytes int) *PeerGroup {
	t.Helper()
	g, err := NewPeerGroup(devs, maxBytes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	return g
}

// onRanks runs f for every rank at once, a goroutine each, and joins their errors.
func onRanks(n int, f func(rank int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if err := f(i); err != nil {
				errs[i] = fmt.Errorf("rank %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// peerInput returns rank's input of a case: values in [-4, 4) rounded to dt, the first two
// negative zeros (a sum that starts from +0 would lose their sign).
func peerInput(seed uint64, rank int, dt tensor.DType, n int) *tensor.Tensor {
	rng := rand.New(rand.NewPCG(seed, uint64(rank)))
	f := make([]float32, n)
	for i := range f {
		f[i] = float32(rng.Float64()*8 - 4)
	}
	for i := range min(2, n) {
		f[i] = float32(math.Copysign(0, -1))
	}
	return tensor.FromF32(f, n).Cast(dt)
}

// hostSum sums xs elementwise in rank order in f32 and rounds once to their dtype, as the
// all-reduce defines it.
func hostSum(xs []*tensor.Tensor) *tensor.Tensor {
	acc := slices.Clone(xs[0].Float32s()) // Float32s of an f32 tensor is its storage
	for _, x := range xs[1:] {
		for i, v := range x.Float32s() {
			acc[i] += v
		}
	}
	return tensor.FromF32(acc, xs[0].Shape...).Cast(xs[0].DType)
}

// bitsOf returns the bit patterns of a float tensor's elements.
func bitsOf(t *tensor.Tensor) []uint32 {
	out := make([]uint32, t.Numel())
	for i := range out {
		switch t.DType {
		case tensor.F32:
			out[i] = math.Float32bits(t.F32[i])
		default:
			out[i] = uint32(t.Half[i])
		}
	}
	return out
}

// sameBits reports where got and want differ in dtype, shape or any element's bits.
func sameBits(what string, got, want *tensor.Tensor) error {
	if got.DType != want.DType || fmt.Sprint(got.Shape) != fmt.Sprint(want.Shape) {
		return fmt.Errorf("%s: got %s%v, want %s%v", what, got.DType, got.Shape, want.DType, want.Shape)
	}
	g, w := bitsOf(got), bitsOf(want)
	bad, first := 0, -1
	for i := range g {
		if g[i] != w[i] {
			if first < 0 {
				first = i
			}
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("%s: %d of %d elements differ; first at %d: got %v (%#x), want %v (%#x)",
			what, bad, len(g), first, got.At(first), g[first], want.At(first), w[first])
	}
	return nil
}

// prepend returns h with k zero elements before it.
func prepend(h *tensor.Tensor, k int) *tensor.Tensor {
	out := tensor.New(h.DType, k+h.Numel())
	if h.DType == tensor.F32 {
		copy(out.F32[k:], h.F32)
	} else {
		copy(out.Half[k:], h.Half)
	}
	return out
}

// fill copies host tensor h into the existing device tensor dst.
func fill(d *Device, dst *Tensor, h *tensor.Tensor) error {
	return d.do(func() error { return cubind.MemcpyHtoDAsync(dst.ptr, tensor.Bytes(h), d.stream) })
}

// offsetView is a tensor of shape over t's memory starting elems elements in: unaligned
// for vector access when elems*size is not a multiple of 16.
func offsetView(t *Tensor, elems int, shape ...int) *Tensor {
	return &Tensor{DType: t.DType, Shape: shape, ptr: t.ptr + cubind.DevicePtr(elems*t.DType.Size()), dev: t.dev}
}

func TestPeerAllReduce(t *testing.T) {
	devs := peerDevs(t)
	g := peerGroup(t, devs, 4<<20)
	type tc struct {
		dt      tensor.DType
		n       int
		inPlace bool // out is x
		offset  int  // x and out start this many elements into their allocation
	}
	var cases []tc
	for _, dt := range []tensor.DType{tensor.BF16, tensor.F32} {
		for _, n := range []int{1, 7, 1000, 4096, 1 << 20} {
			cases = append(cases, tc{dt: dt, n: n})
		}
		cases = append(cases, tc{dt: dt, n: 1000, inPlace: true}, tc{dt: dt, n: 1001, offset: 1}, tc{dt: dt, n: 4099, offset: 3, inPlace: true})
	}
	for ci, c := range cases {
		name := fmt.Sprintf("%s_n%d_inplace%v_offset%d", c.dt, c.n, c.inPlace, c.offset)
		t.Run(name, func(t *testing.T) {
			xs := []*tensor.Tensor{peerInput(uint64(ci), 0, c.dt, c.n), peerInput(uint64(ci), 1, c.dt, c.n)}
			want := hostSum(xs)
			x, out := make([]*Tensor, 2), make([]*Tensor, 2)
			for r, d := range devs {
				h := xs[r]
				if c.offset > 0 {
					h = prepend(h, c.offset)
				}
				x[r] = up(t, d, h)[0]
				out[r] = like(t, d, h)[0]
				if c.offset > 0 {
					x[r], out[r] = offsetView(x[r], c.offset, c.n), offsetView(out[r], c.offset, c.n)
				}
				if c.inPlace {
					out[r] = x[r]
				}
			}
			if err := onRanks(2, func(r int) error { return g.Rank(r).AllReduce(out[r], x[r]) }); err != nil {
				t.Fatal(err)
			}
			var got [2]*tensor.Tensor
			for r, d := range devs {
				got[r] = down(t, d, out[r])
				if err := sameBits(fmt.Sprintf("rank %d vs host sum", r), got[r], want); err != nil {
					t.Error(err)
				}
				if err := g.Rank(r).Check(); err != nil {
					t.Fatal(err)
				}
			}
			if err := sameBits("rank 1 vs rank 0", got[1], got[0]); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestPeerAllReduceRepeated makes 1000 calls back to back, cycling through sizes that give
// different grids (so the call counter, not per-block state, must keep the ranks in step) and
// through fresh inputs (so a stale buffer shows), with an all_reduce_add_rmsnorm every
// fifth call, and checks every result.
func TestPeerAllReduceRepeated(t *testing.T) {
	devs := peerDevs(t)
	g := peerGroup(t, devs, 1<<20)
	type shape struct {
		dt tensor.DType
		n  int
	}
	shapes := []shape{{tensor.BF16, 1000}, {tensor.F32, 70000}, {tensor.BF16, 7}, {tensor.BF16, 200000}}
	const calls, variants, D = 1000, 3, 256
	// inputs[s][v][rank]
	inputs := make([][][]*Tensor, len(shapes))
	wants := make([][]*tensor.Tensor, len(shapes))
	for s, sh := range shapes {
		inputs[s] = make([][]*Tensor, variants)
		for v := range variants {
			xs := []*tensor.Tensor{peerInput(uint64(100+s*10+v), 0, sh.dt, sh.n), peerInput(uint64(100+s*10+v), 1, sh.dt, sh.n)}
			wants[s] = append(wants[s], hostSum(xs))
			for r, d := range devs {
				inputs[s][v] = append(inputs[s][v], up(t, d, xs[r])[0])
			}
		}
	}
	// The fused calls: x [4,D] and residual bf16; their sum output is checked against the host.
	fx := []*tensor.Tensor{peerInput(7, 0, tensor.BF16, 4*D), peerInput(7, 1, tensor.BF16, 4*D)}
	fres := peerInput(8, 0, tensor.BF16, 4*D)
	fw := peerInput(9, 0, tensor.BF16, D)
	fsum := hostSum([]*tensor.Tensor{hostSum(fx), fres})
	outs := make([][]*Tensor, 2)
	var fusedX, fusedRes, fusedW [2]*Tensor
	for r, d := range devs {
		fusedX[r] = up(t, d, fx[r])[0]
		fusedRes[r] = up(t, d, fres)[0]
		fusedW[r] = up(t, d, fw)[0]
		for i := range calls {
			if i%5 == 4 {
				outs[r] = append(outs[r], like(t, d, fres, fres)...) // normed, sum
				continue
			}
			sh := shapes[i%len(shapes)]
			outs[r] = append(outs[r], like(t, d, tensor.New(sh.dt, sh.n))[0])
		}
	}
	err := onRanks(2, func(r int) error {
		k := 0
		for i := range calls {
			if i%5 == 4 {
				x, _ := fusedX[r].View(4, D)
				res, _ := fusedRes[r].View(4, D)
				n, _ := outs[r][k].View(4, D)
				s, _ := outs[r][k+1].View(4, D)
				if err := g.Rank(r).AllReduceAddRMSNorm(n, s, x, res, fusedW[r], 1e-5); err != nil {
					return fmt.Errorf("call %d: %w", i, err)
				}
				k += 2
				continue
			}
			s := i % len(shapes)
			if err := g.Rank(r).AllReduce(outs[r][k], inputs[s][(i/len(shapes))%variants][r]); err != nil {
				return fmt.Errorf("call %d: %w", i, err)
			}
			k++
		}
		return g.Rank(r).Check()
	})
	if err != nil {
		t.Fatal(err)
	}
	bad := 0
	for r, d := range devs {
		k := 0
		for i := range calls {
			var err error
			if i%5 == 4 {
				err = sameBits(fmt.Sprintf("rank %d call %d (fused) sum", r, i), down(t, d, outs[r][k+1]), fsum)
				k += 2
			} else {
				s := i % len(shapes)
				err = sameBits(fmt.Sprintf("rank %d call %d", r, i), down(t, d, outs[r][k]), wants[s][(i/len(shapes))%variants])
				k++
			}
			if err != nil {
				if bad++; bad <= 10 {
					t.Error(err)
				}
			}
		}
	}
	if bad > 10 {
		t.Errorf("... %d wrong results in all", bad)
	}
}

func TestPeerAllReduceAddRMSNorm(t *testing.T) {
	devs := peerDevs(t)
	g := peerGroup(t, devs, 1<<20)
	bf, f32 := tensor.BF16, tensor.F32
	cases := []struct {
		x, r, w tensor.DType
		rows, D int
		inPlace bool // sum is residual
	}{
		{bf, bf, bf, 1, 4096, false},
		{bf, bf, bf, 37, 1024, false},
		{f32, f32, f32, 3, 1000, false},
		{bf, f32, bf, 2, 1001, false},   // D not a multiple of the vector: the loop form
		{bf, f32, bf, 3, 4096, false},   // vector form, x narrower than the vector: element by element
		{f32, bf, f32, 300, 256, false}, // more rows than blocks
		{bf, bf, f32, 1, 7, false},
		{f32, f32, bf, 5, 4096, false},
		{bf, bf, bf, 4, 2048, true},
		{f32, f32, bf, 2, 3000, true},
		{bf, bf, bf, 2, 10000, false}, // two vectors per thread: the loop form
		{f32, f32, f32, 20, 12288, true},
	}
	for ci, c := range cases {
		name := fmt.Sprintf("x%s_r%s_w%s_%dx%d_inplace%v", c.x, c.r, c.w, c.rows, c.D, c.inPlace)
		t.Run(name, func(t *testing.T) {
			n := c.rows * c.D
			sdt := promote(c.x, c.r)
			ndt := promote(c.w, sdt)
			type rankTensors struct{ x, res, res2, w, normed, sum, ar, nRef, sRef *Tensor }
			var rt [2]rankTensors
			for r, d := range devs {
				xs := peerInput(uint64(1000+ci), r, c.x, n)
				res := peerInput(uint64(2000+ci), r, c.r, n)
				w := peerInput(uint64(3000+ci), 0, c.w, c.D)
				u := up(t, d, xs, res, res, w)
				a := like(t, d, tensor.New(ndt, n), tensor.New(sdt, n), tensor.New(c.x, n), tensor.New(ndt, n), tensor.New(sdt, n))
				shape := func(x *Tensor) *Tensor {
					v, err := x.View(c.rows, c.D)
					if err != nil {
						t.Fatal(err)
					}
					return v
				}
				rt[r] = rankTensors{x: shape(u[0]), res: shape(u[1]), res2: shape(u[2]), w: u[3],
					normed: shape(a[0]), sum: shape(a[1]), ar: shape(a[2]), nRef: shape(a[3]), sRef: shape(a[4])}
				if c.inPlace {
					rt[r].sum = rt[r].res2
				}
			}
			err := onRanks(2, func(r int) error {
				p, d := g.Rank(r), devs[r]
				x := rt[r]
				if err := p.AllReduceAddRMSNorm(x.normed, x.sum, x.x, x.res2, x.w, 1e-5); err != nil {
					return err
				}
				if err := p.AllReduce(x.ar, x.x); err != nil {
					return err
				}
				return AddRMSNorm(d, x.nRef, x.sRef, x.ar, x.res, x.w, 1e-5)
			})
			if err != nil {
				t.Fatal(err)
			}
			for r, d := range devs {
				if err := sameBits(fmt.Sprintf("rank %d normed", r), down(t, d, rt[r].normed), down(t, d, rt[r].nRef)); err != nil {
					t.Error(err)
				}
				if err := sameBits(fmt.Sprintf("rank %d sum", r), down(t, d, rt[r].sum), down(t, d, rt[r].sRef)); err != nil {
					t.Error(err)
				}
				if err := g.Rank(r).Check(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// capturePeer records f's work on r's device into a CUDA graph and instantiates it.
func capturePeer(r *PeerRank, f func() error) (cubind.GraphExec, error) {
	d := r.dev
	var exe cubind.GraphExec
	err := d.do(func() error {
		var err error
		exe, err = d.captureGraph(f)
		return err
	})
	return exe, err
}

// TestPeerGraph captures an all-reduce and an all_reduce_add_rmsnorm in a CUDA graph on each
// rank and replays it with new inputs each time.
func TestPeerGraph(t *testing.T) {
	devs := peerDevs(t)
	g := peerGroup(t, devs, 1<<20)
	const rows, D, replays = 3, 2048, 6
	n := rows * D
	type rankTensors struct{ x, res, w, out, normed, sum, ar, nRef, sRef *Tensor }
	var rt [2]rankTensors
	var exes [2]cubind.GraphExec
	for r, d := range devs {
		h := tensor.New(tensor.BF16, rows, D)
		u := up(t, d, h, h)
		w := up(t, d, peerInput(5, 0, tensor.BF16, D))[0]
		a := like(t, d, h, h, h, h, h, h)
		rt[r] = rankTensors{x: u[0], res: u[1], w: w, out: a[0], normed: a[1], sum: a[2], ar: a[3], nRef: a[4], sRef: a[5]}
		p := g.Rank(r)
		exe, err := capturePeer(p, func() error {
			if err := p.allReduce(rt[r].out, rt[r].x); err != nil {
				return err
			}
			return p.allReduceAddRMSNorm(rt[r].normed, rt[r].sum, rt[r].x, rt[r].res, rt[r].w, 1e-6)
		})
		if err != nil {
			t.Fatalf("rank %d: capture: %v", r, err)
		}
		exes[r] = exe
		t.Cleanup(func() { exe.Destroy() })
	}
	for k := range replays {
		xs := []*tensor.Tensor{peerInput(uint64(50+k), 0, tensor.BF16, n), peerInput(uint64(50+k), 1, tensor.BF16, n)}
		want := hostSum(xs)
		want.Shape = []int{rows, D}
		for r, d := range devs {
			if err := fill(d, rt[r].x, xs[r]); err != nil {
				t.Fatal(err)
			}
			if err := fill(d, rt[r].res, peerInput(uint64(60+k), r, tensor.BF16, n)); err != nil {
				t.Fatal(err)
			}
		}
		err := onRanks(2, func(r int) error {
			d := devs[r]
			if err := d.do(func() error { return exes[r].Launch(d.stream) }); err != nil {
				return err
			}
			// The eager reference, after the replay (same order on both ranks).
			if err := g.Rank(r).AllReduce(rt[r].ar, rt[r].x); err != nil {
				return err
			}
			return AddRMSNorm(d, rt[r].nRef, rt[r].sRef, rt[r].ar, rt[r].res, rt[r].w, 1e-6)
		})
		if err != nil {
			t.Fatal(err)
		}
		for r, d := range devs {
			if err := sameBits(fmt.Sprintf("replay %d rank %d all-reduce", k, r), down(t, d, rt[r].out), want); err != nil {
				t.Error(err)
			}
			if err := sameBits(fmt.Sprintf("replay %d rank %d normed", k, r), down(t, d, rt[r].normed), down(t, d, rt[r].nRef)); err != nil {
				t.Error(err)
			}
			if err := sameBits(fmt.Sprintf("replay %d rank %d sum", k, r), down(t, d, rt[r].sum), down(t, d, rt[r].sRef)); err != nil {
				t.Error(err)
			}
		}
		for r := range devs {
			if err := g.Rank(r).Check(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestPeerTimeout lets only rank 0 call: with a short timeout its kernel gives up, Check
// names rank 1, and later calls return at once.
func TestPeerTimeout(t *testing.T) {
	devs := peerDevs(t)
	g := peerGroup(t, devs, 4096)
	r := g.Rank(0)
	r.params = peerParams(r.bases, r.slot, r.rank, 50*time.Millisecond)
	xh := peerInput(1, 0, tensor.F32, 1000)
	x := up(t, devs[0], xh)[0]
	out := like(t, devs[0], xh)[0]
	start := time.Now()
	for i := range 3 {
		if err := r.AllReduce(out, x); err != nil {
			t.Fatal(err)
		}
		err := r.Check()
		if err == nil || !strings.Contains(err.Error(), "rank 1 did not arrive") {
			t.Fatalf("call %d: Check = %v, want an error naming rank 1", i, err)
		}
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("3 calls took %v; after the first timeout calls should return at once", el)
	}
}

// TestPeerGroupOfOne runs on one GPU: a group of one rank copies, and its fused form equals
// AddRMSNorm. It also checks the argument errors.
func TestPeerGroupOfOne(t *testing.T) {
	d := gpu(t)
	if _, err := NewPeerGroup([]*Device{d, d}, 1024); err == nil || !strings.Contains(err.Error(), "both GPU") {
		t.Errorf("a group of one GPU twice: got %v, want an error naming it", err)
	}
	if _, err := NewPeerGroup([]*Device{d}, 0); err == nil {
		t.Error("maxBytes 0: no error")
	}
	g := peerGroup(t, []*Device{d}, 8192)
	r := g.Rank(0)
	xh := peerInput(1, 0, tensor.BF16, 1000)
	x := up(t, d, xh)[0]
	out := like(t, d, xh)[0]
	if err := r.AllReduce(out, x); err != nil {
		t.Fatal(err)
	}
	if err := sameBits("group of one", down(t, d, out), xh); err != nil {
		t.Error(err)
	}
	big := like(t, d, tensor.New(tensor.F32, 4096))[0]
	f32out := like(t, d, tensor.New(tensor.F32, 1000))[0]
	for _, c := range []struct {
		name     string
		out, x   *Tensor
		contains string
	}{
		{"too big", big, big, "at most 8192"},
		{"dtype", f32out, x, "want bf16"},
	} {
		if err := r.AllReduce(c.out, c.x); err == nil || !strings.Contains(err.Error(), c.contains) || !strings.Contains(err.Error(), "rank 0") {
			t.Errorf("%s: got %v, want an error with %q and the rank", c.name, err, c.contains)
		}
	}
	rows, D := 3, 100
	hs := []*tensor.Tensor{peerInput(2, 0, tensor.BF16, rows*D), peerInput(3, 0, tensor.F32, rows*D), peerInput(4, 0, tensor.BF16, D)}
	u := up(t, d, hs...)
	a := like(t, d, hs[1], hs[1], hs[1], hs[1])
	v := func(x *Tensor) *Tensor { y, _ := x.View(rows, D); return y }
	if err := r.AllReduceAddRMSNorm(v(a[0]), v(a[1]), v(u[0]), v(u[1]), u[2], 1e-5); err != nil {
		t.Fatal(err)
	}
	if err := AddRMSNorm(d, v(a[2]), v(a[3]), v(u[0]), v(u[1]), u[2], 1e-5); err != nil {
		t.Fatal(err)
	}
	if err := sameBits("normed", down(t, d, a[0]), down(t, d, a[2])); err != nil {
		t.Error(err)
	}
	if err := sameBits("sum", down(t, d, a[1]), down(t, d, a[3])); err != nil {
		t.Error(err)
	}
	if err := r.Check(); err != nil {
		t.Fatal(err)
	}
}

// The IPC test runs rank 0 in the test process on GPU 0 and rank 1 in a second process (the
// test binary again, told by peerChildEnv which GPU to use, by PCI bus id), exchanging
// handles through two pipes.
const peerChildEnv = "LOOM_PEER_IPC_CHILD"

// pipeExchange is an Exchange between two processes: length-prefixed messages.
func pipeExchange(rank int, in io.Reader, out io.Writer) Exchange {
	return func(ctx context.Context, mine []byte) ([][]byte, error) {
		var hdr [4]byte
		binary.LittleEndian.PutUint32(hdr[:], uint32(len(mine)))
		if _, err := out.Write(append(hdr[:], mine...)); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(in, hdr[:]); err != nil {
			return nil, err
		}
		theirs := make([]byte, binary.LittleEndian.Uint32(hdr[:]))
		if _, err := io.ReadFull(in, theirs); err != nil {
			return nil, err
		}
		all := make([][]byte, 2)
		all[rank], all[1-rank] = mine, theirs
		return all, nil
	}
}

func TestPeerIPC(t *testing.T) {
	if bus := os.Getenv(peerChildEnv); bus != "" {
		dev, err := cubind.DeviceByPCIBusID(bus)
		if err != nil {
			t.Fatal(err)
		}
		d, err := Open(int(dev))
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		ipcRank(t, d, 1, pipeExchange(1, os.NewFile(3, "from-parent"), os.NewFile(4, "to-parent")))
		return
	}
	devs := peerDevs(t)
	bus, err := devs[1].dev.PCIBusID()
	if err != nil {
		t.Fatal(err)
	}
	toChildR, toChildW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	fromChildR, fromChildW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel) // after the cleanup below, which waits for the child
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestPeerIPC$", "-test.v")
	cmd.Env = append(os.Environ(), peerChildEnv+"="+bus)
	cmd.ExtraFiles = []*os.File{toChildR, fromChildW}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	toChildR.Close()
	fromChildW.Close()
	done := make(chan error, 1)
	t.Cleanup(func() {
		toChildW.Close()
		fromChildR.Close()
		err := <-done
		t.Logf("second process (rank 1 on GPU %s):\n%s", bus, out.String())
		if err != nil {
			t.Errorf("second process: %v", err)
		}
	})
	go func() { done <- cmd.Wait() }()
	ipcRank(t, devs[0], 0, pipeExchange(0, fromChildR, toChildW))
}

// ipcRank is one rank of TestPeerIPC: it checks all-reduces against the host sum (both ranks
// make both inputs from the same seeds), the ranks' agreement through digests, and the fused
// kernel against all-reduce then AddRMSNorm.
func ipcRank(t *testing.T, d *Device, rank int, ex Exchange) {
	ctx := context.Background()
	r, err := NewPeerRankIPC(ctx, d, rank, 2, 4<<20, ex)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		dt tensor.DType
		n  int
	}{{tensor.BF16, 4096}, {tensor.F32, 1000}, {tensor.BF16, 1 << 20}, {tensor.F32, 7}, {tensor.F32, 1 << 20}} {
		xs := []*tensor.Tensor{peerInput(uint64(300+i), 0, c.dt, c.n), peerInput(uint64(300+i), 1, c.dt, c.n)}
		x := up(t, d, xs[rank])[0]
		out := like(t, d, xs[rank])[0]
		if err := r.AllReduce(out, x); err != nil {
			t.Fatal(err)
		}
		got := down(t, d, out)
		if err := sameBits(fmt.Sprintf("rank %d %s[%d]", rank, c.dt, c.n), got, hostSum(xs)); err != nil {
			t.Error(err)
		}
		sum := sha256.Sum256(tensor.Bytes(got))
		all, err := ex(ctx, sum[:])
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(all[0], all[1]) {
			t.Errorf("%s[%d]: the ranks' results differ", c.dt, c.n)
		}
	}
	const rows, D = 2, 4096
	hs := []*tensor.Tensor{peerInput(400, rank, tensor.BF16, rows*D), peerInput(401, rank, tensor.BF16, rows*D), peerInput(402, 0, tensor.BF16, D)}
	u := up(t, d, hs...)
	a := like(t, d, hs[0], hs[0], hs[0], hs[0], hs[0])
	v := func(x *Tensor) *Tensor { y, _ := x.View(rows, D); return y }
	if err := r.AllReduceAddRMSNorm(v(a[0]), v(a[1]), v(u[0]), v(u[1]), u[2], 1e-5); err != nil {
		t.Fatal(err)
	}
	if err := r.AllReduce(a[2], u[0]); err != nil {
		t.Fatal(err)
	}
	if err := AddRMSNorm(d, v(a[3]), v(a[4]), v(a[2]), v(u[1]), u[2], 1e-5); err != nil {
		t.Fatal(err)
	}
	if err := sameBits("fused normed", down(t, d, a[0]), down(t, d, a[3])); err != nil {
		t.Error(err)
	}
	if err := sameBits("fused sum", down(t, d, a[1]), down(t, d, a[4])); err != nil {
		t.Error(err)
	}
	if err := r.Check(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// peerTimer times work queued on several devices at once: run queues the work once as a
// warm-up, then again between two events on each device; the slower device's time divided
// by per is the result.
func peerTimer(devs []*Device, per int, run func(r int) error) (time.Duration, error) {
	el := make([]time.Duration, len(devs))
	var barrier sync.WaitGroup
	barrier.Add(len(devs))
	err := onRanks(len(devs), func(r int) error {
		d := devs[r]
		if err := run(r); err != nil {
			return err
		}
		var start, end cubind.Event
		if err := d.do(func() error {
			var err error
			if start, err = cubind.EventCreate(cubind.EventDefault); err != nil {
				return err
			}
			end, err = cubind.EventCreate(cubind.EventDefault)
			return err
		}); err != nil {
			barrier.Done()
			return err
		}
		defer start.Destroy()
		defer end.Destroy()
		err := d.Sync()
		barrier.Done()
		barrier.Wait()
		if err != nil {
			return err
		}
		if err := d.do(func() error { return start.Record(d.stream) }); err != nil {
			return err
		}
		if err := run(r); err != nil {
			return err
		}
		if err := d.do(func() error { return end.Record(d.stream) }); err != nil {
			return err
		}
		if err := end.Synchronize(); err != nil {
			return err
		}
		el[r], err = cubind.Elapsed(start, end)
		return err
	})
	return slices.Max(el) / time.Duration(per), err
}

// peerGraphs captures f(r) on every rank's device and returns the run function of peerTimer
// that launches each rank's graph `launches` times.
func peerGraphs(t *testing.T, g *PeerGroup, launches int, f func(r int) error) func(r int) error {
	t.Helper()
	exes := make([]cubind.GraphExec, g.Size())
	for r := range exes {
		exe, err := capturePeer(g.Rank(r), func() error { return f(r) })
		if err != nil {
			t.Fatalf("rank %d: capture: %v", r, err)
		}
		exes[r] = exe
		t.Cleanup(func() { exe.Destroy() })
	}
	return func(r int) error {
		d := g.Rank(r).dev
		return d.do(func() error {
			for range launches {
				if err := exes[r].Launch(d.stream); err != nil {
					return err
				}
			}
			return nil
		})
	}
}

// TestPeerLatency prints the per-call time of the one-shot all-reduce on 2 GPUs when
// LOOM_CUDA_TIMINGS=1: back-to-back eager calls, and calls replayed from CUDA graphs of 100
// (no launch cost from the host), timed with GPU events on each rank (the slower rank
// counts). For reference it also times a group of one GPU (no NVLink: the floor of launch,
// copy and barrier) and all-reduce then AddRMSNorm unfused.
func TestPeerLatency(t *testing.T) {
	devs := peerDevs(t)
	if os.Getenv("LOOM_CUDA_TIMINGS") != "1" {
		t.Skip("set LOOM_CUDA_TIMINGS=1 to time the peer all-reduce")
	}
	g := peerGroup(t, devs, 16<<20)
	one := peerGroup(t, devs[:1], 16<<20)
	const perGraph, launches = 100, 5
	us := func(d time.Duration) string { return fmt.Sprintf("%8.2f", float64(d.Nanoseconds())/1e3) }
	fail := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	var report strings.Builder
	fmt.Fprintf(&report, "\none-shot all-reduce, 2 GPUs (%s), bf16, µs per call (graph: CUDA graph of %d calls; t=N: N threads per block)\n", devs[0].Info().Name, perGraph)
	fmt.Fprintf(&report, "%10s %8s %8s %8s %8s %8s %8s %8s %10s %10s\n", "bytes", "eager", "graph", "t=128", "t=256", "t=512", "t=1024", "1 GPU", "threads", "GB/s(alg)")
	for _, bytes := range []int{8 << 10, 32 << 10, 128 << 10, 512 << 10, 2 << 20, 16 << 20} {
		n := bytes / 2
		x, out := make([]*Tensor, 2), make([]*Tensor, 2)
		for r, d := range devs {
			x[r] = up(t, d, peerInput(uint64(bytes), r, tensor.BF16, n))[0]
			out[r] = like(t, d, tensor.New(tensor.BF16, n))[0]
		}
		calls := 200
		if bytes >= 2<<20 {
			calls = 50
		}
		eager, err := peerTimer(devs, calls, func(r int) error {
			for range calls {
				if err := g.Rank(r).AllReduce(out[r], x[r]); err != nil {
					return err
				}
			}
			return nil
		})
		fail("eager", err)
		row := []string{us(eager)}
		var auto time.Duration
		for _, th := range []int{0, 128, 256, 512, 1024} {
			if th != 0 && bytes > 128<<10 {
				row = append(row, fmt.Sprintf("%8s", "-"))
				continue
			}
			run := peerGraphs(t, g, launches, func(r int) error {
				p := g.Rank(r)
				p.threads = th
				defer func() { p.threads = 0 }()
				for range perGraph {
					if err := p.allReduce(out[r], x[r]); err != nil {
						return err
					}
				}
				return nil
			})
			el, err := peerTimer(devs, perGraph*launches, run)
			fail(fmt.Sprintf("graph of %d bytes, %d threads", bytes, th), err)
			if th == 0 {
				auto = el
			}
			row = append(row, us(el))
		}
		solo, err := peerTimer(devs[:1], perGraph*launches, peerGraphs(t, one, launches, func(int) error {
			for range perGraph {
				if err := one.Rank(0).allReduce(out[0], x[0]); err != nil {
					return err
				}
			}
			return nil
		}))
		fail("one GPU", err)
		row = append(row, us(solo))
		fmt.Fprintf(&report, "%10d %s %10d %10.1f\n", bytes, strings.Join(row, " "), peerBlockSize(int64(n/8)), float64(bytes)/auto.Seconds()/1e9)
	}
	for r := range devs {
		fail("check", g.Rank(r).Check())
	}
	fmt.Fprintf(&report, "\nall_reduce_add_rmsnorm bf16 [rows, 4096], µs per call\n%10s %8s %8s %10s %8s\n", "rows", "eager", "graph", "unfused", "1 GPU")
	for _, rows := range []int{1, 8, 64} {
		const D = 4096
		n := rows * D
		type rankTensors struct{ x, res, w, normed, sum, ar *Tensor }
		rt := make([]rankTensors, 2)
		v := func(x *Tensor) *Tensor { y, _ := x.View(rows, D); return y }
		for r, d := range devs {
			u := up(t, d, peerInput(uint64(rows), r, tensor.BF16, n), peerInput(uint64(rows+1), r, tensor.BF16, n), peerInput(7, 0, tensor.BF16, D))
			a := like(t, d, tensor.New(tensor.BF16, n), tensor.New(tensor.BF16, n), tensor.New(tensor.BF16, n))
			rt[r] = rankTensors{x: v(u[0]), res: v(u[1]), w: u[2], normed: v(a[0]), sum: v(a[1]), ar: v(a[2])}
		}
		const calls = 200
		fused := func(p *PeerRank, x rankTensors) error {
			return p.allReduceAddRMSNorm(x.normed, x.sum, x.x, x.res, x.w, 1e-5)
		}
		eager, err := peerTimer(devs, calls, func(r int) error {
			for range calls {
				if err := g.Rank(r).AllReduceAddRMSNorm(rt[r].normed, rt[r].sum, rt[r].x, rt[r].res, rt[r].w, 1e-5); err != nil {
					return err
				}
			}
			return nil
		})
		fail("fused eager", err)
		graph, err := peerTimer(devs, perGraph*launches, peerGraphs(t, g, launches, func(r int) error {
			for range perGraph {
				if err := fused(g.Rank(r), rt[r]); err != nil {
					return err
				}
			}
			return nil
		}))
		fail("fused graph", err)
		unfused, err := peerTimer(devs, perGraph*launches, peerGraphs(t, g, launches, func(r int) error {
			p, x := g.Rank(r), rt[r]
			for range perGraph {
				if err := p.allReduce(x.ar, x.x); err != nil {
					return err
				}
				if err := addRMSNorm(p.dev, x.normed, x.sum, x.ar, x.res, x.w, 1e-5); err != nil {
					return err
				}
			}
			return nil
		}))
		fail("unfused graph", err)
		solo, err := peerTimer(devs[:1], perGraph*launches, peerGraphs(t, one, launches, func(int) error {
			for range perGraph {
				if err := fused(one.Rank(0), rt[0]); err != nil {
					return err
				}
			}
			return nil
		}))
		fail("fused one GPU", err)
		fmt.Fprintf(&report, "%10d %s %s %10s %s\n", rows, us(eager), us(graph), us(unfused), us(solo))
	}
	for r := range devs {
		fail("check", g.Rank(r).Check())
	}
	fmt.Print(report.String())
}

// TestPeerKernelsCompile compiles allreduce.cu for sm_90 where NVRTC loads, GPU or not.
func TestPeerKernelsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("compiling takes seconds; skipped with -short")
	}
	_, _, err := cubind.NVRTCVersion()
	gputest.Missing(t, "NVRTC", err)
	c := compiler{arch: "sm_90"}
	if _, _, err := c.cubin("allreduce.cu", ""); err != nil {
		t.Fatal(err)
	}
	// The kernels of decode steps keep everything in registers: an argument struct indexed by
	// a run-time rank, or arrays too big for 64 registers (launch bounds 1024), go to local
	// memory, whose latency lands on the critical path of every call.
	usage := ptxasUsage(t, "allreduce.cu", "", "sm_90")
	for name := range usage {
		if !strings.HasPrefix(name, "allreduce_") && !strings.HasSuffix(name, "_vec") {
			delete(usage, name) // the loop form of all_reduce_add_rmsnorm: rows no decode step has
		}
	}
	checkNoSpills(t, usage)
	if len(usage) != 2+8 {
		t.Errorf("checked %d kernels in the ptxas report, want 10: %v", len(usage), slices.Sorted(maps.Keys(usage)))
	}
}

// TestPeerConstantsMatchKernels checks the constants peer.go and kernels/allreduce.cu both
// state (the layout of a rank's allocation, the limits, the empty mark), read from the
// kernel source's #defines.
func TestPeerConstantsMatchKernels(t *testing.T) {
	src, err := kernelFS.ReadFile("kernels/allreduce.cu")
	if err != nil {
		t.Fatal(err)
	}
	defines := map[string]uint64{}
	for _, line := range strings.Split(string(src), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "#define" {
			continue
		}
		if v, err := strconv.ParseUint(strings.TrimSuffix(f[2], "u"), 0, 64); err == nil {
			defines[f[1]] = v
		}
	}
	for _, c := range []struct {
		define string
		goVal  uint64
	}{
		{"AR_MAX_RANKS", PeerMaxRanks},
		{"AR_MAX_BLOCKS", peerMaxBlocks},
		{"AR_DATA_OFFSET", peerDataOffset},
		{"AR_BUFFERS", peerBuffers},
		{"AR_EMPTY32", peerEmpty},
	} {
		if v, ok := defines[c.define]; !ok || v != c.goVal {
			t.Errorf("allreduce.cu: %s = %d (defined: %v), peer.go has %d", c.define, v, ok, c.goVal)
		}
	}
}

// TestPeerDesc checks the exchanged description's round trip and the kernel argument layout.
func TestPeerDesc(t *testing.T) {
	p := peerDesc{rank: 1, size: 2, maxBytes: 1 << 20, pid: 4242, busID: "0000:19:00.0"}
	for i := range p.handle.Reserved {
		p.handle.Reserved[i] = byte(i * 7)
	}
	b := p.encode()
	q, err := decodePeerDesc(b)
	if err != nil {
		t.Fatal(err)
	}
	if q != p {
		t.Errorf("round trip: got %+v, want %+v", q, p)
	}
	for _, bad := range [][]byte{nil, b[:len(b)-1], append([]byte("x"), b[1:]...)} {
		if _, err := decodePeerDesc(bad); err == nil {
			t.Errorf("decode of %d bad bytes: no error", len(bad))
		}
	}
	args := peerParams([]cubind.DevicePtr{0x1000000, 0x2000000}, 512, 1, time.Second)
	if len(args) != peerArgsBytes || peerArgsBytes != 96 {
		t.Fatalf("PeerArgs is %d bytes (const %d), want 96", len(args), peerArgsBytes)
	}
	le := binary.LittleEndian
	for _, f := range []struct {
		name      string
		off       int
		got, want uint64
	}{
		{"data[1]", 8, le.Uint64(args[8:]), 0x2000000 + peerDataOffset},
		{"data[2]", 16, le.Uint64(args[16:]), 0},
		{"ctl", 64, le.Uint64(args[64:]), 0x2000000},
		{"slot", 72, le.Uint64(args[72:]), 512},
		{"timeout_ns", 80, le.Uint64(args[80:]), 1e9},
		{"rank", 88, uint64(le.Uint32(args[88:])), 1},
		{"nranks", 92, uint64(le.Uint32(args[92:])), 2},
	} {
		if f.got != f.want {
			t.Errorf("%s at %d = %#x, want %#x", f.name, f.off, f.got, f.want)
		}
	}
}
