package dist

import (
	"slices"
	"testing"
)

func TestCPShare(t *testing.T) {
	for _, tc := range []struct {
		length, size int
		want         [][]int
	}{
		{8, 2, [][]int{{0, 1, 6, 7}, {2, 3, 4, 5}}},
		{8, 4, [][]int{{0, 7}, {1, 6}, {2, 5}, {3, 4}}},
		{3, 2, [][]int{{0}, {1, 2}}},                       // chunks 1,1,1,0
		{1, 4, [][]int{{0}, nil, nil, nil}},                // shorter than the ranks
		{0, 2, [][]int{nil, nil}},                          // empty
		{10, 2, [][]int{{0, 1, 2, 8, 9}, {3, 4, 5, 6, 7}}}, // chunks 3,3,2,2
	} {
		for r := range tc.size {
			got, err := CPShare(tc.length, tc.size, r)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want[r]) {
				t.Errorf("CPShare(%d, %d, %d) = %v, want %v", tc.length, tc.size, r, got, tc.want[r])
			}
		}
	}
}

// TestCPSharePartition: for many lengths and sizes every position belongs to exactly one
// rank, and the causal work (keys attended to: position+1, summed over a share) differs
// between ranks by at most two tokens' worth (2*length), where a contiguous split differs by
// about length²/size.
func TestCPSharePartition(t *testing.T) {
	for size := 1; size <= 8; size++ {
		for length := 0; length <= 300; length++ {
			shares, longest, err := CPShares(length, size)
			if err != nil {
				t.Fatal(err)
			}
			seen := make([]int, length)
			lo, hi := -1, 0
			for _, s := range shares {
				work := 0
				for _, p := range s {
					seen[p]++
					work += p + 1
				}
				if lo < 0 || work < lo {
					lo = work
				}
				hi = max(hi, work)
			}
			for p, n := range seen {
				if n != 1 {
					t.Fatalf("length %d size %d: position %d taken %d times", length, size, p, n)
				}
			}
			if hi-lo > 2*length {
				t.Errorf("length %d size %d: causal work from %d to %d across ranks", length, size, lo, hi)
			}
			if longest > 2*(length/(2*size)+1) {
				t.Errorf("length %d size %d: longest share %d", length, size, longest)
			}
		}
	}
	if _, err := CPShare(4, 2, 2); err == nil {
		t.Error("rank 2 of 2: no error")
	}
}
