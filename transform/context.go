package transform

import (
	"io"
	"log/slog"

	"github.com/loom-ml/loom/graph"
)

// Context carries what transforms need beyond the graph. The optimizer sets Rank before each
// per-rank run; the other fields are set by the caller and read by the transforms. Values
// that transforms hand on to later ones (and the caller's sharding setup) travel under typed
// keys (see Key).
type Context struct {
	// Arch is the model's architecture (its model_type, such as "llama"), for transforms that
	// need to know; the configuration overlay is chosen by it too (see ConfigOptions.Arch).
	Arch string
	// WorldSize is the number of ranks the model is deployed on; 0 counts as 1.
	WorldSize int
	// Rank is the rank whose graph a per-rank transform is running on. Before the sharding
	// stage splits the graph there is one graph, run as rank 0.
	Rank int
	// Weights supplies parameter data (graph.Weights); nil until a checkpoint is open.
	Weights graph.Weights
	// Logger receives the summary lines and the transforms' own messages; nil discards them.
	Logger *slog.Logger

	values map[any]any // by *Key[T]; see Key
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

// Key names a value of type T that a Context carries from one transform to later ones (or
// from the caller to the transforms), such as the sharding plan that detect_sharding makes
// and sharding_executor applies. Keys are package-level variables made by NewKey and compared
// by identity, never by name, so a misspelt key does not compile and a value comes back with
// the type it was set with.
type Key[T any] struct{ name string }

// NewKey makes a key; name describes the value in messages ("detect_sharding's plan") and
// need not be unique.
func NewKey[T any](name string) *Key[T] { return &Key[T]{name: name} }

// String returns the key's name.
func (k *Key[T]) String() string { return k.name }

// Set keeps v in c under k, replacing any value set before.
func (k *Key[T]) Set(c *Context, v T) {
	if c.values == nil {
		c.values = map[any]any{}
	}
	c.values[k] = v
}

// Get returns the value kept in c under k, and whether there is one.
func (k *Key[T]) Get(c *Context) (T, bool) {
	v, ok := c.values[k].(T)
	return v, ok
}

// enabledKey holds the names of the transforms the optimizer runs (Optimizer.Run sets it),
// for a transform whose work depends on a later one's (see Enabled).
var enabledKey = NewKey[map[string]bool]("the enabled transforms")

// Enabled reports whether the optimizer running c's transforms runs t. Outside the
// optimizer (Apply, golden tests) it reports false.
func Enabled(c *Context, t *Transform) bool {
	m, _ := enabledKey.Get(c)
	return m[t.Name]
}
