package nccl

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/tensor"
)

// TestSendRecvArgumentErrors: a bad dtype, count or peer fails before NCCL with a
// *dist.Error naming send_recv; an empty call needs no NCCL.
func TestSendRecvArgumentErrors(t *testing.T) {
	w := fakeWorld(t, "cp=2,tp=2", 3)
	c, err := w.Axis("cp")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, want string
		call       func() error
	}{
		{"invalid dtype", "not supported", func() error { return c.SendRecv(1, 2, 4, tensor.Invalid, 0, 1, 0) }},
		{"negative count", "negative count -1", func() error { return c.SendRecv(1, 2, -1, tensor.F32, 0, 1, 0) }},
		{"peer to", "peers 2 and 0 out of range for a group of 2", func() error { return c.SendRecv(1, 2, 4, tensor.F32, 2, 0, 0) }},
		{"peer from", "peers 0 and -1 out of range for a group of 2", func() error { return c.SendRecv(1, 2, 4, tensor.F32, 0, -1, 0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var de *dist.Error
			if !errors.As(err, &de) || de.Collective != "send_recv" || de.Rank != 3 || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v; want a *dist.Error for send_recv on rank 3 saying %q", err, tc.want)
			}
		})
	}
	if err := c.SendRecv(1, 2, 0, tensor.Bool, 0, 1, 0); err != nil {
		t.Errorf("empty send_recv: %v", err)
	}
}

// TestSendRecvRing passes every rank's buffer one step around the ring of a cp group (as
// ring_shift does) on one GPU (a rank sends to itself) and on two, bit for bit.
func TestSendRecvRing(t *testing.T) {
	for _, mesh := range []string{"cp=1", "cp=2"} {
		t.Run(mesh, func(t *testing.T) {
			ws := initWorlds(t, mesh)
			n := len(ws)
			for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.I64} {
				for _, count := range []int{1, 4097} {
					in := make([]hostData, n)
					for r := range in {
						in[r] = randomData(dt, count, rand.New(rand.NewPCG(uint64(count), uint64(r))))
					}
					got := make([]hostData, n)
					onRanks(t, ws, func(w *World, s cubind.Stream) error {
						r := w.Rank()
						c, err := w.Axis("cp")
						if err != nil {
							return err
						}
						src, err := upload(in[r].bytes(dt), s)
						if err != nil {
							return err
						}
						defer cubind.MemFree(src.p)
						dst, err := upload(make([]byte, count*dt.Size()), s)
						if err != nil {
							return err
						}
						defer cubind.MemFree(dst.p)
						g := c.Group()
						if err := c.SendRecv(src.p, dst.p, count, dt, (g.Index+1)%n, (g.Index+n-1)%n, s); err != nil {
							return err
						}
						if err := w.Sync(context.Background(), s); err != nil {
							return err
						}
						raw, err := dst.download(s)
						if err != nil {
							return err
						}
						if err := s.Synchronize(); err != nil {
							return err
						}
						got[r] = fromBytes(dt, raw)
						return nil
					})
					if t.Failed() {
						return
					}
					for r := range n {
						if err := compare(fmt.Sprintf("%s rank %d %s[%d]", mesh, r, dt, count), dt, got[r], in[(r+n-1)%n]); err != nil {
							t.Error(err)
						}
					}
				}
			}
		})
	}
}
