// Package dist describes how the ranks of a multi-device deployment are arranged and how they
// talk: a Mesh of named axes (tp=2,dp=2), the Group of ranks along one axis, and the
// Communicator interface that every backend implements (all_reduce, all_gather,
// reduce_scatter, all_to_all, broadcast, barrier).
//
// Every collective names its Group. Nothing defaults to "the world": a graph bound to a 2-D
// mesh reduces over its tp group only, and a caller who wants every rank asks for the world
// group by name (Mesh.Group(rank, WorldAxis)).
//
// Backends live in subpackages: dist/local (ranks are goroutines of one process sharing
// memory; the CPU backend and tests) and, with the GPU work, dist/nccl. This package imports
// no backend; the plain strings of the configuration (dist_backend, allreduce_strategy) are
// resolved here by ResolveBackend and StrategyFor, so that the sharding pass and the op
// catalog never import a backend either. A backend compiling a graph turns each collective
// node into a Collective (its attributes as plain values), binds it to the mesh with
// Collective.Bind, which checks the group axis and its size against the mesh, and runs the
// Bound collective on its rank's Communicator.
//
// # Numerics
//
// Reductions (Sum, Max) accept f32, bf16, f16 and i32 tensors. They fold the ranks' values in
// group rank order (Group.Ranks[0], then [1], ...), elementwise, whatever the algorithm, so
// every rank receives bit-identical results and a run is reproducible. bf16 and f16 values
// are widened to f32, reduced in f32 and rounded once at the end (to nearest, ties to even).
// i32 sums wrap around on overflow. Max propagates NaN. Data movement (all_gather,
// all_to_all, broadcast) copies elements of any dtype unchanged.
package dist
