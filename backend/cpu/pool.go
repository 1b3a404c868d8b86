package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// A shared pool of worker goroutines for the fast kernels. parallel offers a job to the
// workers and runs it on the calling goroutine too; chunks are claimed dynamically, so
// whoever is free does the work. A worker that picks a job up after the caller has finished
// it skips it, and the caller waits only for workers that really joined, so parallel never
// waits for a busy worker: concurrent runs, and parallel calls from inside a job, get fewer
// helpers instead of deadlocking or oversubscribing the cores.

// job is one call of parallel: chunks [c*chunk, min((c+1)*chunk, n)) claimed in order.
type job struct {
	f        func(lo, hi int)
	n, chunk int
	next     atomic.Int64

	mu     sync.Mutex
	cond   sync.Cond // signalled when the last worker leaves a closed job
	closed bool      // the caller is done: late workers skip the job
	active int       // workers running chunks of the job
}

// run claims and runs chunks until none is left.
func (j *job) run() {
	for {
		c := int(j.next.Add(1) - 1)
		lo := c * j.chunk
		if lo >= j.n {
			return
		}
		clearVectorState()
		j.f(lo, min(lo+j.chunk, j.n))
	}
}

// help is what a pool worker does with a job it received.
func (j *job) help() {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return
	}
	j.active++
	j.mu.Unlock()
	j.run()
	j.mu.Lock()
	if j.active--; j.active == 0 && j.closed {
		j.cond.Signal()
	}
	j.mu.Unlock()
}

var pool struct {
	mu      sync.Mutex
	workers int       // goroutines started so far
	jobs    chan *job // offers; a worker skips those whose caller is already done
}

// poolJobs makes sure at least n worker goroutines exist and returns the job channel.
func poolJobs(n int) chan *job {
	pool.mu.Lock()
	defer pool.mu.Unlock()
	if pool.jobs == nil {
		pool.jobs = make(chan *job, 256)
	}
	for ; pool.workers < n; pool.workers++ {
		go worker(pool.jobs)
	}
	return pool.jobs
}

// spinFor is how long a worker keeps polling for the next job after one ends before it
// blocks: a step's kernels offer jobs microseconds apart, and a blocked worker takes tens of
// microseconds (more under a hypervisor) to wake.
const spinFor = 100 * time.Microsecond

// worker runs the jobs offered on jobs; after each it polls for the next one for spinFor
// (yielding its core to any other goroutine between polls) before it blocks.
func worker(jobs chan *job) {
	for {
		j, ok := <-jobs
		if !ok {
			return
		}
		for j != nil {
			j.help()
			j = nil
			for start := time.Now(); j == nil && time.Since(start) < spinFor; {
				select {
				case j, ok = <-jobs:
					if !ok {
						return
					}
				default:
					runtime.Gosched()
				}
			}
		}
	}
}

// parallel runs f over [0, n) split into chunks of grain items (the last one shorter),
// on the calling goroutine and up to runtime.GOMAXPROCS(0)-1 pool workers, and returns
// when every chunk is done. f must be safe to call concurrently on disjoint ranges.
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
	jobs := poolJobs(helpers)
	j := &job{f: f, n: n, chunk: grain}
	j.cond.L = &j.mu
	for range helpers {
		select {
		case jobs <- j:
		default: // the queue is full of offers: do without
		}
	}
	j.run()
	j.mu.Lock()
	j.closed = true
	for j.active > 0 {
		j.cond.Wait()
	}
	j.mu.Unlock()
}

// grainFor picks a chunk size for n items of cost work each (in multiply-adds or similar):
// about twelve chunks per core for balance (the caller waits at the end for the chunk a
// worker is still in: at four a core that was 5% of a 128-token prefill on 2 cores, at
// twelve 1-2%), but no chunk under minWork, and a multiple of align items (align >= 1).
func grainFor(n, work, align int) int {
	const minWork = 1 << 15
	procs := runtime.GOMAXPROCS(0)
	g := (n + 12*procs - 1) / (12 * procs)
	g = max(g, (minWork+max(work, 1)-1)/max(work, 1))
	g = (g + align - 1) / align * align
	return max(g, align)
}
