package model

import (
	"fmt"
	"sort"
	"strings"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// TensorInfoSource tells a frontend how each weight is stored (a Checkpoint implements it).
type TensorInfoSource interface {
	Info(name string) (TensorInfo, bool)
}

// BuildOptions tune the graph a frontend builds.
type BuildOptions struct {
	// ActivationDType is the dtype activations are computed in (f32 when unset). Norms and
	// softmax still compute in f32, as Hugging Face does.
	ActivationDType tensor.DType
	// Tensors, when set, gives each weight's stored dtype; otherwise the config's dtype is used.
	Tensors TensorInfoSource
}

// Architecture is a frontend: it builds the plain primitive graph of one family of models
// from a config.
type Architecture struct {
	// Name is the Hugging Face architecture name, e.g. "LlamaForCausalLM".
	Name string
	// Build returns the graph: inputs input_ids i32[B,S] and positions i32[B,S], output
	// logits f32[B,S,vocab].
	Build func(cfg *Config, opts BuildOptions) (*graph.Graph, error)
	// TPPlan is the architecture's own tensor-parallel plan, the "factory" source of the
	// detect_sharding transform; nil when the architecture declares none.
	TPPlan TPPlan
}

// TPPlan says how the weights of an architecture split for tensor parallelism: a weight name
// pattern maps to one of the TP* values. A pattern matches a weight's checkpoint name, or
// that name without its ".weight" suffix (the module); '*' matches any run of characters
// other than '.', so "model.layers.*.mlp.down_proj" names every layer's down projection.
// Where several patterns match, the most specific wins: the one with the fewest wildcards,
// then the most literal characters.
//
// Entries concern the linears that read a weight (its matrix products); an embedding lookup
// is always replicated, so an entry on the embedding table applies only to a linear that
// reads the same table (tied embeddings: the LM head). Biases and norm weights follow the
// linear they belong to and need no entries.
type TPPlan map[string]string

// The values of a TPPlan, as the detect_sharding transform reads them.
const (
	// TPColwise splits a linear's output features (the weight's rows): each rank computes a
	// slice of the output, which stays split for what follows (attention heads, SwiGLU).
	TPColwise = "colwise"
	// TPRowwise splits a linear's input features (the weight's columns): each rank computes a
	// partial sum of the whole output, which an all_reduce completes.
	TPRowwise = "rowwise"
	// TPGather splits the output features like TPColwise, then all_gathers them, so the
	// output is whole again (the LM head, split by vocabulary).
	TPGather = "gather"
	// TPReplicate keeps the whole weight on every rank.
	TPReplicate = "replicate"
)

var architectures = map[string]*Architecture{}

// RegisterArchitecture adds a frontend; frontend packages call it from init.
func RegisterArchitecture(a *Architecture) {
	if _, dup := architectures[a.Name]; dup {
		panic("model: duplicate architecture " + a.Name)
	}
	architectures[a.Name] = a
}

// Architectures lists the supported architecture names, sorted.
func Architectures() []string {
	names := make([]string, 0, len(architectures))
	for n := range architectures {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LookupArchitecture finds the frontend for a config's first architecture.
func LookupArchitecture(cfg *Config) (*Architecture, error) {
	if len(cfg.Architectures) == 0 {
		return nil, fmt.Errorf("config has no \"architectures\" entry; supported: %s", strings.Join(Architectures(), ", "))
	}
	name := cfg.Architectures[0]
	a, ok := architectures[name]
	if !ok {
		return nil, fmt.Errorf("unsupported architecture %q; supported: %s", name, strings.Join(Architectures(), ", "))
	}
	return a, nil
}

// BuildGraph builds the plain graph of a config with its architecture's frontend.
func BuildGraph(cfg *Config, opts BuildOptions) (*graph.Graph, error) {
	a, err := LookupArchitecture(cfg)
	if err != nil {
		return nil, err
	}
	if opts.ActivationDType == tensor.Invalid {
		opts.ActivationDType = tensor.F32
	}
	g, err := a.Build(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("build %s graph: %w", a.Name, err)
	}
	return g, nil
}
