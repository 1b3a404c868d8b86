package cuda

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Loading weights: a param is read from the checkpoint into a page-locked (pinned) host
// buffer, which the GPU copies by DMA at the bus's speed, and several params are read and
// copied at once. Reading each into fresh Go memory and copying from there (pageable memory,
// which the driver stages through buffers of its own, one copy at a time) was most of a
// two-minute load of Qwen3-30B-A3B's 57 GB; this way its 61 GB of params take 4.4-4.9 s on
// an H200 host (docs/PERFORMANCE.md, session 11).
const (
	// uploadWorkers is how many params are read and copied at once, each worker with a
	// pinned buffer and a stream of its own.
	uploadWorkers = 4
	// pinnedBudget bounds the pinned buffers of one load together: fewer workers where
	// the largest param needs bigger buffers.
	pinnedBudget = 4 << 30
)

// maxStaging is the largest param read through a pinned buffer; a larger one is read into Go
// memory and copied from there. A variable for the tests.
var maxStaging = 2 << 30

// paramUpload is one param node and the device tensor it is copied to.
type paramUpload struct {
	node *graph.Node
	dst  *Tensor
}

// uploadParams allocates a device tensor for every param node (p.fixed) and fills it with
// the node's weights read through w. The device must be locked (inside do): the workers run
// with its context current but touch neither its allocator nor its stream, only streams of
// their own, and every copy has completed when uploadParams returns.
func (p *Program) uploadParams(ctx context.Context, nodes []*graph.Node, slot map[*graph.Value]int, w backend.Weights) error {
	d := p.dev
	jobs := make([]paramUpload, 0, len(nodes))
	staging, total := 0, 0
	for _, n := range nodes {
		if w == nil {
			ref, _ := graph.ParamOf(n)
			return fmt.Errorf("param %s: no weights given", ref)
		}
		typ := n.Out().Type
		shape, err := typ.Shape.Resolve(nil)
		if err != nil {
			return fmt.Errorf("param %s: %w", n.Attrs.String("key"), err)
		}
		t, err := d.allocTensor(typ.DType, shape)
		if err != nil {
			return fmt.Errorf("param %s: %w", n.Attrs.String("key"), err)
		}
		p.fixed[slot[n.Out()]] = t
		jobs = append(jobs, paramUpload{n, t})
		size := t.Numel() * t.DType.Size()
		total += size
		if size <= maxStaging {
			staging = max(staging, size)
		}
	}
	if len(jobs) == 0 {
		return nil
	}
	// Memory the allocator handed out may still be read by work queued on the device's
	// stream; the workers' streams are not ordered after it.
	if err := d.sync(); err != nil {
		return err
	}
	workers := min(uploadWorkers, len(jobs))
	if staging > 0 {
		workers = max(1, min(workers, pinnedBudget/staging))
	}
	start := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range workers {
		wg.Go(func() {
			err := d.current(func() error { return uploadWorker(ctx, jobs, &next, staging, w) })
			if err != nil {
				cancel()
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return firstCause(errs)
	}
	el := time.Since(start)
	slog.Debug("cuda: weights uploaded", "params", len(jobs), "bytes", total, "workers", workers,
		"elapsed", el.Round(time.Millisecond), "gb_per_s", fmt.Sprintf("%.1f", float64(total)/1e9/el.Seconds()))
	return nil
}

// firstCause is the error to report of the workers': the first that is not a
// cancellation, else the first.
func firstCause(errs []error) error {
	for _, err := range errs {
		if !errors.Is(err, context.Canceled) {
			return err
		}
	}
	return errs[0]
}

// uploadWorker takes jobs in turn until none is left: it reads each param into its pinned
// buffer (allocated on first use, staging bytes), copies it to the device on its own stream
// and waits for the copy before it reuses the buffer. A param larger than the buffer, or
// every param where pinned memory cannot be had, goes through Go memory instead. The device's
// context is current.
func uploadWorker(ctx context.Context, jobs []paramUpload, next *atomic.Int64, staging int, w backend.Weights) (err error) {
	s, err := cubind.StreamCreate(cubind.StreamNonBlocking)
	if err != nil {
		return fmt.Errorf("upload stream: %w", err)
	}
	var pinned []byte
	defer func() {
		err = errors.Join(err, s.Synchronize(), s.Destroy(), cubind.MemFreeHost(pinned))
	}()
	pinnedFailed := false
	for {
		i := int(next.Add(1) - 1)
		if i >= len(jobs) {
			return nil
		}
		j := jobs[i]
		size := j.dst.Numel() * j.dst.DType.Size()
		if size == 0 {
			continue
		}
		if pinned == nil && !pinnedFailed && size <= staging {
			if pinned, err = cubind.MemHostAlloc(staging); err != nil {
				slog.Debug("cuda: no pinned staging buffer, weights are copied from Go memory", "err", err)
				pinned, pinnedFailed = nil, true
			}
		}
		var src []byte
		if size <= len(pinned) {
			h, err := tensor.FromBytes(j.dst.DType, pinned[:size], j.dst.Shape...)
			if err != nil {
				return fmt.Errorf("param %s: %w", j.node.Attrs.String("key"), err)
			}
			if err := backend.LoadParamInto(ctx, j.node, w, h); err != nil {
				return err
			}
			src = pinned[:size]
		} else {
			h, err := backend.LoadParam(ctx, j.node, w)
			if err != nil {
				return err
			}
			src = tensor.Bytes(h)
		}
		if err := cubind.MemcpyHtoDAsync(j.dst.ptr, src, s); err != nil {
			return fmt.Errorf("param %s: copy to the device: %w", j.node.Attrs.String("key"), err)
		}
		if err := s.Synchronize(); err != nil {
			return fmt.Errorf("param %s: copy to the device: %w", j.node.Attrs.String("key"), err)
		}
	}
}
