package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

func TestEmbedding(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(1, 1))
	for _, tc := range []struct {
		tab, out, ids tensor.DType
		V, D          int
		idShape       []int
	}{
		{tensor.BF16, tensor.BF16, tensor.I32, 37, 67, []int{2, 5}},
		{tensor.BF16, tensor.F32, tensor.I32, 512, 64, []int{3, 11}},
		{tensor.F32, tensor.F32, tensor.I64, 50, 1000, []int{1, 7}},
		{tensor.BF16, tensor.BF16, tensor.I64, 1000, 4096, []int{2, 33}},
		{tensor.F32, tensor.BF16, tensor.I32, 5, 3, []int{1}},
	} {
		name := fmt.Sprintf("%s[%d,%d] ids %s%v -> %s", tc.tab, tc.V, tc.D, tc.ids, tc.idShape, tc.out)
		tab := randTensor(rng, tc.tab, []int{tc.V, tc.D}, -2, 2)
		ids := randInts(rng, tc.ids, tc.idShape, tc.V)
		want := cpuOp(t, "embedding", nil, tab, ids)[0].Cast(tc.out)
		in := up(t, d, tab, ids)
		out := like(t, d, want)
		if err := Embedding(d, out[0], in[0], in[1]); err != nil {
			t.Fatal(err)
		}
		compare(t, "embedding", name, down(t, d, out[0]), want, exact)
	}
	// An id out of range is reported by the next Sync, which then clears it.
	tab := randTensor(rng, tensor.BF16, []int{4, 8}, -1, 1)
	ids := tensor.FromI32([]int32{1, 4, 2}, 3)
	in := up(t, d, tab, ids)
	out := like(t, d, tensor.New(tensor.BF16, 3, 8))
	if err := Embedding(d, out[0], in[0], in[1]); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err == nil || !strings.Contains(err.Error(), "id 4 (at position 1) is out of range") {
		t.Errorf("Sync after a bad id: %v", err)
	}
	if err := d.Sync(); err != nil {
		t.Errorf("second Sync: %v", err)
	}
	// Shape errors are errors.
	if err := Embedding(d, out[0], in[0], in[0]); err == nil {
		t.Error("embedding with bf16 ids succeeded")
	}
}

func TestRMSNorm(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(2, 2))
	for _, shape := range [][]int{{1, 1}, {3, 7}, {2, 5, 64}, {4, 1000}, {2, 4096}, {3, 2, 4, 128}} {
		for _, dt := range [][2]tensor.DType{{tensor.F32, tensor.F32}, {tensor.F32, tensor.BF16}, {tensor.BF16, tensor.BF16}, {tensor.BF16, tensor.F32}} {
			x := randTensor(rng, dt[0], shape, -3, 3)
			w := randTensor(rng, dt[1], shape[len(shape)-1:], 0.5, 1.5)
			attrs := graph.Attrs{"eps": 1e-5}
			want := cpuOp(t, "rmsnorm", attrs, x, w)[0]
			in := up(t, d, x, w)
			out := like(t, d, want)
			if err := RMSNorm(d, out[0], in[0], in[1], 1e-5); err != nil {
				t.Fatal(err)
			}
			compare(t, "rmsnorm", fmt.Sprintf("x %s%v w %s", dt[0], shape, dt[1]), down(t, d, out[0]), want, tolFor(want.DType))
		}
	}
}

func TestAddRMSNorm(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(3, 3))
	for _, shape := range [][]int{{1, 1}, {3, 7}, {2, 5, 64}, {2, 4096}, {7, 1000}} {
		for _, dt := range [][3]tensor.DType{
			{tensor.F32, tensor.F32, tensor.BF16}, {tensor.BF16, tensor.BF16, tensor.BF16},
			{tensor.F32, tensor.BF16, tensor.F32}, {tensor.BF16, tensor.F32, tensor.BF16}, {tensor.F32, tensor.F32, tensor.F32},
		} {
			x := randTensor(rng, dt[0], shape, -2, 2)
			r := randTensor(rng, dt[1], shape, -2, 2)
			w := randTensor(rng, dt[2], shape[len(shape)-1:], 0.5, 1.5)
			want := cpuOp(t, "add_rmsnorm", graph.Attrs{"eps": 1e-6}, x, r, w)
			in := up(t, d, x, r, w)
			out := like(t, d, want...)
			if err := AddRMSNorm(d, out[0], out[1], in[0], in[1], in[2], 1e-6); err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("x %s%v r %s w %s", dt[0], shape, dt[1], dt[2])
			compare(t, "add_rmsnorm", name+" normed", down(t, d, out[0]), want[0], tolFor(want[0].DType))
			compare(t, "add_rmsnorm", name+" sum", down(t, d, out[1]), want[1], exact)
		}
	}
}

func invFreqs(D int, theta float64) []float64 {
	inv := make([]float64, D/2)
	for i := range inv {
		inv[i] = float64(float32(1 / math.Pow(theta, float64(2*i)/float64(D))))
	}
	return inv
}

func TestRope(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(4, 4))
	for _, tc := range []struct {
		B, H, KV, S, D int
		scaling        float64
		pos            tensor.DType
	}{
		{1, 1, 1, 1, 2, 1, tensor.I32},
		{2, 4, 2, 9, 16, 1, tensor.I32},
		{1, 6, 1, 13, 64, 0.7, tensor.I64},
		{2, 8, 4, 33, 128, 1, tensor.I32},
	} {
		for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
			q := randTensor(rng, dt, []int{tc.B, tc.H, tc.S, tc.D}, -2, 2)
			k := randTensor(rng, dt, []int{tc.B, tc.KV, tc.S, tc.D}, -2, 2)
			pos := randInts(rng, tc.pos, []int{tc.B, tc.S}, 5000)
			inv := invFreqs(tc.D, 10000)
			want := cpuOp(t, "rope", graph.Attrs{"inv_freq": inv, "scaling": tc.scaling}, q, k, pos)
			f := make([]float32, len(inv))
			for i, v := range inv {
				f[i] = float32(v)
			}
			in := up(t, d, q, k, pos, tensor.FromF32(f, len(f)))
			out := like(t, d, want...)
			if err := Rope(d, out[0], out[1], in[0], in[1], in[2], in[3], float32(tc.scaling)); err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("%s B%d H%d KV%d S%d D%d scaling %g pos %s", dt, tc.B, tc.H, tc.KV, tc.S, tc.D, tc.scaling, tc.pos)
			tl := tolFor(dt)
			if dt == tensor.BF16 {
				tl.atol = 1.0 / 128 // x1*c - x2*s: one ulp of the terms, not of the difference
			}
			compare(t, "rope", name+" q", down(t, d, out[0]), want[0], tl)
			compare(t, "rope", name+" k", down(t, d, out[1]), want[1], tl)
		}
	}
}

func TestSwiGLU(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(5, 5))
	for _, shape := range [][]int{{7}, {3, 1001}, {2, 3, 4096}} {
		for _, dt := range [][2]tensor.DType{{tensor.F32, tensor.F32}, {tensor.BF16, tensor.BF16}, {tensor.BF16, tensor.F32}} {
			g := randTensor(rng, dt[0], shape, -6, 6)
			u := randTensor(rng, dt[1], shape, -2, 2)
			want := cpuOp(t, "swiglu", nil, g, u)[0]
			in := up(t, d, g, u)
			out := like(t, d, want)
			if err := SwiGLU(d, out[0], in[0], in[1]); err != nil {
				t.Fatal(err)
			}
			compare(t, "swiglu", fmt.Sprintf("gate %s%v up %s", dt[0], shape, dt[1]), down(t, d, out[0]), want, tolFor(want.DType))
		}
	}
}

func TestAddMul(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(6, 6))
	for _, sh := range [][2][]int{
		{{5, 7}, {5, 7}}, {{3, 1, 5}, {4, 1}}, {{2, 3, 4}, {4}}, {{}, {2, 3}}, {{1}, {3}}, {{2, 1, 3, 1, 5}, {1, 4, 1, 6, 1}}, {{1000, 257}, {1000, 257}},
	} {
		for _, dt := range [][2]tensor.DType{{tensor.F32, tensor.F32}, {tensor.BF16, tensor.BF16}, {tensor.F32, tensor.BF16}, {tensor.BF16, tensor.F32}} {
			a := randTensor(rng, dt[0], sh[0], -3, 3)
			b := randTensor(rng, dt[1], sh[1], -3, 3)
			for _, op := range []string{"add", "mul"} {
				want := cpuOp(t, op, nil, a, b)[0]
				in := up(t, d, a, b)
				out := like(t, d, want)
				f := Add
				if op == "mul" {
					f = Mul
				}
				if err := f(d, out[0], in[0], in[1]); err != nil {
					t.Fatal(err)
				}
				compare(t, op, fmt.Sprintf("%s%v %s%v", dt[0], sh[0], dt[1], sh[1]), down(t, d, out[0]), want, exact)
			}
		}
	}
}

func TestCopies(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(7, 7))
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.I32} {
		x := randTensor(rng, tensor.F32, []int{2, 3, 4, 5}, -100, 100).Cast(dt)
		run := func(op string, attrs graph.Attrs, f func(out, x *Tensor) error) {
			t.Helper()
			want := cpuOp(t, op, attrs, x)[0]
			in := up(t, d, x)
			out := like(t, d, want)
			if err := f(out[0], in[0]); err != nil {
				t.Fatalf("%s: %v", op, err)
			}
			compare(t, op, fmt.Sprintf("%s%v %v", dt, x.Shape, attrs), down(t, d, out[0]), want, exact)
		}
		for _, perm := range [][]int{{0, 2, 1, 3}, {3, 1, 0, 2}, {0, 1, 3, 2}} {
			run("transpose", graph.Attrs{"perm": perm}, func(out, x *Tensor) error { return Transpose(d, out, x, perm) })
		}
		run("slice", graph.Attrs{"axis": -1, "start": 1, "end": 5, "step": 2}, func(out, x *Tensor) error { return Slice(d, out, x, 3, 1, 5, 2) })
		run("slice", graph.Attrs{"axis": 1, "start": 1, "end": 3}, func(out, x *Tensor) error { return Slice(d, out, x, 1, 1, 3, 1) })
		if dt != tensor.I32 {
			other := tensor.F32
			if dt == tensor.F32 {
				other = tensor.BF16
			}
			run("cast", graph.Attrs{"dtype": other}, func(out, x *Tensor) error { return Cast(d, out, x) })
		}
		y := randTensor(rng, tensor.F32, []int{2, 1, 4, 5}, -9, 9).Cast(dt)
		want := cpuOp(t, "concat", graph.Attrs{"axis": 1}, x, y, x)[0]
		in := up(t, d, x, y)
		out := like(t, d, want)
		if err := Concat(d, out[0], 1, in[0], in[1], in[0]); err != nil {
			t.Fatal(err)
		}
		compare(t, "concat", fmt.Sprintf("%s axis 1", dt), down(t, d, out[0]), want, exact)

		e := randTensor(rng, tensor.F32, []int{2, 1, 3, 1}, -9, 9).Cast(dt)
		want = cpuOp(t, "expand", graph.Attrs{"shape": graph.Dims(2, 4, 3, 5)}, e)[0]
		in = up(t, d, e)
		out = like(t, d, want)
		if err := Expand(d, out[0], in[0]); err != nil {
			t.Fatal(err)
		}
		compare(t, "expand", fmt.Sprintf("%s [2,1,3,1] -> [2,4,3,5]", dt), down(t, d, out[0]), want, exact)

		want = cpuOp(t, "repeat_kv", graph.Attrs{"n": 3}, x)[0]
		in = up(t, d, x)
		out = like(t, d, want)
		if err := repeatKVLocked(d, out[0], in[0], 3); err != nil {
			t.Fatal(err)
		}
		compare(t, "repeat_kv", fmt.Sprintf("%s n=3", dt), down(t, d, out[0]), want, exact)
	}
}

// repeatKVLocked runs repeatKV with the device locked, for tests.
func repeatKVLocked(d *Device, out, x *Tensor, n int) error {
	return d.do(func() error { return repeatKV(d, out, x, n) })
}

func TestSDPA(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(8, 8))
	for _, tc := range []struct {
		B, H, KV, S, D, window int
		posStep                int // positions advance by this much per token
		pos                    tensor.DType
	}{
		{1, 1, 1, 1, 16, 0, 1, tensor.I32},
		{1, 4, 4, 17, 16, 0, 1, tensor.I32},     // GQA ratio 1
		{2, 4, 2, 37, 16, 0, 1, tensor.I32},     // ratio 2, two sequences at different offsets
		{1, 8, 2, 65, 64, 0, 1, tensor.I64},     // ratio 4
		{2, 6, 1, 50, 32, 0, 1, tensor.I32},     // ratio 6
		{1, 12, 2, 130, 128, 17, 1, tensor.I32}, // ratio 6, sliding window
		{1, 2, 1, 33, 80, 5, 1, tensor.I32},     // D=80: three values per lane
		{1, 2, 2, 20, 256, 0, 1, tensor.I32},    // D=256: more than 48 KiB of shared memory
		{1, 4, 2, 40, 128, 7, 2, tensor.I32},    // positions with gaps, window in position units
		{3, 6, 6, 5, 96, 0, 1, tensor.I64},
	} {
		for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
			q := randTensor(rng, dt, []int{tc.B, tc.H, tc.S, tc.D}, -2, 2)
			k := randTensor(rng, dt, []int{tc.B, tc.KV, tc.S, tc.D}, -2, 2)
			v := randTensor(rng, dt, []int{tc.B, tc.KV, tc.S, tc.D}, -1, 1)
			pos := tensor.New(tc.pos, tc.B, tc.S)
			for b := range tc.B {
				for s := range tc.S {
					p := 3*b + s*tc.posStep // each sequence starts at its own offset
					if tc.pos == tensor.I64 {
						pos.I64[b*tc.S+s] = int64(p)
					} else {
						pos.I32[b*tc.S+s] = int32(p)
					}
				}
			}
			scale := 1 / math.Sqrt(float64(tc.D))
			want := cpuOp(t, "sdpa", graph.Attrs{"scale": scale, "window": tc.window}, q, k, v, pos)[0]
			in := up(t, d, q, k, v, pos)
			out := like(t, d, want)
			if err := SDPA(d, out[0], in[0], in[1], in[2], in[3], float32(scale), tc.window); err != nil {
				t.Fatal(err)
			}
			tl := tol{atol: 2e-5, rtol: 1e-4}
			if dt == tensor.BF16 {
				tl = tol{atol: 1.0 / 128, rtol: 1.0 / 128}
			}
			name := fmt.Sprintf("%s B%d H%d KV%d S%d D%d window %d step %d", dt, tc.B, tc.H, tc.KV, tc.S, tc.D, tc.window, tc.posStep)
			compare(t, "sdpa", name, down(t, d, out[0]), want, tl)
		}
	}
}

func TestArgmax(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(9, 9))
	for _, tc := range []struct {
		dt    tensor.DType
		shape []int
	}{
		{tensor.F32, []int{4, 50000}},
		{tensor.BF16, []int{2, 3, 7}},
		{tensor.BF16, []int{5, 128256}},
		{tensor.F32, []int{1, 1}},
	} {
		x := randTensor(rng, tensor.F32, tc.shape, -4, 4)
		V := tc.shape[len(tc.shape)-1]
		if tc.shape[0] == 4 { // planted ties and NaNs
			x.F32[100], x.F32[40000] = 9, 9                     // row 0: a tie, the first wins
			x.F32[V] = float32(math.NaN())                      // row 1 starts with NaN: 0
			x.F32[2*V+7], x.F32[2*V+9] = float32(math.NaN()), 8 // row 2: NaN never wins
		}
		x = x.Cast(tc.dt)
		rows := x.Numel() / V
		want := tensor.New(tensor.I32, tc.shape[:len(tc.shape)-1]...)
		all := x.Float32s()
		for r := range rows {
			want.I32[r] = int32(sample.Argmax(all[r*V : (r+1)*V]))
		}
		in := up(t, d, x)
		out := like(t, d, want)
		if err := Argmax(d, out[0], in[0]); err != nil {
			t.Fatal(err)
		}
		compare(t, "argmax", fmt.Sprintf("%s%v", tc.dt, tc.shape), down(t, d, out[0]), want, exact)
	}
}

func TestLinear(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(10, 10))
	for _, tc := range []struct {
		xShape []int
		N      int
	}{
		{[]int{1, 33}, 7}, {[]int{5, 96}, 64}, {[]int{37, 65}, 129}, {[]int{2, 64, 1024}, 512}, {[]int{3, 1}, 1}, {[]int{1, 1, 4096}, 1000},
	} {
		for _, dt := range [][2]tensor.DType{{tensor.BF16, tensor.BF16}, {tensor.F32, tensor.F32}, {tensor.F32, tensor.BF16}} {
			K := tc.xShape[len(tc.xShape)-1]
			x := randTensor(rng, dt[0], tc.xShape, -1, 1)
			w := randTensor(rng, dt[1], []int{tc.N, K}, -1, 1)
			want := cpuOp(t, "linear", nil, x, w)[0]
			// m = Σ|x·w| per output element
			xs, ws := x.Float32s(), w.Float32s()
			M := x.Numel() / K
			mag := make([]float64, M*tc.N)
			for m := range M {
				for n := range tc.N {
					s := 0.0
					for k := range K {
						s += math.Abs(float64(xs[m*K+k]) * float64(ws[n*K+k]))
					}
					mag[m*tc.N+n] = s
				}
			}
			in := up(t, d, x, w)
			out := like(t, d, want)
			if err := Linear(d, out[0], in[0], in[1]); err != nil {
				t.Fatal(err)
			}
			got := down(t, d, out[0])
			tl := tol{rtol: 1e-5, scale: mag}
			switch {
			case dt[0] == tensor.BF16:
				sc := make([]float64, len(mag))
				for i := range sc {
					sc[i] = math.Abs(want.At(i)) + 1e-5*mag[i]*128
				}
				tl = tol{rtol: 1.0 / 128, scale: sc}
			case dt[1] == tensor.BF16:
				tl = tol{rtol: 1.0 / 256, scale: mag}
			}
			compare(t, "linear", fmt.Sprintf("x %s%v w %s[%d,%d]", dt[0], tc.xShape, dt[1], tc.N, K), got, want, tl)
		}
	}
	// A wrong output shape is an error that names the op.
	x, w := randTensor(rng, tensor.BF16, []int{2, 8}, -1, 1), randTensor(rng, tensor.BF16, []int{3, 8}, -1, 1)
	in := up(t, d, x, w)
	out := like(t, d, tensor.New(tensor.BF16, 2, 4))
	if err := Linear(d, out[0], in[0], in[1]); err == nil || !strings.Contains(err.Error(), "linear") {
		t.Errorf("linear into a wrong shape: %v", err)
	}
}

func TestKernelCache(t *testing.T) {
	d := gpu(t)
	c := compiler{arch: d.info.Arch, nvrtc: d.info.NVRTC, dir: t.TempDir()}
	first, st1, err := c.cubin("argmax.cu", "")
	if err != nil {
		t.Fatal(err)
	}
	second, st2, err := c.cubin("argmax.cu", "")
	if err != nil {
		t.Fatal(err)
	}
	if st1.Cached || !st2.Cached || string(first) != string(second) {
		t.Errorf("cache: first cached=%v, second cached=%v, equal=%v", st1.Cached, st2.Cached, string(first) == string(second))
	}
	t.Logf("argmax.cu: compiled in %v, read from the cache in %v", st1.Elapsed, st2.Elapsed)
}

// view is a device tensor of dtype dt and shape at element off of x's memory (which must
// hold it), for tests of operands at odd addresses.
func view(x *Tensor, dt tensor.DType, off int, shape ...int) *Tensor {
	return &Tensor{DType: dt, Shape: shape, ptr: x.ptr + cubind.DevicePtr(off*dt.Size()), dev: x.dev}
}

// poisoned allocates device tensors like the host ones, filled with 0xff bytes (NaN in
// f32 and bf16), so that an element a kernel fails to write shows in a comparison.
func poisoned(t *testing.T, d *Device, hs ...*tensor.Tensor) []*Tensor {
	t.Helper()
	out := like(t, d, hs...)
	for _, x := range out {
		if err := d.do(func() error { return cubind.MemsetD8Async(x.ptr, 0xff, uint64(x.Bytes()), d.stream) }); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// The strided copies' fast paths (vectors of up to 16 bytes, 32-bit index math) and the
// general kernels match the CPU bit for bit: transposes of long, short and odd rows,
// slices and concatenations whose offsets allow only narrower vectors or none, expands,
// casts of even and odd rows, and copies from addresses off the vectors' alignment.
func TestFastCopies(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { forceGeneralCopy = false })
	rng := rand.New(rand.NewPCG(31, 7))
	type copyCase struct {
		name string
		want *tensor.Tensor
		run  func(out *Tensor) error
	}
	var cases []copyCase
	transpose := func(dt tensor.DType, shape, perm []int) {
		x := randTensor(rng, tensor.F32, shape, -100, 100).Cast(dt)
		in := up(t, d, x)[0]
		cases = append(cases, copyCase{fmt.Sprintf("transpose %s%v %v", dt, shape, perm),
			cpuOp(t, "transpose", graph.Attrs{"perm": perm}, x)[0],
			func(out *Tensor) error { return Transpose(d, out, in, perm) }})
	}
	transpose(tensor.BF16, []int{1, 1024, 32, 128}, []int{0, 2, 1, 3})
	transpose(tensor.BF16, []int{2, 33, 4, 40}, []int{0, 2, 1, 3})
	transpose(tensor.BF16, []int{3, 5, 7, 9}, []int{0, 2, 1, 3})
	transpose(tensor.BF16, []int{3, 5, 6, 4}, []int{2, 0, 1, 3})
	transpose(tensor.F32, []int{4, 6, 8, 12}, []int{0, 2, 1, 3})
	transpose(tensor.F32, []int{4, 6, 5}, []int{2, 1, 0})
	transpose(tensor.I32, []int{7, 9, 6}, []int{1, 0, 2})
	x := randTensor(rng, tensor.F32, []int{4, 6, 24}, -100, 100).Cast(tensor.BF16)
	xin := up(t, d, x)[0]
	for _, sl := range [][4]int{{2, 1, 17, 1}, {2, 8, 24, 1}, {2, 4, 20, 1}, {2, 2, 18, 1}, {1, 1, 6, 2}, {2, 0, 24, 3}} {
		cases = append(cases, copyCase{fmt.Sprintf("slice bf16%v axis %d [%d:%d:%d]", x.Shape, sl[0], sl[1], sl[2], sl[3]),
			cpuOp(t, "slice", graph.Attrs{"axis": sl[0], "start": sl[1], "end": sl[2], "step": sl[3]}, x)[0],
			func(out *Tensor) error { return Slice(d, out, xin, sl[0], sl[1], sl[2], sl[3]) }})
	}
	for _, widths := range [][]int{{5, 11}, {8, 8, 16}, {3, 4, 7}} {
		var hs []*tensor.Tensor
		var ins []*Tensor
		for _, w := range widths {
			h := randTensor(rng, tensor.F32, []int{3, 4, w}, -9, 9).Cast(tensor.BF16)
			hs = append(hs, h)
			ins = append(ins, up(t, d, h)[0])
		}
		cases = append(cases, copyCase{fmt.Sprintf("concat bf16 widths %v on the last axis", widths),
			cpuOp(t, "concat", graph.Attrs{"axis": 2}, hs...)[0],
			func(out *Tensor) error { return Concat(d, out, 2, ins...) }})
	}
	{ // fused weights: rows of 512 from three matrices
		var hs []*tensor.Tensor
		var ins []*Tensor
		for _, rows := range []int{64, 16, 16} {
			h := randTensor(rng, tensor.F32, []int{rows, 512}, -1, 1).Cast(tensor.BF16)
			hs = append(hs, h)
			ins = append(ins, up(t, d, h)[0])
		}
		cases = append(cases, copyCase{"concat bf16 [64,512] [16,512] [16,512] on axis 0",
			cpuOp(t, "concat", graph.Attrs{"axis": 0}, hs...)[0],
			func(out *Tensor) error { return Concat(d, out, 0, ins...) }})
	}
	for _, dt := range []tensor.DType{tensor.BF16, tensor.F32} {
		e := randTensor(rng, tensor.F32, []int{2, 1, 3, 1}, -9, 9).Cast(dt)
		ein := up(t, d, e)[0]
		cases = append(cases, copyCase{fmt.Sprintf("expand %s [2,1,3,1] -> [2,4,3,5]", dt),
			cpuOp(t, "expand", graph.Attrs{"shape": graph.Dims(2, 4, 3, 5)}, e)[0],
			func(out *Tensor) error { return Expand(d, out, ein) }})
		e2 := randTensor(rng, tensor.F32, []int{3, 1, 16}, -9, 9).Cast(dt)
		e2in := up(t, d, e2)[0]
		cases = append(cases, copyCase{fmt.Sprintf("expand %s [3,1,16] -> [3,5,16]", dt),
			cpuOp(t, "expand", graph.Attrs{"shape": graph.Dims(3, 5, 16)}, e2)[0],
			func(out *Tensor) error { return Expand(d, out, e2in) }})
	}
	for _, c := range []struct {
		from, to tensor.DType
		shape    []int
	}{
		{tensor.BF16, tensor.F32, []int{64, 1000}}, {tensor.F32, tensor.BF16, []int{64, 1000}},
		{tensor.F32, tensor.BF16, []int{3, 7}}, {tensor.BF16, tensor.F32, []int{5, 6}},
	} {
		h := randTensor(rng, tensor.F32, c.shape, -300, 300).Cast(c.from)
		hin := up(t, d, h)[0]
		cases = append(cases, copyCase{fmt.Sprintf("cast %s%v -> %s", c.from, c.shape, c.to),
			cpuOp(t, "cast", graph.Attrs{"dtype": c.to}, h)[0],
			func(out *Tensor) error { return Cast(d, out, hin) }})
	}
	// Sources 1 and 4 elements past an aligned address: single elements, then 8-byte
	// vectors; a cast from 1 element past.
	padded := randTensor(rng, tensor.F32, []int{1 + 4*32*64}, -100, 100).Cast(tensor.BF16)
	pin := up(t, d, padded)[0]
	for _, off := range []int{1, 4} {
		h := tensor.FromF32(padded.Cast(tensor.F32).F32[off:off+4*32*60], 4, 32, 60).Cast(tensor.BF16)
		src := view(pin, tensor.BF16, off, 4, 32, 60)
		cases = append(cases, copyCase{fmt.Sprintf("transpose bf16[4,32,60] at element %d", off),
			cpuOp(t, "transpose", graph.Attrs{"perm": []int{1, 0, 2}}, h)[0],
			func(out *Tensor) error { return Transpose(d, out, src, []int{1, 0, 2}) }})
		cases = append(cases, copyCase{fmt.Sprintf("cast bf16[4,32,60] at element %d -> f32", off),
			h.Cast(tensor.F32), func(out *Tensor) error { return Cast(d, out, src) }})
	}
	for _, general := range []bool{false, true} {
		forceGeneralCopy = general
		op := map[bool]string{false: "fast_copy", true: "general_copy"}[general]
		for _, c := range cases {
			out := poisoned(t, d, c.want)[0]
			if err := c.run(out); err != nil {
				forceGeneralCopy = false
				t.Fatalf("%s %s: %v", op, c.name, err)
			}
			compare(t, op, c.name, down(t, d, out), c.want, exact)
		}
	}
	forceGeneralCopy = false
}

// The register forms of rmsnorm and add_rmsnorm match the CPU and the loop kernels bit for
// bit at D = 4096 with 1 and 64 rows, odd D, rows long enough for several vectors a
// thread, a row too long for them (the loop kernel) and operands off the vectors'
// alignment, for every dtype combination; add_rmsnorm's sum also in place.
func TestRMSNormRegisterForms(t *testing.T) {
	d := gpu(t)
	t.Cleanup(func() { forceLoopNorm = false })
	rng := rand.New(rand.NewPCG(12, 5))
	type normCase struct {
		name string
		off  int // x's element offset from an aligned address
		rows int
		D    int
	}
	cases := []normCase{{"", 0, 1, 4096}, {"", 0, 64, 4096}, {"", 0, 3, 7}, {"", 0, 5, 1001}, {"", 0, 2, 4104},
		{"", 0, 2, 32768}, {"", 0, 1, 65536}, {"", 1, 3, 4096}, {"", 4, 2, 4096}}
	dts := [][3]tensor.DType{
		{tensor.BF16, tensor.BF16, tensor.BF16}, {tensor.F32, tensor.BF16, tensor.BF16}, {tensor.BF16, tensor.F32, tensor.F32},
		{tensor.F32, tensor.F32, tensor.F32}, {tensor.BF16, tensor.BF16, tensor.F32},
	}
	run := func(f func() error) {
		t.Helper()
		if err := f(); err != nil {
			forceLoopNorm = false
			t.Fatal(err)
		}
	}
	// Compile the register forms the cases use in parallel (the plan at an address 256-byte
	// aligned plus the case's offset, as the allocator's addresses are).
	var extras []string
	for _, c := range cases {
		for _, dt := range dts {
			const base = cubind.DevicePtr(1 << 20)
			sdt := promote(dt[0], dt[1])
			x := operand{base + cubind.DevicePtr(c.off*dt[0].Size()), dt[0]}
			xn, rn, wn := dtypeName(dt[0]), dtypeName(dt[1]), dtypeName(dt[2])
			if p, ok := planNorm(c.D, x, operand{base, dt[2]}, operand{base, promote(dt[2], dt[0])}); ok {
				inst, _ := rmsnormVec(xn, wn, p)
				extras = append(extras, inst)
			}
			if p, ok := planNorm(c.D, x, operand{base, dt[1]}, operand{base, dt[2]}, operand{base, sdt}, operand{base, promote(dt[2], sdt)}); ok {
				inst, _ := addRMSNormVec(xn, rn, wn, p)
				extras = append(extras, inst)
			}
		}
	}
	precompile(t, d, "norm.cu", extras)
	for _, c := range cases {
		for _, dt := range dts {
			name := fmt.Sprintf("x %s r %s w %s [%d,%d] at element %d", dt[0], dt[1], dt[2], c.rows, c.D, c.off)
			shape := []int{c.rows, c.D}
			xp := randTensor(rng, dt[0], []int{c.off + c.rows*c.D}, -3, 3)
			x := tensor.FromF32(xp.Cast(tensor.F32).F32[c.off:], shape...).Cast(dt[0])
			r := randTensor(rng, dt[1], shape, -2, 2)
			w := randTensor(rng, dt[2], []int{c.D}, 0.5, 1.5)
			ins := up(t, d, xp, r, w)
			xin := view(ins[0], dt[0], c.off, shape...)

			want := cpuOp(t, "rmsnorm", graph.Attrs{"eps": 1e-5}, x, w)[0]
			outs := poisoned(t, d, want, want)
			run(func() error { return RMSNorm(d, outs[0], xin, ins[2], 1e-5) })
			forceLoopNorm = true
			run(func() error { return RMSNorm(d, outs[1], xin, ins[2], 1e-5) })
			forceLoopNorm = false
			got := down(t, d, outs[0])
			compare(t, "rmsnorm", name, got, want, tolFor(want.DType))
			compare(t, "rmsnorm-loop", name, got, down(t, d, outs[1]), exact)

			wants := cpuOp(t, "add_rmsnorm", graph.Attrs{"eps": 1e-6}, x, r, w)
			nouts := poisoned(t, d, wants[0], wants[1], wants[0], wants[1])
			run(func() error { return AddRMSNorm(d, nouts[0], nouts[1], xin, ins[1], ins[2], 1e-6) })
			forceLoopNorm = true
			run(func() error { return AddRMSNorm(d, nouts[2], nouts[3], xin, ins[1], ins[2], 1e-6) })
			forceLoopNorm = false
			normed, sum := down(t, d, nouts[0]), down(t, d, nouts[1])
			compare(t, "add_rmsnorm", name+" normed", normed, wants[0], tolFor(wants[0].DType))
			compare(t, "add_rmsnorm", name+" sum", sum, wants[1], exact)
			compare(t, "add_rmsnorm-loop", name+" normed", normed, down(t, d, nouts[2]), exact)
			compare(t, "add_rmsnorm-loop", name+" sum", sum, down(t, d, nouts[3]), exact)
			if dt[1] == wants[1].DType { // the sum written over the residual
				res := up(t, d, r)[0]
				inPlace := poisoned(t, d, wants[0])[0]
				run(func() error { return AddRMSNorm(d, inPlace, res, xin, res, ins[2], 1e-6) })
				compare(t, "add_rmsnorm", name+" normed, sum in place", down(t, d, inPlace), normed, exact)
				compare(t, "add_rmsnorm", name+" sum in place", down(t, d, res), sum, exact)
			}
		}
	}
}

// graphTime captures reps calls of f (which queues work with the device locked) into a CUDA
// graph and returns the device time of one call from events around replays: the launch
// overhead of eager calls stays out, the gaps between a graph's kernels stay in. The first
// call of f runs eagerly, to compile and load its kernels.
func graphTime(t *testing.T, d *Device, reps int, f func() error) time.Duration {
	t.Helper()
	if err := d.do(f); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	var el time.Duration
	err := d.do(func() error {
		var err error
		el, err = capturedCallTime(d, reps, 5, func(int) error { return f() })
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	return el
}

// TestFastPathTimings times, when LOOM_CUDA_TIMINGS=1, the copies and norms on Llama-3.1-8B
// shapes through CUDA graphs, the fast paths against the general and loop kernels they
// replace (random bf16 data).
func TestFastPathTimings(t *testing.T) {
	d := gpu(t)
	if os.Getenv("LOOM_CUDA_TIMINGS") != "1" {
		t.Skip("set LOOM_CUDA_TIMINGS=1 to time the kernels")
	}
	t.Cleanup(func() { forceGeneralCopy, forceLoopNorm = false, false })
	rng := rand.New(rand.NewPCG(2, 3))
	bf := tensor.BF16
	rnd := func(dt tensor.DType, shape ...int) *Tensor {
		return up(t, d, randTensor(rng, tensor.F32, shape, -2, 2).Cast(dt))[0]
	}
	report := func(name string, bytes float64, knob *bool, f func() error) {
		t.Helper()
		fast := graphTime(t, d, 20, f)
		*knob = true
		old := graphTime(t, d, 20, f)
		*knob = false
		gbs := func(el time.Duration) float64 { return bytes / el.Seconds() / 1e9 }
		t.Logf("%-44s %7.1f µs %5.0f GB/s, was %7.1f µs %5.0f GB/s", name, float64(fast.Nanoseconds())/1e3, gbs(fast),
			float64(old.Nanoseconds())/1e3, gbs(old))
	}
	for _, T := range []int{1024, 4096} {
		x, y := rnd(bf, 1, T, 32, 128), like(t, d, tensor.New(bf, 1, 32, T, 128))[0]
		report(fmt.Sprintf("transpose bf16 [1,%d,32,128]", T), 4*float64(T*32*128), &forceGeneralCopy,
			func() error { return transpose(d, y, x, []int{0, 2, 1, 3}) })
	}
	lg, lf := rnd(bf, 64, 128256), like(t, d, tensor.New(tensor.F32, 64, 128256))[0]
	report("cast bf16 -> f32 [64,128256]", 6*64*128256, &forceGeneralCopy, func() error { return cast(d, lf, lg) })
	wq, wk, wv := rnd(bf, 4096, 4096), rnd(bf, 1024, 4096), rnd(bf, 1024, 4096)
	wqkv := like(t, d, tensor.New(bf, 6144, 4096))[0]
	report("concat bf16 [4096|1024|1024,4096] axis 0", 4*6144*4096, &forceGeneralCopy,
		func() error { return concat(d, wqkv, 0, []*Tensor{wq, wk, wv}) })
	wg, wu := rnd(bf, 4096, 2048), rnd(bf, 4096, 2048)
	wgu := like(t, d, tensor.New(bf, 4096, 4096))[0]
	report("concat bf16 [4096,2048|2048] axis 1", 4*4096*4096, &forceGeneralCopy,
		func() error { return concat(d, wgu, 1, []*Tensor{wg, wu}) })
	w := rnd(bf, 4096)
	for _, rows := range []int{1, 64, 4096} {
		x, r := rnd(bf, rows, 4096), rnd(bf, rows, 4096)
		o, s := like(t, d, tensor.New(bf, rows, 4096))[0], like(t, d, tensor.New(bf, rows, 4096))[0]
		report(fmt.Sprintf("rmsnorm bf16 [%d,4096]", rows), 4*float64(rows*4096), &forceLoopNorm,
			func() error { return rmsnorm(d, o, x, w, 1e-5) })
		report(fmt.Sprintf("add_rmsnorm bf16 [%d,4096]", rows), 8*float64(rows*4096), &forceLoopNorm,
			func() error { return addRMSNorm(d, o, s, x, r, w, 1e-5) })
	}
}
