package nccl

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/tensor"
)

// TestAllReduceLatency prints the time of one bf16 all_reduce on 2 GPUs (in-process
// worlds), from 8 KB to 16 MB, when LOOM_NCCL_BENCH=1. Columns: back-to-back Comm.AllReduce
// calls with one stream synchronisation at the end (NCCL's own latency), the same straight
// through cubind (the cost of Comm's checks), and each call followed by World.Sync (what a
// caller that waits for every collective sees).
func TestAllReduceLatency(t *testing.T) {
	if os.Getenv("LOOM_NCCL_BENCH") != "1" {
		t.Skip("set LOOM_NCCL_BENCH=1 to measure all_reduce latency")
	}
	ws := initWorlds(t, "tp=2")
	sizes := []int{8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20}
	type row struct{ plain, raw, synced time.Duration }
	rows := make([]row, len(sizes))
	var bar barrier
	bar.n = 2
	var hostCosts string
	onRanks(t, ws, func(w *World, s cubind.Stream) error {
		c, err := w.Axis("tp")
		if err != nil {
			return err
		}
		p, err := cubind.MemAlloc(uint64(sizes[len(sizes)-1]))
		if err != nil {
			return err
		}
		defer cubind.MemFree(p)
		if err := cubind.MemsetD8Async(p, 0, uint64(sizes[len(sizes)-1]), s); err != nil {
			return err
		}
		ctx := context.Background()
		for i, size := range sizes {
			count := size / 2
			iters := 200
			if size > 1<<20 {
				iters = 50
			}
			run := func(n int, syncEach, raw bool) (time.Duration, error) {
				bar.wait()
				start := time.Now()
				for range n {
					var err error
					if raw { // straight to cubind, without Comm's checks
						err = cubind.NCCLAllReduce(p, p, count, cubind.NCCLBfloat16, cubind.NCCLSum, c.Handle(), s)
					} else {
						err = c.AllReduce(p, p, count, tensor.BF16, dist.Sum, s)
					}
					if err != nil {
						return 0, err
					}
					if syncEach {
						if err := w.Sync(ctx, s); err != nil {
							return 0, err
						}
					}
				}
				if err := s.Synchronize(); err != nil {
					return 0, err
				}
				return time.Since(start) / time.Duration(n), nil
			}
			if _, err := run(10, false, false); err != nil { // warm up
				return err
			}
			plain, err := run(iters, false, false)
			if err != nil {
				return err
			}
			raw, err := run(iters, false, true)
			if err != nil {
				return err
			}
			synced, err := run(iters, true, false)
			if err != nil {
				return err
			}
			if w.Rank() == 0 {
				rows[i] = row{plain, raw, synced}
			}
		}
		if w.Rank() == 0 { // host cost of the calls Sync polls with
			const n = 10000
			start := time.Now()
			for range n {
				w.event.Done()
			}
			eventQuery := time.Since(start) / n
			start = time.Now()
			for range n {
				c.Handle().AsyncError()
			}
			asyncErr := time.Since(start) / n
			hostCosts = fmt.Sprintf("host cost per call: cuEventQuery %.2f us, ncclCommGetAsyncError %.2f us", us(eventQuery), us(asyncErr))
		}
		return nil
	})
	var b strings.Builder
	fmt.Fprintf(&b, "all_reduce bf16, 2 GPUs, in-process worlds (NCCL %s)\n", ncclVersionString())
	fmt.Fprintf(&b, "%10s %10s %14s %16s %12s\n", "bytes", "us/call", "raw cubind us", "us/call+Sync", "algbw GB/s")
	for i, size := range sizes {
		r := rows[i]
		fmt.Fprintf(&b, "%10s %10.1f %14.1f %16.1f %12.1f\n", byteSize(size), us(r.plain), us(r.raw), us(r.synced), float64(size)/float64(r.plain.Nanoseconds()))
	}
	fmt.Fprintln(&b, hostCosts)
	fmt.Print(b.String())
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func byteSize(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%d MB", n>>20)
	}
	return fmt.Sprintf("%d KB", n>>10)
}

func ncclVersionString() string {
	v, err := cubind.NCCLVersion()
	if err != nil {
		return "?"
	}
	return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100)
}

// barrier lets n goroutines start a measurement together.
type barrier struct {
	mu    sync.Mutex
	cond  *sync.Cond
	n     int
	count int
	gen   int
}

func (b *barrier) wait() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cond == nil {
		b.cond = sync.NewCond(&b.mu)
	}
	gen := b.gen
	b.count++
	if b.count == b.n {
		b.count = 0
		b.gen++
		b.cond.Broadcast()
		return
	}
	for gen == b.gen {
		b.cond.Wait()
	}
}
