package dist

import "fmt"

// CPAxis is the conventional name of the context-parallel mesh axis (--mesh cp=2,
// tp=2,cp=2): the ranks along it split every prompt's tokens during prefill.
const CPAxis = "cp"

// CPShare returns the positions (0..length-1, ascending) of a sequence of length tokens
// that rank index of a context-parallel group of size ranks takes, balanced for causal
// attention: the sequence is cut into 2*size chunks as equal as can be (the first
// length%(2*size) chunks one token longer), and rank i takes chunks i and 2*size-1-i, an
// early chunk (few keys to attend to) with a late one (many). Every position belongs to
// exactly one rank. A sequence shorter than 2*size leaves some chunks empty, and a rank
// may take no token at all.
func CPShare(length, size, index int) ([]int, error) {
	if length < 0 || size < 1 || index < 0 || index >= size {
		return nil, fmt.Errorf("dist: context-parallel share of %d tokens for rank %d of %d: want length >= 0 and 0 <= rank < size", length, index, size)
	}
	chunks := 2 * size
	start := func(c int) int { // first position of chunk c
		base, extra := length/chunks, length%chunks
		return c*base + min(c, extra)
	}
	var out []int
	for _, c := range []int{index, chunks - 1 - index} {
		for p := start(c); p < start(c+1); p++ {
			out = append(out, p)
		}
	}
	return out, nil
}

// CPShares returns every rank's CPShare of a sequence of length tokens, and the length of
// the longest share (the padded length every rank computes on).
func CPShares(length, size int) (shares [][]int, longest int, err error) {
	shares = make([][]int, size)
	for r := range shares {
		if shares[r], err = CPShare(length, size, r); err != nil {
			return nil, 0, err
		}
		longest = max(longest, len(shares[r]))
	}
	return shares, longest, nil
}
