package backend

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Auto is the device name that picks a backend: the registered backend of highest priority
// that can run the deployment (see Resolve).
const Auto = "auto"

// Backend is a way to run graphs, registered under the device name that selects it ("cpu",
// "cuda"). Backends register themselves when their package is imported (Register in an
// init function); cmd/loom imports backend/all, which imports every backend.
type Backend interface {
	// Name is the device name: what --device and engine.LoadOptions.Device take.
	Name() string
	// Priority orders "auto": of the backends that can run a deployment, the one of highest
	// priority is picked.
	Priority() int
	// Devices reports how many devices of this backend the machine has (GPUs), or why none
	// can be used. A backend whose ranks share one device (the CPU) reports 1.
	Devices() (int, error)
	// Check reports why this machine cannot run a deployment of needs on this backend (nil
	// when it can): no usable device, too few devices for the mesh, a graph or a process
	// layout the backend does not run (errors wrap ErrPlainGraph or ErrProcesses then), a
	// communicator it does not talk through. It is cheap: nothing is opened or compiled.
	Check(needs Needs) error
	// Deploy compiles the ranks of a deployment that this process runs.
	Deploy(ctx context.Context, spec Spec) (*Deployment, error)
}

// Needs is what a deployment asks of a backend before anything is loaded (see Check).
type Needs struct {
	// Mesh is the deployment's ranks; the zero Mesh is one rank.
	Mesh dist.Mesh
	// PlainGraph is set when the graph is not optimized: it holds every primitive op the
	// frontend writes.
	PlainGraph bool
	// Process is set when this process runs one rank of a world of one process per rank.
	Process *dist.ProcessEnv
	// DistBackend is the communicator asked for: auto (""), local or nccl.
	DistBackend string
}

// Ranks is the number of ranks of the mesh (1 for the zero Mesh).
func (n Needs) Ranks() int { return max(n.Mesh.Size(), 1) }

// Errors that Check wraps, for callers that say what to change.
var (
	// ErrPlainGraph: the backend runs optimized graphs only (the plain graph has ops without
	// kernels of its own).
	ErrPlainGraph = errors.New("runs the optimized graph only")
	// ErrProcesses: the backend does not run one process per rank.
	ErrProcesses = errors.New("does not run one process per rank")
)

// Spec is what a backend compiles: the graph of each rank, its weights, how the ranks talk,
// and the executables' options.
type Spec struct {
	// Graphs holds one graph per rank of Mesh, in rank order, or one graph that every rank
	// runs (one rank, or a graph no transform split).
	Graphs []*graph.Graph
	// Weights supplies the params; each rank reads only its own slices.
	Weights graph.Weights
	// Mesh is the deployment's ranks; the zero Mesh is one rank.
	Mesh dist.Mesh
	// Process, when set, makes this process compile rank Process.Rank only and join the
	// other processes of the world (each compiles its own rank), waiting for them within
	// ProcessOptions. Graphs still holds every rank's graph.
	Process        *dist.ProcessEnv
	ProcessOptions dist.ProcessOptions
	// ActivationDType is the dtype the graphs compute activations in (f32 when Invalid);
	// backend/cuda multiplies every linear in f32 with f32 activations.
	ActivationDType tensor.DType
	// Resident, when set, names the inputs that the executables keep on their devices (the
	// KV caches; see Resident); nil keeps none.
	Resident func(input string) bool
	// Capture records each step's device work once per bucket of shapes and replays it
	// (CUDA graphs); backends that cannot ignore it.
	Capture bool
	// Profile times every op of every run (see Profiler); backends that cannot ignore it.
	Profile bool
}

// Deployment is what Deploy made: the executables of this process's ranks and what they
// hold (devices, communicators), released by Close.
type Deployment struct {
	// Ranks are the ranks this process runs, in order; Programs their executables.
	Ranks    []int
	Programs []Executable
	// Device describes the device of the first rank, for logs.
	Device string
	// WeightBytes is the bytes of weights the first rank's executable holds.
	WeightBytes int
	// FreeMemory, when set, reports the least device memory free among this process's
	// devices (after the weights): the engine sizes its KV cache from it. Nil when the
	// executables run in host memory.
	FreeMemory func() (uint64, error)
	// Timeout is, with Spec.Process, how long a wait for another process may take (the
	// collectives' timeout): a rank silent for longer has failed.
	Timeout time.Duration
	// Close releases the executables, the communicators and the devices.
	Close func() error
}

var registry = struct {
	sync.Mutex
	byName map[string]Backend
}{byName: map[string]Backend{}}

// Register makes b available under b.Name(). It panics when the name is empty, "auto" or
// taken: backends register once, from an init function.
func Register(b Backend) {
	registry.Lock()
	defer registry.Unlock()
	name := b.Name()
	if name == "" || name == Auto {
		panic(fmt.Sprintf("backend: cannot register a backend named %q", name))
	}
	if _, dup := registry.byName[name]; dup {
		panic("backend: " + name + " registered twice")
	}
	registry.byName[name] = b
}

// Lookup returns the backend registered under name.
func Lookup(name string) (Backend, bool) {
	registry.Lock()
	defer registry.Unlock()
	b, ok := registry.byName[name]
	return b, ok
}

// Backends returns the registered backends, highest priority first.
func Backends() []Backend {
	registry.Lock()
	bs := make([]Backend, 0, len(registry.byName))
	for _, b := range registry.byName {
		bs = append(bs, b)
	}
	registry.Unlock()
	slices.SortFunc(bs, func(a, b Backend) int {
		if a.Priority() != b.Priority() {
			return b.Priority() - a.Priority()
		}
		return strings.Compare(a.Name(), b.Name())
	})
	return bs
}

// Names lists what Resolve takes: auto and the registered device names, sorted.
func Names() []string {
	var names []string
	for _, b := range Backends() {
		names = append(names, b.Name())
	}
	slices.Sort(names)
	return append([]string{Auto}, names...)
}

// Resolve is the device resolver: it turns a device name into the backend that runs a
// deployment of needs, with the reason it was picked, for a log line. A name picks its
// backend, which must be able to run the deployment (else the error says why, after "device
// NAME: "); auto ("" too) picks the backend of highest priority whose Check passes, and the
// reason says why those above it could not.
func Resolve(device string, needs Needs) (Backend, string, error) {
	if device != "" && device != Auto {
		b, ok := Lookup(device)
		if !ok {
			names := Names()
			want := names[0]
			if n := len(names); n > 1 {
				want = strings.Join(names[:n-1], ", ") + " or " + names[n-1]
			}
			return nil, "", fmt.Errorf("unknown device %q: want %s", device, want)
		}
		if err := b.Check(needs); err != nil {
			return nil, "", fmt.Errorf("device %s: %w", device, err)
		}
		return b, "asked for", nil
	}
	var skipped []string
	for _, b := range Backends() {
		err := b.Check(needs)
		if err == nil {
			if len(skipped) == 0 {
				return b, "auto: " + b.Name() + " can run it", nil
			}
			return b, "auto: " + strings.Join(skipped, "; "), nil
		}
		msg, _, _ := strings.Cut(err.Error(), "\n")
		skipped = append(skipped, b.Name()+": "+strings.TrimSuffix(msg, "; tried:"))
	}
	if len(skipped) == 0 {
		return nil, "", errors.New("device auto: no backend is registered (import backend/all)")
	}
	return nil, "", fmt.Errorf("device auto: no backend can run it (%s)", strings.Join(skipped, "; "))
}
