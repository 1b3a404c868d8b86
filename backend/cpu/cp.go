package cpu

import (
	"context"
	"fmt"
	"math"

	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Kernels of context parallelism (graph/catalog_cp.go): attention_partial (reference, split
// over query heads on the pool), attention_merge (a direct kernel over its decomposition)
// and ring_shift, which the binder runs over the communicator.

func init() {
	registerReference("attention_partial", attentionPartial)
	registerReference("ring_shift", collectiveReference)
	Register("attention_merge", attentionMerge)
}

// attentionPartial computes o f32[NQ,B,H,Sq,D] and lse f32[NQ,B,H,Sq] of q[NQ,B,H,Sq,D]
// against every key block of k, v[NK,B,KV,Sk,D] at positions q_pos[NQ,B,Sq], k_pos[NK,B,Sk]
// (see the op's doc). Scores and sums are f32, as sdpa's softmax.
func attentionPartial(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 5, 2); err != nil {
		return nil, err
	}
	q, k, v := in[0], in[1], in[2]
	if len(q.Shape) != 5 || len(k.Shape) != 5 || len(v.Shape) != 5 {
		return nil, fmt.Errorf("attention_partial: q %v, k %v, v %v are not 5-D", q.Shape, k.Shape, v.Shape)
	}
	NQ, B, H, Sq, D := q.Shape[0], q.Shape[1], q.Shape[2], q.Shape[3], q.Shape[4]
	NK, KV, Sk := k.Shape[0], k.Shape[2], k.Shape[3]
	if k.Shape[1] != B || k.Shape[4] != D || KV == 0 || H%KV != 0 || fmt.Sprint(k.Shape) != fmt.Sprint(v.Shape) {
		return nil, fmt.Errorf("attention_partial: q %v does not fit k %v, v %v", q.Shape, k.Shape, v.Shape)
	}
	qp, kp := in[3].Int64s(), in[4].Int64s()
	if len(qp) != NQ*B*Sq || len(kp) != NK*B*Sk {
		return nil, fmt.Errorf("attention_partial: positions %v and %v do not fit q %v and k %v", in[3].Shape, in[4].Shape, q.Shape, k.Shape)
	}
	if err := checkShape(q.Shape, out[0]); err != nil {
		return nil, err
	}
	qs, ks, vs := q.Float32s(), k.Float32s(), v.Float32s()
	scale := float32(n.Attrs.Float("scale"))
	window := int64(n.Attrs.Int("window"))
	o := tensor.New(tensor.F32, q.Shape...)
	lse := tensor.New(tensor.F32, NQ, B, H, Sq)
	rep := H / KV
	parallel(NQ*B*H, 1, func(lo, hi int) {
		scores := make([]float32, NK*Sk)
		for job := lo; job < hi; job++ {
			a, b, h := job/(B*H), job/H%B, job%H
			kh := h / rep
			for i := range Sq {
				qRow := qs[(((a*B+b)*H+h)*Sq+i)*D:][:D]
				pq := qp[(a*B+b)*Sq+i]
				mx := float32(math.Inf(-1))
				for c := range NK {
					for j := range Sk {
						s := &scores[c*Sk+j]
						pk := kp[(c*B+b)*Sk+j]
						if pk > pq || window > 0 && pk <= pq-window {
							*s = float32(math.Inf(-1))
							continue
						}
						kRow := ks[(((c*B+b)*KV+kh)*Sk+j)*D:][:D]
						var dot float32
						for d, x := range qRow {
							dot += x * kRow[d]
						}
						*s = dot * scale
						mx = max(mx, *s)
					}
				}
				oRow := o.F32[(((a*B+b)*H+h)*Sq+i)*D:][:D]
				lRow := &lse.F32[((a*B+b)*H+h)*Sq+i]
				if math.IsInf(float64(mx), -1) {
					*lRow = mx
					continue
				}
				var sum float32
				for c := range NK {
					for j := range Sk {
						s := &scores[c*Sk+j]
						if math.IsInf(float64(*s), -1) {
							*s = 0
							continue
						}
						*s = float32(math.Exp(float64(*s - mx)))
						sum += *s
					}
				}
				inv := 1 / sum
				for c := range NK {
					for j := range Sk {
						p := scores[c*Sk+j] * inv
						if p == 0 {
							continue
						}
						vRow := vs[(((c*B+b)*KV+kh)*Sk+j)*D:][:D]
						for d, x := range vRow {
							oRow[d] += p * x
						}
					}
				}
				*lRow = mx + float32(math.Log(float64(sum)))
			}
		}
	})
	return []*tensor.Tensor{o, lse}, nil
}

// attentionMerge is attention_merge computed directly (graph.DecomposeAttentionMerge is
// its reference): o1, o2 f32[...,D], lse1, lse2 f32[...].
func attentionMerge(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 4, 2); err != nil {
		return nil, err
	}
	o1, l1, o2, l2 := in[0], in[1], in[2], in[3]
	for _, t := range in {
		if t.DType != tensor.F32 {
			return nil, fmt.Errorf("attention_merge: inputs must be f32, got %s", t.DType)
		}
	}
	rows := len(l1.F32)
	if len(l2.F32) != rows || len(o1.F32) != len(o2.F32) || rows == 0 && len(o1.F32) != 0 || rows > 0 && len(o1.F32)%rows != 0 {
		return nil, fmt.Errorf("attention_merge: o %v, %v and lse %v, %v do not fit", o1.Shape, o2.Shape, l1.Shape, l2.Shape)
	}
	if err := checkShape(o1.Shape, out[0]); err != nil {
		return nil, err
	}
	D := 0
	if rows > 0 {
		D = len(o1.F32) / rows
	}
	o := tensor.New(tensor.F32, o1.Shape...)
	lse := tensor.New(tensor.F32, l1.Shape...)
	for r := range rows {
		a, b := l1.F32[r], l2.F32[r]
		m := max(a, b)
		if m < -math.MaxFloat32 { // both -inf: no key on either side
			lse.F32[r] = m
			continue
		}
		w1 := float32(math.Exp(float64(a - m)))
		w2 := float32(math.Exp(float64(b - m)))
		sum := w1 + w2
		lse.F32[r] = m + float32(math.Log(float64(sum)))
		x, y, z := o1.F32[r*D:][:D], o2.F32[r*D:][:D], o.F32[r*D:][:D]
		for d := range z {
			z[d] = (x[d]*w1 + y[d]*w2) / sum
		}
	}
	return []*tensor.Tensor{o, lse}, nil
}

// ringShift runs ring_shift bound as an all_gather of x along a new leading axis (bound's
// Axis is 0), keeping the block of the previous rank of the group. The in-process
// communicator has no point-to-point send; an all_gather moves group_size times the data a
// send would, which the local backend pays in memory copies only.
func ringShift(ctx context.Context, bound *dist.Bound, comm dist.Communicator, x *tensor.Tensor) ([]*tensor.Tensor, error) {
	row := x.Clone()
	row.Shape = append([]int{1}, x.Shape...)
	all, err := bound.Run(ctx, comm, row)
	if err != nil {
		return nil, err
	}
	g := bound.Group()
	from := (g.Index + g.Size() - 1) % g.Size()
	per := tensor.Numel(x.Shape)
	y := tensor.New(x.DType, x.Shape...)
	tensor.CopyRange(y, 0, all, from*per, per)
	return []*tensor.Tensor{y}, nil
}
