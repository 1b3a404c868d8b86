package transform

import (
	"fmt"
	"strings"
)

// Stage is a step of the pipeline. Stages run in the order of their values; within a stage,
// transforms run in the order default.yaml lists them.
type Stage int

// The stages, in pipeline order. The table in stages below says why each comes where it does.
// Every stage holds transforms: weights are read, and the graph lowered, by the backend's
// compile after the pipeline, not by stages of it.
const (
	PostExport Stage = iota + 1
	PatternMatcher
	Sharding
	PostLoadFusion
	CacheInit
)

// stages is the pass table: one row per stage, in order, with the reason it sits there.
var stages = []struct {
	stage  Stage
	name   string
	reason string
}{
	{PostExport, "post_export",
		"cleanups first, so that every later pattern sees one canonical form of the exported graph"},
	{PatternMatcher, "pattern_matcher",
		"recognise RMSNorm, rotary embedding, attention, SwiGLU, MoE while the graph is still one plain graph"},
	{Sharding, "sharding",
		"split the recognised layers over ranks; one graph becomes one graph per rank"},
	{PostLoadFusion, "post_load_fusion",
		"fusions on each rank's own graph: joined weights, which the backend folds as it loads them, and the final collectives (fuse_gemms, fused all-reduce + norm)"},
	{CacheInit, "cache_init",
		"insert the paged KV cache once attention, sharding and fusions are final"},
}

// Stages returns every stage in pipeline order.
func Stages() []Stage {
	out := make([]Stage, len(stages))
	for i, s := range stages {
		out[i] = s.stage
	}
	return out
}

// String returns the stage's name as it appears in configuration and logs, such as
// "post_export".
func (s Stage) String() string {
	if s >= PostExport && int(s) <= len(stages) {
		return stages[s-1].name
	}
	return fmt.Sprintf("stage(%d)", int(s))
}

// Reason says why the stage sits where it does in the pipeline.
func (s Stage) Reason() string {
	if s.Valid() {
		return stages[s-1].reason
	}
	return ""
}

// Valid reports whether s is one of the declared stages.
func (s Stage) Valid() bool { return s >= PostExport && int(s) <= len(stages) }

// ParseStage reads a stage name such as "post_export".
func ParseStage(name string) (Stage, error) {
	names := make([]string, len(stages))
	for i, s := range stages {
		if s.name == name {
			return s.stage, nil
		}
		names[i] = s.name
	}
	return 0, fmt.Errorf("unknown stage %q (want one of %s)", name, strings.Join(names, ", "))
}
