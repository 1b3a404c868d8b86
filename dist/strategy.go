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
// below TwoShotFrom bytes per rank, oneshot's single synchronisation wins; from it on,
// twoshot's smaller memory traffic does.
var LocalCrossover = Crossover{TwoShotFrom: map[int]int{2: 512 << 10, 4: 128 << 10}, Default: 128 << 10}

// Crossover is a measured all_reduce rule: the message size (bytes per rank) from which
// twoshot beats oneshot, by group size. GPU backends keep their own.
type Crossover struct {
	TwoShotFrom map[int]int // by group size
	Default     int         // for group sizes not in TwoShotFrom
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
		from = c.Default
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
