package engine

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/engine/steps"
	"github.com/loom-ml/loom/internal/parity"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

// The multi-process tests run rank 0 in the test process and start this test binary
// again as rank 1 (TestMultiProcFollower, told what to do by mpRoleEnv and mpModelEnv,
// with the torchrun variables set as loom launch sets them).
const (
	mpRoleEnv  = "LOOM_MULTIPROC_ROLE"  // "follow", or "die:N": SIGKILL itself at its Nth step
	mpModelEnv = "LOOM_MULTIPROC_MODEL" // the checkpoint directory
)

// mpNCCL are short timeouts, so that a failure shows within the test's time.
var mpNCCL = dist.ProcessOptions{Timeout: 20 * time.Second, Heartbeat: 100 * time.Millisecond, PeerTimeout: 3 * time.Second}

// mpLoadOptions are the tp=2 engine's, with f32 activations (the CPU's numerics).
func mpLoadOptions(t testing.TB) LoadOptions {
	mesh, err := dist.ParseMesh("tp=2")
	if err != nil {
		t.Fatal(err)
	}
	return LoadOptions{Device: "cuda", Optimize: true, Mesh: mesh, ActivationDType: tensor.F32}
}

// lockedBuffer collects a child's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// mpPort returns a port that is free, and whose next port (the step transport's) is too.
func mpPort(t *testing.T) int {
	t.Helper()
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		next, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+1))
		ln.Close()
		if err == nil {
			next.Close()
			return port
		}
	}
	t.Fatal("no two free consecutive ports")
	return 0
}

// rank1 is the child process of rank 1.
type rank1 struct {
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{} // closed when it has exited
	err  error         // Wait's, once done
}

// spawnRank1 starts rank 1 of a world at port with role; the test's end kills it if it
// still runs and logs its output.
func spawnRank1(t *testing.T, port int, dir, role string) *rank1 {
	t.Helper()
	r := &rank1{out: &lockedBuffer{}, done: make(chan struct{})}
	r.cmd = exec.Command(os.Args[0], "-test.run=^TestMultiProcFollower$", "-test.v")
	r.cmd.Env = append(os.Environ(), mpRoleEnv+"="+role, mpModelEnv+"="+dir,
		dist.EnvRank+"=1", dist.EnvWorldSize+"=2", dist.EnvLocalRank+"=1",
		dist.EnvMasterAddr+"=127.0.0.1", dist.EnvMasterPort+"="+strconv.Itoa(port))
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		r.err = r.cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			r.cmd.Process.Kill()
			<-r.done
		}
		t.Logf("rank 1 (%v):\n%s", r.err, strings.TrimSpace(r.out.String()))
	})
	return r
}

// wait waits for rank 1 to exit, at most d.
func (r *rank1) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(d):
		t.Fatalf("rank 1 still runs after %v", d)
		return nil
	}
}

// startRank0 loads rank 0 of dir at port (which connects rank 1) and starts the engine.
func startRank0(t *testing.T, ctx context.Context, dir string, port int, eo Options) (*Engine, func()) {
	t.Helper()
	env := dist.ProcessEnv{Rank: 0, WorldSize: 2, LocalRank: 0, MasterAddr: "127.0.0.1", MasterPort: port}
	m, err := Load(ctx, dir, mpRank(t, env))
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(ctx, m, eo)
	if err != nil {
		m.Close()
		t.Fatal(err)
	}
	return e, func() {
		e.Close()
		if err := m.Close(); err != nil {
			t.Logf("close rank 0's model and step transport: %v", err)
		}
	}
}

// mpRank is mpLoadOptions for rank env of a world of processes.
func mpRank(t testing.TB, env dist.ProcessEnv) LoadOptions {
	opts := mpLoadOptions(t)
	opts.Process, opts.ProcessOptions = &env, mpNCCL
	return opts
}

// sameUpToTie fails unless got equals want, or first parts from it where the reference's
// top two logits were a near tie.
func sameUpToTie(t *testing.T, what string, got, want []int, margins []float64) {
	t.Helper()
	for i := range max(len(got), len(want)) {
		if i < len(got) && i < len(want) && got[i] == want[i] {
			continue
		}
		if i < len(got) && i < len(want) && i < len(margins) && margins[i] < parity.NearTie {
			t.Logf("%s: part at step %d, a near tie (margin %.4f)", what, i, margins[i])
			return
		}
		t.Errorf("%s: %v, want %v", what, got, want)
		return
	}
}

// One process per GPU: the engine on rank 0 with rank 1 in its own process (NCCL through
// the rendezvous, steps over TCP) gives the greedy tokens of the in-process tp=2 CUDA
// engine and of the CPU engine.
func TestMultiProcEngineTP2(t *testing.T) {
	needGPUs(t, 2)
	for _, name := range []string{"tiny-llama", "tiny-gqa6"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("..", "testdata", name)
			ref := loadReference(t, dir)
			reqs := greedyRequests(ref)
			eo := Options{MaxTokensPerStep: 16, KVBlocks: 64, Logger: quiet}
			ctx := testCtx(t)

			port := mpPort(t)
			r1 := spawnRank1(t, port, dir, "follow")
			start := time.Now()
			e, closeRank0 := startRank0(t, ctx, dir, port, eo)
			t.Logf("two processes ready in %v", time.Since(start).Round(time.Millisecond))
			got := generateAll(t, e, reqs)
			// Hugging Face's greedy tokens; past a near tie the rest is generated again by the
			// two processes from the teacher-forced prefix, so a tie at step 0 cannot end the
			// comparison (fewer than half the steps compared fails).
			checkGreedyAll(t, ref, got, engineGen(t, e))
			closeRank0()
			if err := r1.wait(t, 30*time.Second); err != nil {
				t.Errorf("rank 1 exited with %v after rank 0's goodbye, want 0", err)
			}

			m, err := Load(ctx, dir, mpLoadOptions(t))
			if err != nil {
				t.Fatal(err)
			}
			ie, err := New(ctx, m, eo)
			if err != nil {
				m.Close()
				t.Fatal(err)
			}
			inproc := generateAll(t, ie, reqs)
			ie.Close()
			m.Close()
			cpu := generateAll(t, newEngine(t, name, eo), reqs)

			for i, p := range ref.Prompts {
				if len(got[i]) != reqs[i].MaxTokens {
					t.Errorf("request %d: %d tokens, want %d", i, len(got[i]), reqs[i].MaxTokens)
				}
				sameUpToTie(t, fmt.Sprintf("request %d multi-process vs in-process tp=2", i), got[i], inproc[i], p.GreedyMargins)
				sameUpToTie(t, fmt.Sprintf("request %d multi-process vs CPU", i), got[i], cpu[i], p.GreedyMargins)
			}
		})
	}
}

// Rank 1 is killed in the middle of a request: the request ends with an error naming
// rank 1, within seconds, instead of hanging in a collective.
func TestMultiProcRankDies(t *testing.T) {
	needGPUs(t, 2)
	dir := filepath.Join("..", "testdata", "tiny-llama")
	ctx := testCtx(t)
	port := mpPort(t)
	r1 := spawnRank1(t, port, dir, "die:5")
	e, closeRank0 := startRank0(t, ctx, dir, port, Options{MaxTokensPerStep: 16, KVBlocks: 64, Logger: quiet})
	defer closeRank0()
	st, err := e.Submit(ctx, Request{Prompt: []int{1, 2, 3, 4}, MaxTokens: 100, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	toks, last, err := st.Collect(ctx)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d tokens, then %q after %v: %v", len(toks), last.Finish, took.Round(time.Millisecond), last.Err)
	if last.Finish != FinishError || last.Err == nil || !strings.Contains(last.Err.Error(), "rank 1") || took > 6*time.Second {
		t.Errorf("after rank 1 died: finish %q, %v after %v; want an error naming rank 1 within seconds", last.Finish, last.Err, took)
	}
	if len(toks) == 0 || len(toks) >= 100 {
		t.Errorf("%d tokens before the failure, want some but not all", len(toks))
	}
	err = r1.wait(t, 10*time.Second)
	if ws, ok := r1.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("rank 1 ended with %v, want killed", err)
	}
}

// dyingRank is rank 1's program that kills its process at its at-th step.
type dyingRank struct {
	Executable
	at, runs int
}

func (d *dyingRank) Run(ctx context.Context, in map[string]*tensor.Tensor) ([]*tensor.Tensor, error) {
	d.step()
	return d.Executable.Run(ctx, in)
}

// RunDiscard is what a follower calls (backend.RunDiscard): it dies there too.
func (d *dyingRank) RunDiscard(ctx context.Context, in map[string]*tensor.Tensor) error {
	d.step()
	return backend.RunDiscard(ctx, d.Executable, in)
}

// LaunchStep is what a follower calls for a step launched ahead: it dies there too.
func (d *dyingRank) LaunchStep(ctx context.Context, in map[string]*tensor.Tensor, draws []sample.DeviceDraw, feed, download bool) (backend.Pending, error) {
	d.step()
	return d.Executable.(backend.Launcher).LaunchStep(ctx, in, draws, feed, download)
}

// Resident is the program's: the follower keeps its caches on the GPU.
func (d *dyingRank) Resident() []string { return d.Executable.(backend.Resident).Resident() }

// step counts a run and kills the process at the at-th.
func (d *dyingRank) step() {
	if d.runs++; d.runs == d.at {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Minute)
	}
}

// TestMultiProcFollower is rank 1 of the multi-process tests, in a process of its own.
func TestMultiProcFollower(t *testing.T) {
	role := os.Getenv(mpRoleEnv)
	if role == "" {
		t.Skip("rank 1 of the multi-process tests, which start it")
	}
	env, err := dist.ProcessEnvFromOS()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	m, err := Load(ctx, os.Getenv(mpModelEnv), mpRank(t, env))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !m.Follower() {
		t.Fatalf("rank %d does not follow", m.Rank())
	}
	if at, ok := strings.CutPrefix(role, "die:"); ok {
		n, err := strconv.Atoi(at)
		if err != nil {
			t.Fatal(err)
		}
		l, err := CacheLayout(m.Graph)
		if err != nil {
			t.Fatal(err)
		}
		t.Fatalf("rank 1 outlived its death at step %d: %v", n, steps.Follow(ctx, &dyingRank{Executable: m.Program, at: n}, l.Cache, m.proc.conn))
	}
	if err := m.Follow(ctx); err != nil {
		t.Fatal(err)
	}
	t.Log("rank 0 said goodbye")
}
