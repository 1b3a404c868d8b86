package cpu

// Row copies for the shape ops: gather and scatter (transpose, slice, split, concat, expand)
// whose last axis is contiguous on both sides move whole rows with copy, split over the worker
// pool when there is enough to move, instead of visiting element by element (walk). The same
// elements land in the same places either way.

// copyRowsMin is the fewest elements a row copy splits over the worker pool.
const copyRowsMin = 1 << 15

// contiguousRows reports whether a gather or scatter over shape with the strided side's
// strides stride can copy rows: the last axis is contiguous and long enough to pay.
func contiguousRows(shape, stride []int) bool {
	r := len(shape)
	return r > 0 && stride[r-1] == 1 && shape[r-1] >= 4
}

// eachRow calls f(i, off, n) for every row of shape (all axes but the last, row-major): i is
// the row's first flat index in the contiguous side, off its offset base + sum(index[d] *
// stride[d]) in the strided side, n = shape[last]. Rows are split over the worker pool when
// the elements number copyRowsMin or more.
func eachRow(shape, stride []int, base int, f func(i, off, n int)) {
	r := len(shape)
	n := shape[r-1]
	rows := 1
	for _, d := range shape[:r-1] {
		rows *= d
	}
	if rows == 0 || n == 0 {
		return
	}
	outer, ostride := shape[:r-1], stride[:r-1]
	run := func(lo, hi int) {
		// The offset of row lo, then stepped like an odometer.
		idx := make([]int, len(outer))
		off := base
		for d, q := len(outer)-1, lo; d >= 0; d-- {
			idx[d] = q % outer[d]
			q /= outer[d]
			off += idx[d] * ostride[d]
		}
		for q := lo; q < hi; q++ {
			f(q*n, off, n)
			for d := len(outer) - 1; d >= 0; d-- {
				idx[d]++
				off += ostride[d]
				if idx[d] < outer[d] {
					break
				}
				off -= ostride[d] * outer[d]
				idx[d] = 0
			}
		}
	}
	if rows*n < copyRowsMin {
		run(0, rows)
		return
	}
	parallel(rows, max(1, copyRowsMin/(4*n)), run)
}
