package cuda

import (
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// The fused kernels of graph op moe (kernels/moe.cu, whose comment gives the steps and the
// numerics): router logits, routing and the grouping of the tokens by local expert on the
// device, the experts' projections on their own tokens only (a grouped GEMV for decode and
// small batches, a tensor-core grouped GEMM for many tokens per expert), and the weighted
// combine in expert order. No step reads anything back to the host, so a decode step with
// moe ops is captured in a CUDA graph like any other. Nodes the kernels do not take
// (moeSupports: f16 operands, sizes that are not multiples of 8, more than 1024 experts or
// a top_k above 32) run as the op's decomposition, which Compile logs with the reason.

// Limits of the kernels (kernels/moe.cu): experts (routing keeps a count per local expert
// and a row of probabilities per warp in shared memory), top_k, and the rows of a
// tensor-core tile.
const (
	moeMaxExperts = 1024
	moeMaxTopK    = 32
	moeTileRows   = 64
	moeWarps      = 8
)

// moePath forces the expert kernels: "gemv", "mmv" or "mma"; "" lets moeKernelPath choose.
// The tests set it; LOOM_CUDA_MOE_PATH sets it for a process (for measuring one path against
// another).
var moePath = os.Getenv("LOOM_CUDA_MOE_PATH")

// moeFuseDecode runs a call of at most moeWarps tokens with the router and the routing in
// one launch, and one token's down projection with the combine in one (kernels/moe.cu:
// moe_router_route, moe_down_combine; the same bits as the separate kernels). Tests turn it
// off to compare.
var moeFuseDecode = true

// moeTiles are the grouped GEMV's work per warp (kernels/moe.cu, MOE_KERNELS): gate/up
// outputs GateP (their gate and up rows) with GateU chunks of 8 in flight per row and lane;
// down rows DownR with DownU chunks.
type moeTiles struct{ GateP, GateU, DownR, DownU int }

var (
	moeTokenTiles = moeTiles{1, 4, 1, 4}                             // one token (MT 1)
	moeBatchTiles = moeTilesFromEnv(moeTiles{4, 1, 4, 1}, os.Getenv) // more (MT 8)
)

// moeTilesFromEnv reads LOOM_CUDA_MOE_TILES ("GateP,GateU,DownR,DownU", one of the tilings
// MOE_KERNELS instantiates) to measure another tiling of many tokens; def otherwise.
func moeTilesFromEnv(def moeTiles, getenv func(string) string) moeTiles {
	var t moeTiles
	if _, err := fmt.Sscanf(getenv("LOOM_CUDA_MOE_TILES"), "%d,%d,%d,%d", &t.GateP, &t.GateU, &t.DownR, &t.DownU); err != nil {
		return def
	}
	for _, v := range moeBatchTilings {
		if v == t {
			return t
		}
	}
	return def
}

// moeBatchTilings are the tilings of many tokens MOE_KERNELS instantiates (pairs of its
// MOE_GATE_UP and MOE_DOWN of MT 8; a warp's 32 lanes finish GateP or DownR outputs of 8
// tokens, so neither is above 4). On one H200, Qwen3-30B-A3B's layer at 64 tokens (about 4
// a chosen expert), gate/up and down took 282 + 151 µs with {4,1,4,1}, the default, and 328 +
// 189 µs with {1,2,2,2}; at 32 tokens 197 + 105 against 214 + 127 (TestMoETimings, session
// 11).
var moeBatchTilings = []moeTiles{{4, 1, 4, 1}, {1, 2, 2, 2}}

// moeSteps is the number of moe's launches a call runs, in order router, routing, gate/up,
// down, combine (5: all); the timing test lowers it to time the steps one by one.
var moeSteps = 5

func init() {
	opKernels["moe"] = &opKernel{
		// The routing kernel's counter of finished blocks: zero between launches.
		prepare:   func(d *Device, n *graph.Node) (any, error) { return d.upload(tensor.New(tensor.I32, 1)) },
		workspace: func(n *graph.Node, in [][]int) int64 { return moeWorkspace(n, in) },
		supports:  moeSupports,
		run: func(d *Device, n *graph.Node, in, out []*Tensor, state any) error {
			counter, _ := state.(*Tensor)
			return moe(d, out[0], in[0], in[1], in[2], in[3], in[4], out[1], counter, moeAttrsOf(n))
		},
	}
}

// MoEAttrs are the attributes of a moe node (graph/catalog_moe.go).
type MoEAttrs struct {
	TopK         int
	Normalize    bool
	WeightDType  tensor.DType
	ExpertOffset int
}

func moeAttrsOf(n *graph.Node) MoEAttrs {
	return MoEAttrs{TopK: n.Attrs.Int("top_k"), Normalize: n.Attrs.Bool("normalize"),
		WeightDType: n.Attrs.DType("weight_dtype"), ExpertOffset: n.Attrs.Int("expert_offset")}
}

// moeSupports tells whether the fused kernels take node n; an error says why not, and the
// node then runs as its decomposition.
func moeSupports(n *graph.Node) error {
	if len(n.Inputs) != 5 {
		return fmt.Errorf("moe has %d inputs, want 5", len(n.Inputs))
	}
	x, router, gate, up, down := n.Inputs[0].Type, n.Inputs[1].Type, n.Inputs[2].Type, n.Inputs[3].Type, n.Inputs[4].Type
	a := moeAttrsOf(n)
	if len(router.Shape) != 2 || len(gate.Shape) != 3 || !router.Shape.IsConst() || !gate.Shape.IsConst() {
		return fmt.Errorf("moe kernels need constant router [E,H] and experts [L,I,H], got %s and %s", router.Shape, gate.Shape)
	}
	E, H, L, I := router.Shape[0].Size, router.Shape[1].Size, gate.Shape[0].Size, gate.Shape[1].Size
	return moeCheck(x.DType, router.DType, gate.DType, up.DType, down.DType, E, H, L, I, a)
}

// moeCheck holds the conditions of moeSupports that the launcher checks again.
func moeCheck(x, router, gate, up, down tensor.DType, E, H, L, I int, a MoEAttrs) error {
	if _, err := floatName("x", x); err != nil {
		return err
	}
	if _, err := floatName("the router", router); err != nil {
		return err
	}
	if _, err := floatName("the experts' weights", gate); err != nil {
		return err
	}
	if up != gate || down != gate {
		return fmt.Errorf("the experts' weights are %s, %s and %s; the kernels take one dtype", gate, up, down)
	}
	if H%8 != 0 || I%8 != 0 || H < 8 || I < 8 {
		return fmt.Errorf("hidden size %d and intermediate size %d must be multiples of 8 (16-byte loads)", H, I)
	}
	if E > moeMaxExperts || L > E || L < 1 {
		return fmt.Errorf("%d local experts of %d: the kernels take up to %d", L, E, moeMaxExperts)
	}
	if a.TopK < 1 || a.TopK > min(E, moeMaxTopK) {
		return fmt.Errorf("top_k %d: the kernels take 1 to min(E, %d)", a.TopK, moeMaxTopK)
	}
	if a.ExpertOffset < 0 || a.ExpertOffset+L > E {
		return fmt.Errorf("%d local experts at expert_offset %d do not fit %d experts", L, a.ExpertOffset, E)
	}
	if _, err := moeRoundCode(a.WeightDType); err != nil {
		return err
	}
	return nil
}

// moeRoundCode is moe_round's code for rounding to dt: 0 f32, 1 bf16, 2 f16.
func moeRoundCode(dt tensor.DType) (int32, error) {
	switch dt {
	case tensor.F32:
		return 0, nil
	case tensor.BF16:
		return 1, nil
	case tensor.F16:
		return 2, nil
	}
	return 0, fmt.Errorf("weight_dtype %s: the kernels round to f32, bf16 or f16", dt)
}

// moeLayout places the scratch of one moe step in its workspace (byte offsets, 256-aligned):
// logits [T,E] in x's dtype; ids [A] i32 and weights [A] f32 (A = T*top_k); the grouping
// (counts, offsets, active [L], hdr [4], tile_e and tile_r [tiles], pos and tok [A], i32);
// h [A,I] and y [A,H] in x's dtype.
type moeLayout struct {
	T, A, tiles                                                       int
	logits, ids, wts, counts, offsets, active, hdr, tileE, tileR, pos int64
	tok, h, y, total                                                  int64
}

func moeLayoutFor(T, H, E, L, I, k, xsize int) moeLayout {
	A := T * k
	l := moeLayout{T: T, A: A, tiles: (A+moeTileRows-1)/moeTileRows + min(A, L)}
	off := int64(0)
	take := func(n int64) int64 {
		o := off
		off += (n + 255) &^ 255
		return o
	}
	l.logits = take(int64(T) * int64(E) * int64(xsize))
	l.ids = take(4 * int64(A))
	l.wts = take(4 * int64(A))
	l.counts = take(4 * int64(L))
	l.offsets = take(4 * int64(L))
	l.active = take(4 * int64(L))
	l.hdr = take(16)
	l.tileE = take(4 * int64(l.tiles))
	l.tileR = take(4 * int64(l.tiles))
	l.pos = take(4 * int64(A))
	l.tok = take(4 * int64(A))
	l.h = take(int64(A) * int64(I) * int64(xsize))
	l.y = take(int64(A) * int64(H) * int64(xsize))
	l.total = off
	return l
}

// moeWorkspace is the workspace bytes of a moe step with input shapes in.
func moeWorkspace(n *graph.Node, in [][]int) int64 {
	if len(in) != 5 || len(in[0]) < 1 || len(in[1]) != 2 || len(in[2]) != 3 {
		return 0
	}
	H := in[0][len(in[0])-1]
	if H == 0 {
		return 0
	}
	T := tensor.Numel(in[0]) / H
	return moeLayoutFor(T, H, in[1][0], in[2][0], in[2][1], n.Attrs.Int("top_k"), n.Inputs[0].Type.DType.Size()).total
}

// MoE runs graph op moe on the fused kernels: out[...,H] from x[...,H], router [E,H], gate
// and up [L,I,H], down [L,H,I], with ws at least moeWorkspace bytes and counter an i32 [1]
// that is zero (it is zero again after the launch). Nothing is allocated.
func MoE(d *Device, out, x, router, gate, up, down, ws, counter *Tensor, a MoEAttrs) error {
	return d.do(func() error { return moe(d, out, x, router, gate, up, down, ws, counter, a) })
}

// moeKernelPath picks the experts' kernels for A assignments over at most min(A, L)
// experts: "mma", the tensor-core tiles of 64 rows, for bf16 x and weights with more than 4
// rows an active expert on average; else "gemv", the grouped GEMV of f32 FMAs. "mmv", the
// tensor-core GEMV (each warp reads 16 weight rows once for 8 or 16 grouped rows), runs only
// when moePath asks for it: on one H200 with Qwen3-30B-A3B's layer (TestMoETimings, session
// 11) its down projection took 86 µs at 64 tokens against the GEMV's 151 and the tiles' 157,
// but its gate/up 295 against 281 and 337, and the whole model at 64 concurrent decoded at
// 2,038 tok/s with it (up to 16 rows an expert) against 2,285 without (docs/PERFORMANCE.md;
// forced through moePath it also takes the prefill steps, where it re-reads each expert's
// weights for every 16 rows). moePath, when set,
// forces a path where the dtypes allow it (the tensor-core paths take bf16 only).
func moeKernelPath(x, w tensor.DType, A, L int) string {
	bf16 := x == tensor.BF16 && w == tensor.BF16
	switch {
	case moePath == "gemv" || !bf16:
		return "gemv"
	case moePath == "mma" || moePath == "mmv":
		return moePath
	case A > 4*min(A, L):
		return "mma"
	}
	return "gemv"
}

func moe(d *Device, out, x, router, gate, up, down, ws, counter *Tensor, a MoEAttrs) error {
	if err := checkLive(out, x, router, gate, up, down, counter); err != nil {
		return fmt.Errorf("cuda: moe: %w", err)
	}
	if len(x.Shape) < 1 || len(router.Shape) != 2 || len(gate.Shape) != 3 {
		return fmt.Errorf("cuda: moe: x %v, router %v, gate %v do not fit [...,H], [E,H], [L,I,H]", x.Shape, router.Shape, gate.Shape)
	}
	E, H := router.Shape[0], router.Shape[1]
	L, I := gate.Shape[0], gate.Shape[1]
	if x.Shape[len(x.Shape)-1] != H || gate.Shape[2] != H || !slices.Equal(up.Shape, gate.Shape) || !slices.Equal(down.Shape, []int{L, H, I}) {
		return fmt.Errorf("cuda: moe: x %v, router %v, gate %v, up %v, down %v do not fit [...,H], [E,H], [L,I,H], [L,I,H], [L,H,I]", x.Shape, router.Shape, gate.Shape, up.Shape, down.Shape)
	}
	if err := moeCheck(x.DType, router.DType, gate.DType, up.DType, down.DType, E, H, L, I, a); err != nil {
		return fmt.Errorf("cuda: moe: %w", err)
	}
	if err := checkOut("output", out, x.DType, x.Shape); err != nil {
		return fmt.Errorf("cuda: moe: %w", err)
	}
	if counter.DType != tensor.I32 || counter.Numel() != 1 {
		return fmt.Errorf("cuda: moe: counter is %s%v, want i32[1]", counter.DType, counter.Shape)
	}
	for _, t := range []*Tensor{x, gate, up, down, ws} {
		if t != nil && t.ptr%16 != 0 {
			return fmt.Errorf("cuda: moe: an operand at %#x is not 16-byte aligned (the kernels read 16-byte chunks)", t.ptr)
		}
	}
	T := x.Numel() / H
	if T == 0 {
		return nil
	}
	k := a.TopK
	if int64(T)*int64(k) > 1<<30 || int64(T)*int64((H+255)/256) > 1<<31-1 {
		return fmt.Errorf("cuda: moe: %d tokens are too many", T)
	}
	prod, err := graph.Promote(x.DType, a.WeightDType)
	if err != nil {
		return fmt.Errorf("cuda: moe: %w", err)
	}
	pround, err := moeRoundCode(prod)
	if err != nil {
		return fmt.Errorf("cuda: moe: %w", err)
	}
	wround, _ := moeRoundCode(a.WeightDType)
	xs := x.DType.Size()
	lay := moeLayoutFor(T, H, E, L, I, k, xs)
	if wsBytes(ws) < int(lay.total) {
		return fmt.Errorf("cuda: moe: workspace of %d bytes is below the %d this call needs", wsBytes(ws), lay.total)
	}
	at := func(off int64) cubind.DevicePtr { return ws.ptr + cubind.DevicePtr(off) }
	meta := make([]byte, 64)
	for i, off := range []int64{lay.counts, lay.offsets, lay.active, lay.hdr, lay.tileE, lay.tileR, lay.pos, lay.tok} {
		binary.LittleEndian.PutUint64(meta[8*i:], uint64(at(off)))
	}

	xn, wn, rn := dtypeName(x.DType), dtypeName(gate.DType), dtypeName(router.DType)
	path := moeKernelPath(x.DType, gate.DType, lay.A, L)
	inst := fmt.Sprintf("MOE_KERNELS(%s, %s, %s, %s, %s, %s)", strings.ToUpper(xn), xn, strings.ToUpper(wn), wn, strings.ToUpper(rn), rn)
	if x.DType == tensor.BF16 && gate.DType == tensor.BF16 {
		inst += "\nMOE_MMA_KERNELS()"
	}
	launch := func(name string, grid cubind.Dim3, threads, shared int, args func(a *cubind.Args)) error {
		return wrap("cuda: moe", d.launchX("moe.cu", inst, name, grid, cubind.Dim3{X: threads, Y: 1, Z: 1}, shared, args))
	}
	MT := 8
	if T == 1 {
		MT = 1
	}
	if lay.tiles > 65535 || (T+MT-1)/MT > 65535 {
		return fmt.Errorf("cuda: moe: %d tokens need more than 65535 blocks along a grid's y", T)
	}

	// 1. Router logits [T,E] in x's dtype, and 2. the routing and grouping.
	logits, ids, wts, pos := at(lay.logits), at(lay.ids), at(lay.wts), at(lay.pos)
	routeArgs := func(g *cubind.Args) {
		g.Ptr(ids).Ptr(wts).Struct(meta).Ptr(counter.ptr).I32(int32(T)).I32(int32(E))
	}
	routeAttrs := func(g *cubind.Args) {
		g.I32(int32(k)).I32(b2i(a.Normalize)).I32(wround).I32(int32(L)).I32(int32(a.ExpertOffset))
	}
	if moeFuseDecode && T <= moeWarps && moeSteps >= 2 {
		grid := cubind.Dim3{X: (E + moeWarps - 1) / moeWarps, Y: 1, Z: 1}
		if err := launch(fmt.Sprintf("moe_router_route_%s_%s", xn, rn), grid, 32*moeWarps, moeWarps*E*4, func(g *cubind.Args) {
			g.Ptr(logits).Ptr(x.ptr).Ptr(router.ptr)
			routeArgs(g)
			g.I32(int32(H))
			routeAttrs(g)
		}); err != nil {
			return err
		}
	} else {
		if x.DType == tensor.BF16 && router.DType == tensor.BF16 && T > 64 {
			xv := &Tensor{DType: x.DType, Shape: []int{T, H}, ptr: x.ptr, dev: x.dev}
			lv := &Tensor{DType: x.DType, Shape: []int{T, E}, ptr: logits, dev: x.dev}
			if err := linear(d, lv, xv, router); err != nil {
				return fmt.Errorf("cuda: moe: router: %w", err)
			}
		} else {
			grid := cubind.Dim3{X: (E + moeWarps - 1) / moeWarps, Y: (T + MT - 1) / MT, Z: 1}
			if err := launch(fmt.Sprintf("moe_router_%s_%s_m%d", xn, rn, MT), grid, 32*moeWarps, 0, func(g *cubind.Args) {
				g.Ptr(logits).Ptr(x.ptr).Ptr(router.ptr).I32(int32(T)).I32(int32(E)).I32(int32(H))
			}); err != nil {
				return err
			}
		}
		if moeSteps < 2 {
			return nil
		}
		grid := cubind.Dim3{X: (T + moeWarps - 1) / moeWarps, Y: 1, Z: 1}
		if err := launch("moe_route_"+xn, grid, 32*moeWarps, moeWarps*E*4, func(g *cubind.Args) {
			g.Ptr(logits)
			routeArgs(g)
			routeAttrs(g)
		}); err != nil {
			return err
		}
	}

	if moeSteps < 3 {
		return nil
	}
	// 3. The experts.
	h, y := at(lay.h), at(lay.y)
	switch path {
	case "mmv":
		slots, nn := min(lay.A, L), 1
		if lay.A > 8*slots {
			nn = 2
		}
		rows := 16 * moeWarps
		gu := cubind.Dim3{X: (I + rows - 1) / rows, Y: slots, Z: 1}
		if err := launch(fmt.Sprintf("moe_mmv_gate_up_n%d", nn), gu, 32*moeWarps, 0, func(g *cubind.Args) {
			g.Ptr(h).Ptr(x.ptr).Ptr(gate.ptr).Ptr(up.ptr).Struct(meta).I32(int32(I)).I32(int32(H))
		}); err != nil || moeSteps < 4 {
			return err
		}
		dn := cubind.Dim3{X: (H + rows - 1) / rows, Y: slots, Z: 1}
		if err := launch(fmt.Sprintf("moe_mmv_down_n%d", nn), dn, 32*moeWarps, 0, func(g *cubind.Args) {
			g.Ptr(y).Ptr(h).Ptr(down.ptr).Ptr(down.ptr).Struct(meta).I32(int32(H)).I32(int32(I))
		}); err != nil {
			return err
		}
	case "mma":
		gu := cubind.Dim3{X: (I + 63) / 64, Y: lay.tiles, Z: 1}
		if err := launch("moe_mma_gate_up", gu, 128, 0, func(g *cubind.Args) {
			g.Ptr(h).Ptr(x.ptr).Ptr(gate.ptr).Ptr(up.ptr).Struct(meta).I32(int32(I)).I32(int32(H))
		}); err != nil || moeSteps < 4 {
			return err
		}
		dn := cubind.Dim3{X: (H + 63) / 64, Y: lay.tiles, Z: 1}
		if err := launch("moe_mma_down", dn, 128, 0, func(g *cubind.Args) {
			g.Ptr(y).Ptr(h).Ptr(down.ptr).Ptr(down.ptr).Struct(meta).I32(int32(H)).I32(int32(I))
		}); err != nil {
			return err
		}
	default:
		slots := min(lay.A, L)
		tl := moeBatchTiles
		if MT == 1 {
			tl = moeTokenTiles
		}
		gu := cubind.Dim3{X: (I + tl.GateP*moeWarps - 1) / (tl.GateP * moeWarps), Y: slots, Z: 1}
		if err := launch(fmt.Sprintf("moe_gate_up_%s_%s_m%d_p%d_u%d", xn, wn, MT, tl.GateP, tl.GateU), gu, 32*moeWarps, 0, func(g *cubind.Args) {
			g.Ptr(h).Ptr(x.ptr).Ptr(gate.ptr).Ptr(up.ptr).Struct(meta).I32(int32(H)).I32(int32(I))
		}); err != nil || moeSteps < 4 {
			return err
		}
		if moeFuseDecode && T == 1 && moeSteps >= 5 {
			// 3b and 4: one token's down rows and the combine.
			return launch(fmt.Sprintf("moe_down_combine_%s_%s", xn, wn), cubind.Dim3{X: (H + moeWarps - 1) / moeWarps, Y: 1, Z: 1}, 32*moeWarps, 0, func(g *cubind.Args) {
				g.Ptr(out.ptr).Ptr(h).Ptr(down.ptr).Ptr(ids).Ptr(wts).Ptr(pos).I32(int32(H)).I32(int32(I)).I32(int32(k)).I32(pround).I32(int32(a.ExpertOffset))
			})
		}
		dn := cubind.Dim3{X: (H + tl.DownR*moeWarps - 1) / (tl.DownR * moeWarps), Y: slots, Z: 1}
		if err := launch(fmt.Sprintf("moe_down_%s_%s_m%d_r%d_u%d", xn, wn, MT, tl.DownR, tl.DownU), dn, 32*moeWarps, 0, func(g *cubind.Args) {
			g.Ptr(y).Ptr(h).Ptr(down.ptr).Struct(meta).I32(int32(H)).I32(int32(I))
		}); err != nil {
			return err
		}
	}

	if moeSteps < 5 {
		return nil
	}
	// 4. The weighted combine.
	return launch("moe_combine_"+xn, cubind.Dim3{X: T * ((H + 255) / 256), Y: 1, Z: 1}, 256, 0, func(g *cubind.Args) {
		g.Ptr(out.ptr).Ptr(y).Ptr(ids).Ptr(wts).Ptr(pos).I32(int32(H)).I32(int32(k)).I32(pround)
	})
}

func b2i(b bool) int32 {
	if b {
		return 1
	}
	return 0
}
