package nccl

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// rendezvousOutcome is what rank 0 of a world of 2 does with a connection that sends b (then
// closes its side), by the protocol's description: forget it (a first frame that is not a
// well-formed hello), refuse it and fail (a hello of another world size, or of a rank that
// is not a follower), or take it as rank 1.
type rendezvousOutcome int

const (
	rdvDropped rendezvousOutcome = iota
	rdvRefused
	rdvWelcome
)

func expectRendezvous(b []byte) rendezvousOutcome {
	if len(b) < 5 {
		return rdvDropped
	}
	n := binary.BigEndian.Uint32(b[1:5])
	if n > maxFrame || uint64(len(b)) < 5+uint64(n) || b[0] != msgHello {
		return rdvDropped
	}
	rank, size, err := parseHello(b[5 : 5+n])
	switch {
	case err != nil:
		return rdvDropped
	case size != 2 || rank != 1:
		return rdvRefused
	}
	return rdvWelcome
}

// FuzzRendezvousHello runs rank 0's rendezvous for a world of 2 and connects to it with a
// process that sends arbitrary bytes (over loopback TCP). Rank 0 answers as the protocol
// says (expectRendezvous): a connection whose first frame is not a well-formed hello is
// closed without an answer and the real rank 1 joins after it; a hello of another world
// size or rank is refused with a reject frame (code rejectInvalid and the reason) and rank
// 0's rendezvous fails with the same reason; the hello of rank 1 is welcomed with the id.
// Every well-formed hello parses back to the bytes helloPayload writes.
func FuzzRendezvousHello(f *testing.F) {
	frame := func(typ byte, payload []byte) []byte {
		var b bytes.Buffer
		writeFrame(&b, typ, payload)
		return b.Bytes()
	}
	f.Add(frame(msgHello, helloPayload(1, 2)))
	f.Add(frame(msgHello, helloPayload(0, 2)))
	f.Add(frame(msgHello, helloPayload(2, 2)))
	f.Add(frame(msgHello, helloPayload(1, 3)))
	f.Add(frame(msgHello, helloPayload(1<<31, 2)))
	f.Add(append(frame(msgHello, helloPayload(1, 2)), frame(msgPing, nil)...))
	f.Add(append(frame(msgPing, nil), frame(msgHello, helloPayload(1, 2))...))
	f.Add(frame(msgHello, append(helloPayload(1, 2), 0)))
	f.Add(frame(msgHello, []byte("loom-nccl-rendezvous/0\x00\x00\x00\x01\x00\x00\x00\x02")))
	f.Add(frame(msgWelcome, []byte("id")))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add([]byte{msgHello, 0, 0})
	f.Add([]byte{})
	const id = "the-unique-id"
	// Each fuzz worker process listens on a loopback address of its own, so that no worker
	// reaches another's rank 0 on a port both picked.
	addr := fmt.Sprintf("127.%d.%d.1", 1+os.Getpid()>>8&0x7f, os.Getpid()&0xff)
	if ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0")); err == nil {
		ln.Close()
	} else {
		addr = "127.0.0.1"
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) >= 5 && b[0] == msgHello {
			if rank, size, err := parseHello(b[5:min(len(b), 5+int(binary.BigEndian.Uint32(b[1:5])))]); err == nil {
				if p := helloPayload(rank, size); !bytes.Equal(p, b[5:5+len(p)]) {
					t.Fatalf("hello %x parses as rank %d, size %d, written %x", b[5:], rank, size, p)
				}
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		opts := Options{Timeout: 10 * time.Second, Heartbeat: time.Second}
		env := func(rank int) Env {
			return Env{Rank: rank, WorldSize: 2, LocalRank: rank, MasterAddr: addr, MasterPort: port}
		}
		type result struct {
			peers   *Peers
			payload []byte
			err     error
		}
		rank0 := make(chan result, 1)
		go func() {
			p, payload, err := Rendezvous(ctx, env(0), opts, func() ([]byte, error) { return []byte(id), nil })
			rank0 <- result{p, payload, err}
		}()
		var conn net.Conn
		for {
			var err error
			if conn, err = net.Dial("tcp", env(0).Addr()); err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("rank 0 never listened: %v", err)
			}
			time.Sleep(time.Millisecond)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(15 * time.Second))
		if _, err := conn.Write(b); err != nil {
			t.Fatal(err)
		}
		conn.(*net.TCPConn).CloseWrite()
		typ, reply, rerr := readFrame(conn)

		switch expectRendezvous(b) {
		case rdvDropped:
			if rerr == nil {
				t.Fatalf("%q: want the connection dropped, got frame %d %q", b, typ, reply)
			}
			p1, payload, err := Rendezvous(ctx, env(1), opts, nil)
			if err != nil {
				t.Fatalf("%q: then the real rank 1: %v", b, err)
			}
			p1.Close()
			res := <-rank0
			if res.err != nil || string(res.payload) != id || string(payload) != id {
				t.Fatalf("%q: then the real rank 1 gets %q, rank 0 %q, %v", b, payload, res.payload, res.err)
			}
			res.peers.Close()
		case rdvRefused:
			res := <-rank0
			if rerr != nil || typ != msgReject || len(reply) == 0 || reply[0] != rejectInvalid || res.err == nil ||
				!strings.HasSuffix(res.err.Error(), string(reply[1:])) || !strings.Contains(string(reply), "rank") {
				t.Fatalf("%q: want a refusal, got frame %d %q, %v; rank 0: %v", b, typ, reply, rerr, res.err)
			}
		case rdvWelcome:
			res := <-rank0
			if rerr != nil || typ != msgWelcome || string(reply) != id {
				t.Fatalf("%q: want the welcome, got frame %d %q, %v", b, typ, reply, rerr)
			}
			if res.err != nil || string(res.payload) != id {
				t.Fatalf("%q: welcomed, but rank 0 gives %q, %v", b, res.payload, res.err)
			}
			res.peers.Close()
		}
	})
}
