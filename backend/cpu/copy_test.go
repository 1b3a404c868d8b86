package cpu

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestRowCopies holds gather and scatter's row copies (eachRow) to the element walk they
// replace: transposes that keep the last axis, slices, broadcasts over leading axes, rank 1,
// short and long rows, small and pool-split sizes.
func TestRowCopies(t *testing.T) {
	rng := rand.New(rand.NewPCG(91, 92))
	for _, tc := range []struct {
		shape  []int // the gathered shape
		src    []int // the source's shape
		perm   []int // source axis of each gathered axis (nil: identity)
		bcast  []bool
		offset int
	}{
		{shape: []int{4}, src: []int{4}},
		{shape: []int{3, 5}, src: []int{3, 9}, offset: 2},
		{shape: []int{2, 3, 4, 8}, src: []int{2, 4, 3, 8}, perm: []int{0, 2, 1, 3}},
		{shape: []int{1, 16, 7, 64}, src: []int{1, 7, 16, 64}, perm: []int{0, 2, 1, 3}},
		{shape: []int{3, 100, 512}, src: []int{1, 100, 512}, bcast: []bool{true, false, false}},
		{shape: []int{64, 1200}, src: []int{64, 3000}, offset: 900},
	} {
		t.Run(fmt.Sprint(tc.shape), func(t *testing.T) {
			src := make([]int32, 0)
			n := 1
			for _, d := range tc.src {
				n *= d
			}
			for range n {
				src = append(src, rng.Int32())
			}
			ss := stridesOf(tc.src)
			stride := make([]int, len(tc.shape))
			for i := range tc.shape {
				p := i
				if tc.perm != nil {
					p = tc.perm[i]
				}
				if tc.bcast == nil || !tc.bcast[i] {
					stride[i] = ss[p]
				}
			}
			m := 1
			for _, d := range tc.shape {
				m *= d
			}
			got, want := make([]int32, m), make([]int32, m)
			gatherT(got, src, tc.shape, stride, tc.offset)
			walk(tc.shape, [][]int{stride}, []int{tc.offset}, func(i int, off []int) { want[i] = src[off[0]] })
			if !slices.Equal(got, want) {
				t.Fatal("gather: row copies differ from the element walk")
			}
			if tc.bcast != nil {
				return // a broadcast scatter writes one place many times
			}
			gotS, wantS := slices.Clone(src), slices.Clone(src)
			scatterT(gotS, got, tc.shape, stride, tc.offset)
			walk(tc.shape, [][]int{stride}, []int{tc.offset}, func(i int, off []int) { wantS[off[0]] = got[i] })
			if !slices.Equal(gotS, wantS) {
				t.Fatal("scatter: row copies differ from the element walk")
			}
		})
	}
}

// stridesOf returns the row-major strides of shape.
func stridesOf(shape []int) []int {
	s := make([]int, len(shape))
	acc := 1
	for i := len(shape) - 1; i >= 0; i-- {
		s[i] = acc
		acc *= shape[i]
	}
	return s
}
