package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// A shared pool of worker goroutines for the fast kernels. parallel hands a job to the
// workers that are idle at that moment and runs the rest of it on the calling goroutine, so
// it never waits for a busy worker: concurrent runs, and parallel calls from inside a job,
// simply get fewer helpers instead of deadlocking or oversubscribing the cores.

// job is one call of parallel: chunks [c*chunk, min((c+1)*chunk, n)) claimed in order.
type job struct {
	f        func(lo, hi int)
	n, chunk int
	next     atomic.Int64
	wg       sync.WaitGroup // helpers still running
}

// run claims and runs chunks until none is left.
func (j *job) run() {
	for {
		c := int(j.next.Add(1) - 1)
		lo := c * j.chunk
		if lo >= j.n {
			return
		}
		j.f(lo, min(lo+j.chunk, j.n))
	}
}

var pool struct {
	mu      sync.Mutex
	workers int       // goroutines started so far
	jobs    chan *job // unbuffered: a send succeeds only when a worker is idle
}

// poolWorkers makes sure at least n worker goroutines exist and returns the job channel.
func poolWorkers(n int) chan *job {
	pool.mu.Lock()
	defer pool.mu.Unlock()
	if pool.jobs == nil {
		pool.jobs = make(chan *job)
	}
	for ; pool.workers < n; pool.workers++ {
		go func(jobs chan *job) {
			for j := range jobs {
				j.run()
				j.wg.Done()
			}
		}(pool.jobs)
	}
	return pool.jobs
}

// parallel runs f over [0, n) split into chunks of grain items (the last one shorter),
// on the calling goroutine and up to runtime.GOMAXPROCS(0)-1 idle pool workers, and returns
// when every chunk is done. Chunks are claimed dynamically, so uneven progress (a shared
// machine) balances out. f must be safe to call concurrently on disjoint ranges.
func parallel(n, grain int, f func(lo, hi int)) {
	if n <= 0 {
		return
	}
	grain = max(grain, 1)
	chunks := (n + grain - 1) / grain
	helpers := min(runtime.GOMAXPROCS(0), chunks) - 1
	if helpers <= 0 {
		f(0, n)
		return
	}
	jobs := poolWorkers(helpers)
	j := &job{f: f, n: n, chunk: grain}
	for range helpers {
		j.wg.Add(1)
		select {
		case jobs <- j:
		default: // nobody idle: this goroutine does the work
			j.wg.Done()
		}
	}
	j.run()
	j.wg.Wait()
}

// grainFor picks a chunk size for n items of cost work each (in multiply-adds or similar):
// about four chunks per core for balance, but no chunk under minWork, and a multiple of
// align items (align >= 1).
func grainFor(n, work, align int) int {
	const minWork = 1 << 15
	procs := runtime.GOMAXPROCS(0)
	g := (n + 4*procs - 1) / (4 * procs)
	g = max(g, (minWork+max(work, 1)-1)/max(work, 1))
	g = (g + align - 1) / align * align
	return max(g, align)
}
