package steps

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/kvcache"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

// testSpec is a one-layer cache of 4-token blocks.
var testSpec = kvcache.Spec{BlockSize: 4, Layers: []kvcache.LayerSpec{{K: "kv_cache.0.k", V: "kv_cache.0.v", KVHeads: 1, HeadDim: 2, DType: tensor.F32}}}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// fakeRank is an executable that counts its runs; hook, when set, runs first (with the
// 1-based run number) and its error fails the run.
type fakeRank struct {
	hook func(ctx context.Context, run int) error

	mu   sync.Mutex
	runs int
}

func (f *fakeRank) Run(ctx context.Context, in map[string]*tensor.Tensor) ([]*tensor.Tensor, error) {
	f.mu.Lock()
	f.runs++
	n := f.runs
	f.mu.Unlock()
	if f.hook != nil {
		if err := f.hook(ctx, n); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// follower is a rank other than 0 of a test world: Follow's result arrives on done.
type follower struct {
	conn net.Conn
	done chan error
}

// startWorld connects rank 0 to len(exes) followers (ranks 1, 2, ...) over TCP on
// 127.0.0.1, each following with its executable and testSpec until the test ends.
func startWorld(t *testing.T, ctx context.Context, exes []backend.Executable) ([]*Remote, []*follower) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	n := len(exes) + 1
	accepted := make(chan []*Remote, 1)
	acceptErr := make(chan error, 1)
	go func() {
		rrs, err := Accept(ctx, ln, n)
		acceptErr <- err
		accepted <- rrs
	}()
	fs := make([]*follower, len(exes))
	for i, exe := range exes {
		_, launches := exe.(backend.Launcher)
		conn, err := Dial(ctx, ln.Addr().String(), i+1, n, uint64(100+i), launches)
		if err != nil {
			t.Fatal(err)
		}
		f := &follower{conn: conn, done: make(chan error, 1)}
		fs[i] = f
		go func() { f.done <- Follow(ctx, exe, testSpec, conn) }()
		t.Cleanup(func() { conn.Close() })
	}
	if err := <-acceptErr; err != nil {
		t.Fatal(err)
	}
	rrs := <-accepted
	for i, rr := range rrs {
		if rr.Rank() != i+1 || rr.Free() != uint64(100+i) {
			t.Fatalf("follower %d: rank %d, free %d", i, rr.Rank(), rr.Free())
		}
		rr.SetResident([]string{"kv_cache.0.k", "kv_cache.0.v"})
		t.Cleanup(func() { rr.Close() })
	}
	return rrs, fs
}

// testStep is the inputs of a step of 3 tokens over a cache of blocks blocks, as rank 0
// sends them (the cache shape-only: only its number of blocks travels).
func testStep(blocks int) map[string]*tensor.Tensor {
	return map[string]*tensor.Tensor{
		"input_ids":    tensor.FromI32([]int32{5, 6, 7}, 1, 3),
		"positions":    tensor.FromI32([]int32{0, 1, 2}, 1, 3),
		"slot_mapping": tensor.FromI32([]int32{0, 1, 2}, 3),
		"kv_cache.0.k": {DType: tensor.F32, Shape: []int{blocks, 4, 1, 2}},
		"kv_cache.0.v": {DType: tensor.F32, Shape: []int{blocks, 4, 1, 2}},
	}
}

func sameTensor(a, b *tensor.Tensor) bool {
	return a.DType == b.DType && slices.Equal(a.Shape, b.Shape) && slices.Equal(a.I32, b.I32) &&
		slices.Equal(a.I64, b.I64) && slices.Equal(a.F32, b.F32)
}

// Rank 0's goodbye ends its followers' loops with nil; a rank 0 that vanishes without one
// (it died) ends them with an error naming rank 0.
func TestRemoteRank0Ends(t *testing.T) {
	for _, tc := range []struct {
		name    string
		end     func(rr *Remote)
		wantErr string
	}{
		{"goodbye", func(rr *Remote) { rr.Close() }, ""},
		{"died", func(rr *Remote) { rr.conn.Close() }, "rank 0 closed the step connection without a goodbye after 1 steps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			rrs, fs := startWorld(t, ctx, []backend.Executable{&fakeRank{}, &fakeRank{}})
			for _, rr := range rrs {
				if _, err := rr.Run(ctx, testStep(8)); err != nil {
					t.Fatal(err)
				}
			}
			for _, rr := range rrs {
				tc.end(rr)
			}
			for r, f := range fs {
				select {
				case err := <-f.done:
					if tc.wantErr == "" && err != nil {
						t.Errorf("rank %d: %v, want nil after rank 0's goodbye", r+1, err)
					}
					if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
						t.Errorf("rank %d: %v, want %q", r+1, err, tc.wantErr)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("rank %d still follows", r+1)
				}
			}
		})
	}
}

// A context that ends stops rank 0's wait for a follower (the next step first drops the
// abandoned step's reply), and a follower's wait for rank 0; a follower silent past the
// timeout fails the step.
func TestRemoteContext(t *testing.T) {
	t.Run("rank 0 cancelled", func(t *testing.T) {
		ctx := testCtx(t)
		slow := &fakeRank{hook: func(ctx context.Context, run int) error {
			time.Sleep(2 * time.Second)
			return nil
		}}
		rrs, _ := startWorld(t, ctx, []backend.Executable{slow})
		step := testStep(8)
		runCtx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := rrs[0].Run(runCtx, step)
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
			t.Errorf("Run with an ending context: %v after %v", err, time.Since(start))
		}
		if _, err := rrs[0].Run(ctx, step); err != nil {
			t.Errorf("Run after a cancelled step: %v", err)
		}
		if rrs[0].step != 2 || len(rrs[0].sent) != 0 {
			t.Errorf("after the abandoned step 1 and step 2: step %d, replies owed for %v", rrs[0].step, rrs[0].sent)
		}
	})
	t.Run("reply timeout", func(t *testing.T) {
		ctx := testCtx(t)
		slow := &fakeRank{hook: func(ctx context.Context, run int) error {
			time.Sleep(time.Second)
			return nil
		}}
		rrs, _ := startWorld(t, ctx, []backend.Executable{slow})
		rrs[0].SetTimeout(100 * time.Millisecond)
		if _, err := rrs[0].Run(ctx, testStep(8)); err == nil || !strings.Contains(err.Error(), "no reply from the follower within 100ms") {
			t.Errorf("Run past the timeout: %v", err)
		}
	})
	t.Run("follower cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(testCtx(t))
		_, fs := startWorld(t, ctx, []backend.Executable{&fakeRank{}})
		time.AfterFunc(50*time.Millisecond, cancel)
		select {
		case err := <-fs[0].done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Follow after its context ended: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Follow did not return when its context ended")
		}
	})
}

// Rank 0 takes each follower once, of its world's size; a wrong world is refused on both
// sides, a stranger's connection is dropped, and a missing rank is named when the wait ends.
func TestRemoteHandshake(t *testing.T) {
	hello := func(ctx context.Context, addr string, rank, size int) error {
		conn, err := Dial(ctx, addr, rank, size, 0, false)
		if conn != nil {
			t.Cleanup(func() { conn.Close() })
		}
		return err
	}
	for _, tc := range []struct {
		name     string
		dial     func(ctx context.Context, addr string) []error // the followers
		wantRank string                                         // rank 0's error, "" for success
		wantDial string                                         // the last dial's error
	}{
		{"ok after a stranger", func(ctx context.Context, addr string) []error {
			c, err := net.Dial("tcp", addr)
			if err == nil {
				c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
				c.Close()
			}
			return []error{hello(ctx, addr, 2, 3), hello(ctx, addr, 1, 3)}
		}, "", ""},
		{"world size", func(ctx context.Context, addr string) []error {
			return []error{hello(ctx, addr, 1, 4)}
		}, "rank 1 belongs to a world of 4 ranks, rank 0's has 3", "refused this rank"},
		{"twice", func(ctx context.Context, addr string) []error {
			return []error{hello(ctx, addr, 1, 3), hello(ctx, addr, 1, 3)}
		}, "says it is rank 1, which is not a follower", "refused this rank"},
		{"rank 0", func(ctx context.Context, addr string) []error {
			return []error{hello(ctx, addr, 0, 3)}
		}, "says it is rank 0", "refused this rank"},
		{"missing", func(ctx context.Context, addr string) []error {
			return []error{hello(ctx, addr, 2, 3)}
		}, "waiting for rank(s) 1 to connect", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			got := make(chan error, 1)
			go func() {
				rrs, err := Accept(ctx, ln, 3)
				for _, rr := range rrs {
					rr.conn.Close()
				}
				got <- err
			}()
			errs := tc.dial(ctx, ln.Addr().String())
			err = <-got
			if (tc.wantRank == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantRank)) {
				t.Errorf("rank 0: %v, want %q", err, tc.wantRank)
			}
			last := errs[len(errs)-1]
			if (tc.wantDial == "") != (last == nil) || (last != nil && !strings.Contains(last.Error(), tc.wantDial)) {
				t.Errorf("follower: %v, want %q", last, tc.wantDial)
			}
		})
	}
}

// A follower waiting for a rank 0 that never listens gives up when its context ends,
// naming the address.
func TestRemoteDialTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := Dial(ctx, addr, 1, 2, 0, false); err == nil || !strings.Contains(err.Error(), "rank 1: connect to rank 0 at "+addr) {
		t.Errorf("dial with nobody listening: %v", err)
	}
}

// The step transport listens on the port after the rendezvous's.
func TestAddr(t *testing.T) {
	if a, err := Addr(distEnv("127.0.0.1", 29500)); err != nil || a != "127.0.0.1:29501" {
		t.Errorf("Addr = %q, %v", a, err)
	}
	if _, err := Addr(distEnv("127.0.0.1", 65535)); err == nil || !strings.Contains(err.Error(), "MASTER_PORT=65535") {
		t.Errorf("Addr of the last port: %v", err)
	}
}

// Steps carry i32, i64 and f32 inputs exactly and the caches as a block count; what
// cannot travel is an error naming the input.
func TestStepCodec(t *testing.T) {
	in := map[string]*tensor.Tensor{
		"input_ids":    tensor.FromI32([]int32{1, -2, 3}, 1, 3),
		"wide":         {DType: tensor.I64, Shape: []int{2}, I64: []int64{-1 << 40, 7}},
		"scale":        tensor.FromF32([]float32{0.5, -3}, 2),
		"empty":        tensor.FromI32(nil, 0, 4),
		"kv_cache.0.k": {DType: tensor.BF16, Shape: []int{17, 4, 1, 2}},
	}
	b, err := encodeStep(42, in)
	if err != nil {
		t.Fatal(err)
	}
	m, err := decodeStep(b)
	if err != nil {
		t.Fatal(err)
	}
	if m.step != 42 || m.blocks != 17 || len(m.inputs) != 4 {
		t.Fatalf("decoded step %d, %d blocks, %d inputs", m.step, m.blocks, len(m.inputs))
	}
	for name, w := range in {
		if IsCacheInput(name) {
			continue
		}
		if g := m.inputs[name]; g == nil || !sameTensor(g, w) {
			t.Errorf("%s: %+v, want %+v", name, g, w)
		}
	}
	for _, tc := range []struct {
		name string
		t    *tensor.Tensor
		want string
	}{
		{"bf16", &tensor.Tensor{DType: tensor.BF16, Shape: []int{1}, Half: []uint16{1}}, `input "bf16" (bf16[1]) cannot be sent`},
		{"shape only", &tensor.Tensor{DType: tensor.I32, Shape: []int{3}}, `input "shape only" (i32[3]) cannot be sent`},
	} {
		if _, err := encodeStep(1, map[string]*tensor.Tensor{tc.name: tc.t}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	for cut := range len(b) {
		if _, err := decodeStep(b[:cut]); err == nil {
			t.Fatalf("a step cut to %d of %d bytes decoded", cut, len(b))
		}
	}
	draws := []sample.DeviceDraw{{}, {Temperature: 0.7, TopP: 0.9, MinP: 0.05, TopK: 40, Seed: 1 << 60, Counter: 9}}
	lb, err := encodeLaunch(43, in, draws, true)
	if err != nil {
		t.Fatal(err)
	}
	lm, err := decodeLaunch(lb)
	if err != nil {
		t.Fatal(err)
	}
	if lm.step != 43 || lm.blocks != 17 || len(lm.inputs) != 4 || !lm.feed || !slices.Equal(lm.draws, draws) {
		t.Fatalf("decoded launch: step %d, %d blocks, %d inputs, feed %v, draws %+v", lm.step, lm.blocks, len(lm.inputs), lm.feed, lm.draws)
	}
	for cut := range len(lb) {
		if _, err := decodeLaunch(lb[:cut]); err == nil {
			t.Fatalf("a launch cut to %d of %d bytes decoded", cut, len(lb))
		}
	}
	bad := slices.Clone(lb)
	bad[0] = 2
	if _, err := decodeLaunch(bad); err == nil || !strings.Contains(err.Error(), "feed flag 2") {
		t.Errorf("feed flag 2: %v", err)
	}
}

// FuzzDecodeLaunch: no payload makes the launch decoder panic, and what it accepts holds
// as many draws as it says.
func FuzzDecodeLaunch(f *testing.F) {
	in := map[string]*tensor.Tensor{"input_ids": tensor.FromI32([]int32{1, 2}, 1, 2)}
	for _, feed := range []bool{false, true} {
		b, err := encodeLaunch(7, in, make([]sample.DeviceDraw, 2), feed)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeLaunch(b)
		if err == nil && len(b) < 5+drawBytes*len(m.draws) {
			t.Errorf("%d draws decoded from %d bytes", len(m.draws), len(b))
		}
	})
}

// A follower that cannot launch steps ahead (it said so in its hello, and the engine never
// asks it: its Executable is no backend.Launcher) answers a launch with an error naming
// why, and runs the next step all the same.
func TestRemoteLaunchUnsupported(t *testing.T) {
	ctx := testCtx(t)
	rrs, _ := startWorld(t, ctx, []backend.Executable{&fakeRank{}})
	if _, ok := rrs[0].Executable().(backend.Launcher); rrs[0].Launches() || ok {
		t.Fatal("a follower without a backend.Launcher says it launches")
	}
	pend, err := rrs[0].LaunchStep(ctx, testStep(8), nil, false, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pend.Wait(ctx); err == nil || !strings.Contains(err.Error(), "cannot launch steps ahead") {
		t.Errorf("launch on a follower that cannot: %v", err)
	}
	if _, err := rrs[0].Run(ctx, testStep(8)); err != nil {
		t.Errorf("the next step: %v", err)
	}
	if !backend.Keeps(rrs[0].Executable(), []string{"kv_cache.0.k", "kv_cache.0.v"}) {
		t.Error("the remote rank's executable does not keep the caches the follower keeps")
	}
}

func distEnv(addr string, port int) dist.ProcessEnv {
	return dist.ProcessEnv{WorldSize: 2, MasterAddr: addr, MasterPort: port}
}
