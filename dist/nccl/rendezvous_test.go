package nccl

import (
	"bufio"
	"context"
	"errors"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/loom-ml/loom/dist"
)

// These tests need no GPU: the rendezvous and the liveness channel are plain TCP, run here
// between goroutines on 127.0.0.1.

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestParseEnv(t *testing.T) {
	full := map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
	with := func(k, v string) map[string]string {
		m := maps.Clone(full)
		if v == "-" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    Env
		wantErr string
	}{
		{"full", full, Env{Rank: 1, WorldSize: 2, LocalRank: 1, MasterAddr: "127.0.0.1", MasterPort: 29500}, ""},
		{"local rank defaults to rank", with("LOCAL_RANK", "-"), Env{Rank: 1, WorldSize: 2, LocalRank: 1, MasterAddr: "127.0.0.1", MasterPort: 29500}, ""},
		{"no rank", with("RANK", "-"), Env{}, "RANK is not set"},
		{"no world size", with("WORLD_SIZE", "-"), Env{}, "WORLD_SIZE is not set"},
		{"no master addr", with("MASTER_ADDR", "-"), Env{}, "MASTER_ADDR is not set"},
		{"no master port", with("MASTER_PORT", "-"), Env{}, "MASTER_PORT is not set"},
		{"rank not a number", with("RANK", "one"), Env{}, `RANK="one" is not an integer`},
		{"rank out of range", with("RANK", "2"), Env{}, "RANK=2 out of range for WORLD_SIZE=2"},
		{"negative rank", with("RANK", "-1"), Env{}, "RANK=-1 out of range"},
		{"zero world", with("WORLD_SIZE", "0"), Env{}, "WORLD_SIZE=0, want at least 1"},
		{"bad port", with("MASTER_PORT", "70000"), Env{}, "MASTER_PORT=70000 is not a TCP port"},
		{"bad local rank", with("LOCAL_RANK", "x"), Env{}, `LOCAL_RANK="x" is not an integer`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseEnv(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
			if got.Addr() != "127.0.0.1:29500" {
				t.Errorf("Addr() = %q", got.Addr())
			}
		})
	}
}

type rdvResult struct {
	peers   *Peers
	payload []byte
	err     error
	elapsed time.Duration
}

// startRanks runs Rendezvous for the given ranks of a world of size, each in a goroutine,
// and returns their results by rank once all have returned.
func startRanks(ctx context.Context, t *testing.T, port, size int, ranks []int, opts Options) (map[int]rdvResult, *atomic.Int32) {
	t.Helper()
	var calls atomic.Int32
	newID := func() ([]byte, error) {
		calls.Add(1)
		return []byte("the-unique-id"), nil
	}
	var mu sync.Mutex
	res := map[int]rdvResult{}
	var wg sync.WaitGroup
	for _, r := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			env := Env{Rank: r, WorldSize: size, LocalRank: r, MasterAddr: "127.0.0.1", MasterPort: port}
			start := time.Now()
			p, payload, err := Rendezvous(ctx, env, opts, newID)
			mu.Lock()
			res[r] = rdvResult{p, payload, err, time.Since(start)}
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, r := range res {
			if r.peers != nil {
				r.peers.Close()
			}
		}
	})
	return res, &calls
}

func mustJoin(t *testing.T, res map[int]rdvResult) {
	t.Helper()
	for r, x := range res {
		if x.err != nil {
			t.Fatalf("rank %d: %v", r, x.err)
		}
		if string(x.payload) != "the-unique-id" {
			t.Fatalf("rank %d got payload %q", r, x.payload)
		}
	}
}

// waitFailure waits for p to learn a failure, at most d.
func waitFailure(t *testing.T, p *Peers, d time.Duration) error {
	t.Helper()
	select {
	case <-p.Failed():
		return p.Err()
	case <-time.After(d):
		t.Fatalf("rank %d learnt no failure within %v", p.Rank(), d)
		return nil
	}
}

func TestRendezvousHandsOutOneID(t *testing.T) {
	for _, size := range []int{1, 2, 4} {
		t.Run(strconv.Itoa(size)+" ranks", func(t *testing.T) {
			ranks := make([]int, size)
			for i := range ranks {
				ranks[i] = size - 1 - i // the others start before rank 0 listens
			}
			res, calls := startRanks(context.Background(), t, freePort(t), size, ranks, Options{Timeout: 5 * time.Second})
			mustJoin(t, res)
			if calls.Load() != 1 {
				t.Errorf("newID called %d times, want once (on rank 0)", calls.Load())
			}
			for r, x := range res {
				if x.peers.Rank() != r || x.peers.Size() != size || x.peers.Err() != nil {
					t.Errorf("rank %d: Rank %d Size %d Err %v", r, x.peers.Rank(), x.peers.Size(), x.peers.Err())
				}
			}
		})
	}
}

func TestRendezvousTimeoutNamesMissingRank(t *testing.T) {
	port := freePort(t)
	res, _ := startRanks(context.Background(), t, port, 3, []int{0, 1}, Options{Timeout: 300 * time.Millisecond})
	for _, r := range []int{0, 1} {
		err := res[r].err
		if err == nil || !errors.Is(err, dist.ErrTimeout) || !strings.Contains(err.Error(), "waiting for rank 2 to connect") {
			t.Errorf("rank %d: got %v, want a timeout naming rank 2", r, err)
		}
		if res[r].elapsed > 5*time.Second {
			t.Errorf("rank %d took %v to give up", r, res[r].elapsed)
		}
	}
	// A rank with nobody listening times out too, naming rank 0.
	res, _ = startRanks(context.Background(), t, freePort(t), 2, []int{1}, Options{Timeout: 200 * time.Millisecond})
	if err := res[1].err; err == nil || !errors.Is(err, dist.ErrTimeout) || !strings.Contains(err.Error(), "connecting to rank 0") {
		t.Errorf("rank 1 alone: got %v, want a timeout connecting to rank 0", err)
	}
}

func TestRendezvousContextCancel(t *testing.T) {
	for _, rank := range []int{0, 1} {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		res, _ := startRanks(ctx, t, freePort(t), 2, []int{rank}, Options{Timeout: time.Minute})
		if err := res[rank].err; !errors.Is(err, context.Canceled) || res[rank].elapsed > 5*time.Second {
			t.Errorf("rank %d: got %v after %v, want context.Canceled at once", rank, err, res[rank].elapsed)
		}
	}
}

func TestRendezvousRejectsInconsistentWorld(t *testing.T) {
	port := freePort(t)
	var wg sync.WaitGroup
	var err0, err1 error
	wg.Add(2)
	go func() {
		defer wg.Done()
		_, _, err0 = Rendezvous(context.Background(), Env{Rank: 0, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: port},
			Options{Timeout: 5 * time.Second}, func() ([]byte, error) { return []byte("id"), nil })
	}()
	go func() {
		defer wg.Done()
		_, _, err1 = Rendezvous(context.Background(), Env{Rank: 1, WorldSize: 3, MasterAddr: "127.0.0.1", MasterPort: port},
			Options{Timeout: 5 * time.Second}, nil)
	}()
	wg.Wait()
	for i, err := range []error{err0, err1} {
		if err == nil || !strings.Contains(err.Error(), "rank 1 has WORLD_SIZE=3, rank 0 has 2") {
			t.Errorf("rank %d: got %v, want the WORLD_SIZE mismatch", i, err)
		}
	}
}

func TestPeerFailures(t *testing.T) {
	opts := Options{Timeout: 5 * time.Second, Heartbeat: 20 * time.Millisecond, PeerTimeout: 2 * time.Second}
	for _, tc := range []struct {
		name    string
		victim  int
		act     func(p *Peers)
		how     string
		because string
	}{
		{"rank 2 crashes", 2, func(p *Peers) { p.kill() }, "rank 2 died or disconnected", ""},
		{"rank 0 crashes", 0, func(p *Peers) { p.kill() }, "rank 0 died or disconnected", ""},
		{"rank 1 closes", 1, func(p *Peers) { p.Close() }, "rank 1 left", "closed its world"},
		{"rank 1 aborts", 1, func(p *Peers) { p.Abort("cuda out of memory") }, "rank 1 aborted", "cuda out of memory"},
		{"rank 0 aborts", 0, func(p *Peers) { p.Abort("timed out") }, "rank 0 aborted", "timed out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, _ := startRanks(context.Background(), t, freePort(t), 3, []int{0, 1, 2}, opts)
			mustJoin(t, res)
			start := time.Now()
			tc.act(res[tc.victim].peers)
			for r := range 3 {
				if r == tc.victim {
					continue
				}
				err := waitFailure(t, res[r].peers, 3*time.Second)
				var pe *PeerError
				if !errors.As(err, &pe) || pe.Rank != tc.victim || !errors.Is(err, dist.ErrPeerFailed) ||
					!strings.Contains(err.Error(), tc.how) || !strings.Contains(err.Error(), tc.because) {
					t.Errorf("rank %d learnt %v; want %q ... %q (a *PeerError for rank %d)", r, err, tc.how, tc.because, tc.victim)
				}
				if tc.victim != 0 && r != 0 && !strings.Contains(err.Error(), "reported by rank 0") {
					t.Errorf("rank %d learnt %v; want it relayed by rank 0", r, err)
				}
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("the failure took %v to reach every rank", d)
			}
		})
	}
}

// A peer that connects and then goes silent (a stopped process) is declared failed after
// PeerTimeout.
func TestSilentPeerStopsResponding(t *testing.T) {
	port := freePort(t)
	opts := Options{Timeout: 5 * time.Second, Heartbeat: 20 * time.Millisecond, PeerTimeout: 200 * time.Millisecond}
	done := make(chan rdvResult, 1)
	go func() {
		p, id, err := Rendezvous(context.Background(), Env{Rank: 0, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: port}, opts,
			func() ([]byte, error) { return []byte("id"), nil })
		done <- rdvResult{peers: p, payload: id, err: err}
	}()
	var conn net.Conn
	for {
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			conn = c
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer conn.Close()
	if err := writeFrame(conn, msgHello, helloPayload(1, 2)); err != nil {
		t.Fatal(err)
	}
	if typ, payload, err := readFrame(bufio.NewReader(conn)); err != nil || typ != msgWelcome || string(payload) != "id" {
		t.Fatalf("welcome: %d %q %v", typ, payload, err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.peers.Close()
	err := waitFailure(t, r.peers, 2*time.Second)
	if !strings.Contains(err.Error(), "rank 1 stopped responding: no heartbeat for 200ms") || !errors.Is(err, dist.ErrPeerFailed) {
		t.Errorf("got %v, want rank 1 stopped responding", err)
	}
}

// Liveness traffic alone keeps a quiet world healthy.
func TestHeartbeatsKeepWorldAlive(t *testing.T) {
	opts := Options{Timeout: 5 * time.Second, Heartbeat: 10 * time.Millisecond, PeerTimeout: 100 * time.Millisecond}
	res, _ := startRanks(context.Background(), t, freePort(t), 2, []int{0, 1}, opts)
	mustJoin(t, res)
	time.Sleep(400 * time.Millisecond)
	for r, x := range res {
		if err := x.peers.Err(); err != nil {
			t.Errorf("rank %d: %v after 400ms of heartbeats", r, err)
		}
	}
}
