package nccl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/tensor"
)

// The multi-process tests start this test binary again as each rank, with roleEnv naming
// what the rank does (TestMain hands over to runRole) and the torchrun variables set, as
// `loom launch` would.

const roleEnv = "LOOM_NCCL_TEST_ROLE"

type rankRun struct {
	code   int
	output string
}

// spawnRanks runs n ranks of role and waits for them all, at most timeout.
func spawnRanks(t *testing.T, role string, n int, timeout time.Duration) []rankRun {
	t.Helper()
	port := freePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	runs := make([]rankRun, n)
	var wg sync.WaitGroup
	for r := range n {
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), roleEnv+"="+role, EnvRank+"="+strconv.Itoa(r), EnvWorldSize+"="+strconv.Itoa(n),
			EnvLocalRank+"="+strconv.Itoa(r), EnvMasterAddr+"=127.0.0.1", EnvMasterPort+"="+strconv.Itoa(port))
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := cmd.Wait()
			runs[r] = rankRun{code: cmd.ProcessState.ExitCode(), output: out.String()}
			if err != nil && ctx.Err() != nil {
				runs[r].output += fmt.Sprintf("\n(killed: the ranks did not finish within %v)", timeout)
			}
		}()
	}
	wg.Wait()
	for r, run := range runs {
		t.Logf("rank %d exited with %d:\n%s", r, run.code, strings.TrimSpace(run.output))
	}
	return runs
}

func TestMultiProcessAllReduce(t *testing.T) {
	needGPUs(t, 2)
	runs := spawnRanks(t, "allreduce", 2, 2*time.Minute)
	for r, run := range runs {
		if run.code != 0 || !strings.Contains(run.output, "all_reduce ok") {
			t.Errorf("rank %d: exit %d, want 0 and \"all_reduce ok\"", r, run.code)
		}
	}
}

// Rank 1 exits abruptly while rank 0 waits in an all_reduce: rank 0 must get an error
// naming rank 1 within seconds, not hang.
func TestMultiProcessRankDies(t *testing.T) {
	needGPUs(t, 2)
	runs := spawnRanks(t, "dies", 2, 2*time.Minute)
	if runs[1].code != 3 {
		t.Errorf("rank 1 exited with %d, want 3 (its abrupt exit)", runs[1].code)
	}
	if runs[0].code != 0 || !strings.Contains(runs[0].output, "detected rank 1's failure") {
		t.Errorf("rank 0: exit %d, want 0 and the failure of rank 1 detected", runs[0].code)
	}
}

// runRole is the body of a rank process; it returns the exit code.
func runRole(role string) int {
	env, err := EnvFromOS()
	if err != nil {
		fmt.Println(err)
		return 1
	}
	say := func(format string, args ...any) {
		fmt.Printf("rank %d: "+format+"\n", append([]any{env.Rank}, args...)...)
	}
	if err := rankMain(role, env, say); err != nil {
		say("FAIL: %v", err)
		return 1
	}
	return 0
}

func rankMain(role string, env Env, say func(string, ...any)) error {
	mesh, err := dist.ParseMesh("tp=" + strconv.Itoa(env.WorldSize))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	start := time.Now()
	w, err := Init(ctx, env, mesh, Options{Timeout: 30 * time.Second, Heartbeat: 100 * time.Millisecond, PeerTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	v, _ := cubind.NCCLVersion()
	say("world ready in %v (NCCL %d, %s=%s)", time.Since(start).Round(time.Millisecond), v, cubind.NCCLNVLSEnv, os.Getenv(cubind.NCCLNVLSEnv))
	s, err := cubind.StreamCreate(cubind.StreamNonBlocking)
	if err != nil {
		return err
	}
	c, err := w.Axis("tp")
	if err != nil {
		return err
	}
	const count = 4099
	p, err := cubind.MemAlloc(count * 4)
	if err != nil {
		return err
	}
	x := make([]float32, count)
	for i := range x {
		x[i] = float32(env.Rank+1) + float32(i)
	}
	if err := cubind.MemcpyHtoDAsync(p, x, s); err != nil {
		return err
	}
	if err := c.AllReduce(p, p, count, tensor.F32, dist.Sum, s); err != nil {
		return err
	}
	if err := w.Sync(ctx, s); err != nil {
		return err
	}
	if err := cubind.MemcpyDtoHAsync(x, p, s); err != nil {
		return err
	}
	n := env.WorldSize
	for i, got := range x {
		if want := float32(n*(n+1)/2 + n*i); got != want {
			return fmt.Errorf("all_reduce element %d = %v, want %v", i, got, want)
		}
	}
	say("all_reduce ok (%d f32 elements)", count)
	switch role {
	case "allreduce":
		if err := timeAllReduce(c, s, say); err != nil {
			return err
		}
		return w.Close()
	case "dies":
		if env.Rank == 1 {
			say("exiting abruptly")
			os.Exit(3)
		}
		start := time.Now()
		err := c.AllReduce(p, p, count, tensor.F32, dist.Sum, s)
		if err == nil {
			err = w.Sync(ctx, s)
		}
		took := time.Since(start)
		var pe *PeerError
		if err == nil || !errors.Is(err, dist.ErrPeerFailed) || !errors.As(err, &pe) || pe.Rank != 1 || took > 15*time.Second {
			return fmt.Errorf("after rank 1 died: got %v after %v; want an error naming rank 1 within seconds", err, took)
		}
		say("detected rank 1's failure in %v: %v", took.Round(time.Millisecond), err)
		if err := w.Close(); err != nil {
			say("close: %v", err)
		}
		return nil
	}
	return fmt.Errorf("unknown role %q", role)
}

// timeAllReduce measures back-to-back bf16 all_reduces on the multi-process (non-blocking)
// communicator, for comparison with TestAllReduceLatency's in-process figures.
func timeAllReduce(c *Comm, s cubind.Stream, say func(string, ...any)) error {
	const maxBytes = 16 << 20
	q, err := cubind.MemAlloc(maxBytes)
	if err != nil {
		return err
	}
	defer cubind.MemFree(q)
	if err := cubind.MemsetD8Async(q, 0, maxBytes, s); err != nil {
		return err
	}
	var line strings.Builder
	for _, size := range []int{8 << 10, 256 << 10, 1 << 20, 16 << 20} {
		const iters = 200
		for range 10 { // warm up
			if err := c.AllReduce(q, q, size/2, tensor.BF16, dist.Sum, s); err != nil {
				return err
			}
		}
		if err := s.Synchronize(); err != nil {
			return err
		}
		start := time.Now()
		for range iters {
			if err := c.AllReduce(q, q, size/2, tensor.BF16, dist.Sum, s); err != nil {
				return err
			}
		}
		if err := s.Synchronize(); err != nil {
			return err
		}
		fmt.Fprintf(&line, " %s %.1f us;", byteSize(size), float64(time.Since(start).Nanoseconds())/1e3/float64(iters))
	}
	say("bf16 all_reduce per call (2 processes):%s", line.String())
	return nil
}
