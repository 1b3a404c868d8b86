// Package archtest holds tests of Loom's architecture (docs/ARCHITECTURE.md): which
// packages may import which. The engine and the server reach devices only through package
// backend's seam (no cubind, backend/cuda or dist/nccl among their dependencies); cmd/loom
// imports those only blank, to register them; package model imports no backend. It has no
// code of its own.
package archtest
