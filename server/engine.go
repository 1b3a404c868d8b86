package server

import (
	"context"

	"github.com/loom-ml/loom/engine"
)

// Engine is what the server needs of the runtime: submitting token-level requests, a
// snapshot of its state for metrics, and shutting it down after the last request.
type Engine interface {
	// Submit queues a request. Its stream ends with an event whose Finish is set; cancelling
	// ctx cancels the request and frees its KV cache blocks.
	Submit(ctx context.Context, req engine.Request) (Stream, error)
	// Stats returns a snapshot of the scheduler and KV cache.
	Stats() engine.Stats
	// Shutdown stops the engine once its requests have ended, or when ctx ends.
	Shutdown(ctx context.Context) error
}

// Stream delivers one request's events in order.
type Stream interface {
	// Recv blocks until the next event or until ctx ends. The last event of a stream has
	// Finish set; Recv after it returns an error.
	Recv(ctx context.Context) (engine.Event, error)
}

// FromEngine adapts the runtime's *engine.Engine to Engine.
func FromEngine(e *engine.Engine) Engine { return engineAdapter{e} }

type engineAdapter struct{ e *engine.Engine }

func (a engineAdapter) Submit(ctx context.Context, req engine.Request) (Stream, error) {
	st, err := a.e.Submit(ctx, req)
	if err != nil {
		return nil, err
	}
	return st, nil
}

func (a engineAdapter) Stats() engine.Stats                { return a.e.Stats() }
func (a engineAdapter) Shutdown(ctx context.Context) error { return a.e.Shutdown(ctx) }
