package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

// TestFastPagedAttentionBits holds the fast paged attention (with the AVX kernels where the
// CPU has them) to the reference kernel bit for bit: head dims that are and are not multiples
// of 8, 1 to 10 query heads per KV head (over 8: two groups of lanes), key counts that leave
// 0 to 3 keys after the blocks of four, f32 and bf16 caches, prefill and decode.
func TestFastPagedAttentionBits(t *testing.T) {
	rng := rand.New(rand.NewPCG(81, 82))
	for _, c := range []struct {
		H, KV, D int
		cached   []int
		steps    []int
	}{
		{14, 2, 64, []int{0, 5}, []int{37, 3}},       // Qwen2.5-0.5B's heads, prefill
		{14, 2, 64, []int{61, 2, 9}, []int{1, 1, 1}}, // decode
		{8, 8, 16, []int{3}, []int{14}},
		{10, 1, 24, []int{6, 0}, []int{11, 9}}, // 10 heads a KV head
		{6, 2, 12, []int{4}, []int{19}},        // D not a multiple of 8
		{4, 1, 128, []int{130}, []int{2}},
	} {
		for _, dts := range [][2]tensor.DType{{tensor.F32, tensor.F32}, {tensor.BF16, tensor.BF16}, {tensor.F32, tensor.BF16}} {
			name := fmt.Sprintf("H=%d/KV=%d/D=%d/%v/q=%s/cache=%s", c.H, c.KV, c.D, c.steps, dts[0], dts[1])
			t.Run(name, func(t *testing.T) {
				pc := newPagedCase(rng, dts[0], dts[1], 16, c.H, c.KV, c.D, 0, c.cached, c.steps)
				n, outs := nodeFor(t, "paged_attention", pc.attrs, pc.in)
				ref, _ := Reference("paged_attention")
				want, err := ref(n, pc.withCaches(), outs)
				if err != nil {
					t.Fatal(err)
				}
				got, err := fastPagedAttention(n, pc.withCaches(), outs)
				if err != nil {
					t.Fatal(err)
				}
				g, w := values(got[0]), values(want[0])
				bad := 0
				for i := range w {
					if math.Float64bits(g[i]) != math.Float64bits(w[i]) {
						if bad++; bad <= 3 {
							t.Errorf("element %d: fast %v, reference %v", i, g[i], w[i])
						}
					}
				}
			})
		}
	}
}
