package transform

import (
	"context"
	"io"
	"log/slog"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Weights supplies parameter data to the weight_load stage and to transforms that need
// weight values. It has the method set of backend.Weights, so a checkpoint satisfies both;
// it is declared here because transform and backend sit on the same floor.
type Weights interface {
	// Load reads the tensor (or the slice of it) that ref names.
	Load(ctx context.Context, ref graph.ParamRef) (*tensor.Tensor, error)
}

// Context carries what transforms need beyond the graph. The optimizer sets Rank before each
// per-rank run; everything else is set by the caller and read by the transforms.
type Context struct {
	// Arch is the model's architecture (its model_type, such as "llama"), for transforms that
	// need to know; the configuration overlay is chosen by it too (see ConfigOptions.Arch).
	Arch string
	// WorldSize is the number of ranks the model is deployed on; 0 counts as 1.
	WorldSize int
	// Rank is the rank whose graph a per-rank transform is running on. Before the sharding
	// stage splits the graph there is one graph, run as rank 0.
	Rank int
	// Weights supplies parameter data; nil until a checkpoint is open.
	Weights Weights
	// Logger receives the summary lines and the transforms' own messages; nil discards them.
	Logger *slog.Logger

	state map[string]any
}

// World returns the number of ranks, at least 1.
func (c *Context) World() int {
	if c.WorldSize < 1 {
		return 1
	}
	return c.WorldSize
}

// Log returns the logger, never nil.
func (c *Context) Log() *slog.Logger {
	if c.Logger == nil {
		return discard
	}
	return c.Logger
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// Store keeps a value for later transforms, such as the sharding plan that detect_sharding
// computes and sharding_executor applies. Keys are conventionally the storing transform's
// name.
func (c *Context) Store(key string, v any) {
	if c.state == nil {
		c.state = map[string]any{}
	}
	c.state[key] = v
}

// Load returns a value kept by Store.
func (c *Context) Load(key string) (any, bool) {
	v, ok := c.state[key]
	return v, ok
}
