package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
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
		if err := d.Embedding(out[0], in[0], in[1]); err != nil {
			t.Fatal(err)
		}
		compare(t, "embedding", name, down(t, d, out[0]), want, exact)
	}
	// An id out of range is reported by the next Sync, which then clears it.
	tab := randTensor(rng, tensor.BF16, []int{4, 8}, -1, 1)
	ids := tensor.FromI32([]int32{1, 4, 2}, 3)
	in := up(t, d, tab, ids)
	out := like(t, d, tensor.New(tensor.BF16, 3, 8))
	if err := d.Embedding(out[0], in[0], in[1]); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err == nil || !strings.Contains(err.Error(), "id 4 (at position 1) is out of range") {
		t.Errorf("Sync after a bad id: %v", err)
	}
	if err := d.Sync(); err != nil {
		t.Errorf("second Sync: %v", err)
	}
	// Shape errors are errors.
	if err := d.Embedding(out[0], in[0], in[0]); err == nil {
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
			if err := d.RMSNorm(out[0], in[0], in[1], 1e-5); err != nil {
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
			if err := d.AddRMSNorm(out[0], out[1], in[0], in[1], in[2], 1e-6); err != nil {
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
			if err := d.Rope(out[0], out[1], in[0], in[1], in[2], in[3], float32(tc.scaling)); err != nil {
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
			if err := d.SwiGLU(out[0], in[0], in[1]); err != nil {
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
				f := d.Add
				if op == "mul" {
					f = d.Mul
				}
				if err := f(out[0], in[0], in[1]); err != nil {
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
			run("transpose", graph.Attrs{"perm": perm}, func(out, x *Tensor) error { return d.Transpose(out, x, perm) })
		}
		run("slice", graph.Attrs{"axis": -1, "start": 1, "end": 5, "step": 2}, func(out, x *Tensor) error { return d.Slice(out, x, 3, 1, 5, 2) })
		run("slice", graph.Attrs{"axis": 1, "start": 1, "end": 3}, func(out, x *Tensor) error { return d.Slice(out, x, 1, 1, 3, 1) })
		if dt != tensor.I32 {
			other := tensor.F32
			if dt == tensor.F32 {
				other = tensor.BF16
			}
			run("cast", graph.Attrs{"dtype": other}, func(out, x *Tensor) error { return d.Cast(out, x) })
		}
		y := randTensor(rng, tensor.F32, []int{2, 1, 4, 5}, -9, 9).Cast(dt)
		want := cpuOp(t, "concat", graph.Attrs{"axis": 1}, x, y, x)[0]
		in := up(t, d, x, y)
		out := like(t, d, want)
		if err := d.Concat(out[0], 1, in[0], in[1], in[0]); err != nil {
			t.Fatal(err)
		}
		compare(t, "concat", fmt.Sprintf("%s axis 1", dt), down(t, d, out[0]), want, exact)

		e := randTensor(rng, tensor.F32, []int{2, 1, 3, 1}, -9, 9).Cast(dt)
		want = cpuOp(t, "expand", graph.Attrs{"shape": graph.Dims(2, 4, 3, 5)}, e)[0]
		in = up(t, d, e)
		out = like(t, d, want)
		if err := d.Expand(out[0], in[0]); err != nil {
			t.Fatal(err)
		}
		compare(t, "expand", fmt.Sprintf("%s [2,1,3,1] -> [2,4,3,5]", dt), down(t, d, out[0]), want, exact)

		want = cpuOp(t, "repeat_kv", graph.Attrs{"n": 3}, x)[0]
		in = up(t, d, x)
		out = like(t, d, want)
		if err := d.repeatKVLocked(out[0], in[0], 3); err != nil {
			t.Fatal(err)
		}
		compare(t, "repeat_kv", fmt.Sprintf("%s n=3", dt), down(t, d, out[0]), want, exact)
	}
}

// repeatKVLocked runs repeatKV with the device locked, for tests.
func (d *Device) repeatKVLocked(out, x *Tensor, n int) error {
	return d.do(func() error { return d.repeatKV(out, x, n) })
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
			if err := d.SDPA(out[0], in[0], in[1], in[2], in[3], float32(scale), tc.window); err != nil {
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

func goArgmax(xs []float32) int {
	best := 0
	for i, x := range xs {
		if x > xs[best] {
			best = i
		}
	}
	return best
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
			want.I32[r] = int32(goArgmax(all[r*V : (r+1)*V]))
		}
		in := up(t, d, x)
		out := like(t, d, want)
		if err := d.Argmax(out[0], in[0]); err != nil {
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
			if err := d.Linear(out[0], in[0], in[1]); err != nil {
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
	if err := d.Linear(out[0], in[0], in[1]); err == nil || !strings.Contains(err.Error(), "linear") {
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
