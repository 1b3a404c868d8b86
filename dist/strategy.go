package dist

import "fmt"

// All-reduce strategies: the values of the allreduce_strategy option and of the strategy
// attribute of all_reduce nodes.
const (
	// StrategyAuto chooses by message size and group size (see StrategyFor).
	StrategyAuto = "auto"
	// StrategyNCCL leaves the algorithm to NCCL (GPU backends only).
	StrategyNCCL = "nccl"
	// StrategyOneShot: every rank reads every peer's whole buffer and reduces it itself. One
	// synchronisation, but each rank reads group size times the message.
	StrategyOneShot = "oneshot"
	// StrategyTwoShot: reduce-scatter (each rank reduces 1/n of the message), then
	// all-gather. Two synchronisations, but each rank reads about twice the message
	// whatever the group size.
	StrategyTwoShot = "twoshot"
)

// ParseStrategy checks an allreduce_strategy string; "" means StrategyAuto.
func ParseStrategy(s string) (string, error) {
	switch s {
	case "":
		return StrategyAuto, nil
	case StrategyAuto, StrategyNCCL, StrategyOneShot, StrategyTwoShot:
		return s, nil
	}
	return "", fmt.Errorf("dist: unknown allreduce_strategy %q (want %s, %s, %s or %s)", s, StrategyAuto, StrategyNCCL, StrategyOneShot, StrategyTwoShot)
}

// LocalCrossover is the rule that StrategyFor applies to StrategyAuto, measured for the
// local backend (ranks are goroutines sharing memory) with BenchmarkAllReduce in dist/local:
// oneshot below 16 KB per rank for 2 ranks and below 4 KB for 4, twoshot from there on;
// other group sizes follow the same curve, 64 KB / n² (1 KB for 8 ranks). Below it,
// oneshot's single synchronisation wins; above it, twoshot's smaller memory traffic (each
// rank reads about twice the message, not n times) does, by 1.5x to 3.5x from 128 KB.
var LocalCrossover = Crossover{TwoShotFrom: map[int]int{2: 16 << 10, 4: 4 << 10}, Scale: 64 << 10}

// Crossover is a measured all_reduce rule: the message size (bytes per rank) from which
// twoshot beats oneshot, by group size. GPU backends keep their own.
type Crossover struct {
	TwoShotFrom map[int]int // measured, by group size
	Scale       int         // other group sizes n: twoshot from Scale/n² bytes
}

// Strategy resolves strategy for a message of the given bytes over a group of groupSize
// ranks: StrategyAuto (or "") becomes StrategyOneShot or StrategyTwoShot by the rule; a
// group of one rank, or an empty message, always takes StrategyOneShot (nothing moves).
// Any other strategy is returned unchanged (check it with ParseStrategy).
func (c Crossover) Strategy(bytes, groupSize int, strategy string) string {
	if strategy != "" && strategy != StrategyAuto {
		return strategy
	}
	if groupSize <= 1 || bytes <= 0 {
		return StrategyOneShot
	}
	from, ok := c.TwoShotFrom[groupSize]
	if !ok {
		from = c.Scale / groupSize / groupSize
	}
	if bytes < from {
		return StrategyOneShot
	}
	return StrategyTwoShot
}

// StrategyFor resolves StrategyAuto with LocalCrossover; see Crossover.Strategy.
func StrategyFor(bytes, groupSize int, strategy string) string {
	return LocalCrossover.Strategy(bytes, groupSize, strategy)
}
