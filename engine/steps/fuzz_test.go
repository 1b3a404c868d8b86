package steps

import (
	"bytes"
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

// Fuzz targets of the step protocol between rank 0 and its followers (steps.go): the step
// and launch payloads (FuzzStepRoundTrip, FuzzLaunchRoundTrip; FuzzDecodeLaunch in
// steps_test.go checks the draws) and rank 0's side of the hello (FuzzStepHello).

// canonicalStep reports whether a payload decodeStep accepted is one encodeStep writes:
// names sorted and unique (the map keeps the last of a repeated name), and none a KV cache
// (encodeStep sends caches as their number of blocks only).
func canonicalStep(payload []byte, m stepMsg) bool {
	names := stepNames(payload)
	for _, name := range names {
		if IsCacheInput(name) {
			return false
		}
	}
	return slices.IsSorted(names) && len(slices.Compact(slices.Clone(names))) == len(names)
}

// stepNames lists the input names of an accepted step payload in their order.
func stepNames(payload []byte) []string {
	b := payload[12:]
	count := binary.LittleEndian.Uint32(b)
	b = b[4:]
	var names []string
	for range count {
		n := int(binary.LittleEndian.Uint16(b))
		names = append(names, string(b[2:2+n]))
		b = b[2+n:]
		dt, dims := tensor.DType(b[0]), int(b[1])
		b = b[2:]
		numel := 1
		for range dims {
			numel *= int(binary.LittleEndian.Uint32(b))
			b = b[4:]
		}
		b = b[numel*dt.Size():]
	}
	return names
}

// fuzzStepInputs are m's inputs as encodeStep takes them: the blocks travel as a cache input.
func fuzzStepInputs(m stepMsg) map[string]*tensor.Tensor {
	in := make(map[string]*tensor.Tensor, len(m.inputs)+1)
	for name, t := range m.inputs {
		in[name] = t
	}
	if m.blocks > 0 {
		in["kv_cache.0.k"] = &tensor.Tensor{DType: tensor.F32, Shape: []int{m.blocks, 1}}
	}
	return in
}

// checkStepDecoded asserts that an accepted step's tensors hold their data and fit the
// payload they came from.
func checkStepDecoded(t *testing.T, payload []byte, m stepMsg) {
	t.Helper()
	size := 16
	for name, in := range m.inputs {
		if in.DType != tensor.I32 && in.DType != tensor.I64 && in.DType != tensor.F32 {
			t.Fatalf("input %q decoded as %s", name, in.DType)
		}
		if in.Len() != tensor.Numel(in.Shape) {
			t.Fatalf("input %q: %s%v holds %d elements", name, in.DType, in.Shape, in.Len())
		}
		size += 2 + len(name) + 2 + 4*len(in.Shape) + in.Len()*in.DType.Size()
	}
	if size > len(payload) {
		t.Fatalf("%d bytes of inputs decoded from a payload of %d", size, len(payload))
	}
}

// FuzzStepRoundTrip decodes arbitrary step payloads. What decodeStep accepts holds tensors
// of the dtypes steps carry, whose data fits the payload; encoding it again gives the
// payload back when it is in encodeStep's form (see canonicalStep), and in any case a
// payload that decodes and encodes to itself.
func FuzzStepRoundTrip(f *testing.F) {
	for _, in := range []map[string]*tensor.Tensor{
		{"input_ids": tensor.FromI32([]int32{1, 2, 3}, 1, 3)},
		{"input_ids": tensor.FromI32([]int32{7}, 1, 1), "positions": tensor.New(tensor.I64, 1, 1), "scale": tensor.FromF32([]float32{0.5, -1}, 2),
			"kv_cache.0.k": {DType: tensor.BF16, Shape: []int{17, 4, 2, 8}}},
		{"empty": tensor.New(tensor.I32, 0, 5), "scalar": tensor.New(tensor.F32)},
		{},
	} {
		b, err := encodeStep(42, in)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add(make([]byte, 16))
	f.Fuzz(func(t *testing.T, payload []byte) {
		m, err := decodeStep(payload)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		checkStepDecoded(t, payload, m)
		b, err := encodeStep(m.step, fuzzStepInputs(m))
		if err != nil {
			t.Fatalf("encodeStep of a decoded step: %v", err)
		}
		if canonicalStep(payload, m) && !bytes.Equal(b, payload) {
			t.Fatalf("payload\n%x\nre-encodes as\n%x", payload, b)
		}
		m2, err := decodeStep(b)
		if err != nil {
			t.Fatalf("a re-encoded step does not decode: %v", err)
		}
		if m2.step != m.step || m2.blocks != m.blocks {
			t.Fatalf("step %d, %d blocks re-encode as %d, %d", m.step, m.blocks, m2.step, m2.blocks)
		}
		if b2, err := encodeStep(m2.step, fuzzStepInputs(m2)); err != nil || !bytes.Equal(b, b2) {
			t.Fatalf("encoding is not stable: %x, then %x (%v)", b, b2, err)
		}
	})
}

// FuzzLaunchRoundTrip decodes arbitrary launch payloads: what decodeLaunch accepts encodes
// back to the same payload when its step is in encodeStep's form, its draws and feed flag
// included, and to a payload that decodes to the same launch otherwise.
func FuzzLaunchRoundTrip(f *testing.F) {
	in := map[string]*tensor.Tensor{"input_ids": tensor.FromI32([]int32{1, 2}, 1, 2), "kv_cache.0.v": {DType: tensor.F32, Shape: []int{3, 1}}}
	for i, draws := range [][]sample.DeviceDraw{nil, {{Temperature: 0.7, TopP: 0.9, MinP: 0.05, TopK: 40, Seed: 1 << 60, Counter: 9}, {TopK: -1}}} {
		b, err := encodeLaunch(uint64(i), in, draws, i == 1)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		m, err := decodeLaunch(payload)
		if err != nil {
			return
		}
		head := 5 + drawBytes*len(m.draws)
		checkStepDecoded(t, payload[head:], m.stepMsg)
		b, err := encodeLaunch(m.step, fuzzStepInputs(m.stepMsg), m.draws, m.feed)
		if err != nil {
			t.Fatalf("encodeLaunch of a decoded launch: %v", err)
		}
		if !bytes.Equal(b[:head], payload[:head]) {
			t.Fatalf("feed and draws\n%x\nre-encode as\n%x", payload[:head], b[:head])
		}
		if canonicalStep(payload[head:], m.stepMsg) && !bytes.Equal(b, payload) {
			t.Fatalf("payload\n%x\nre-encodes as\n%x", payload, b)
		}
		m2, err := decodeLaunch(b)
		if err != nil || m2.feed != m.feed || len(m2.draws) != len(m.draws) || m2.step != m.step || m2.blocks != m.blocks {
			t.Fatalf("re-encoded launch decodes as %+v, %v; want %+v", m2, err, m)
		}
	})
}

// helloOutcome is what rank 0 does with a connection that sends b (then closes its side),
// by the protocol's description: drop it (a frame that is not a hello), reject it and go on
// waiting (a hello cut short), reject it and fail (a rank or world size that does not fit a
// world of 2), or welcome rank 1.
type helloOutcome int

const (
	helloDropped helloOutcome = iota
	helloMalformed
	helloRefused
	helloWelcome
)

func expectHello(b []byte) (helloOutcome, uint64, bool) {
	if len(b) < 5 {
		return helloDropped, 0, false
	}
	n := binary.BigEndian.Uint32(b[1:5])
	if n > maxStepFrame || uint64(len(b)) < 5+uint64(n) || b[0] != stepHello {
		return helloDropped, 0, false
	}
	payload := b[5 : 5+n]
	rest, ok := bytes.CutPrefix(payload, []byte(stepMagic))
	switch {
	case !ok:
		return helloDropped, 0, false
	case len(rest) < 17:
		return helloMalformed, 0, false
	}
	rank, size := binary.LittleEndian.Uint32(rest), binary.LittleEndian.Uint32(rest[4:])
	if rank != 1 || size != 2 {
		return helloRefused, 0, false
	}
	return helloWelcome, binary.LittleEndian.Uint64(rest[8:]), rest[16]&followLaunches != 0
}

// FuzzStepHello has rank 0 of a world of 2 accept a connection that sends arbitrary bytes
// (over loopback TCP), and checks that rank 0 answers as the protocol says (expectHello):
// a dropped connection is closed without an answer, a malformed hello gets a reject frame,
// and either way rank 0 goes on to welcome the real rank 1; a hello of a rank or world that
// does not fit is refused with a reject frame naming the rank, and acceptFollowers fails
// with the same words; the hello of rank 1 is welcomed, with its free memory and flags.
func FuzzStepHello(f *testing.F) {
	hello := func(rank, size uint32, free uint64, flags byte) []byte {
		p := []byte(stepMagic)
		p = binary.LittleEndian.AppendUint32(p, rank)
		p = binary.LittleEndian.AppendUint32(p, size)
		p = binary.LittleEndian.AppendUint64(p, free)
		p = append(p, flags)
		var b bytes.Buffer
		writeStepFrame(&b, stepHello, p)
		return b.Bytes()
	}
	f.Add(hello(1, 2, 1<<30, followLaunches))
	f.Add(hello(1, 2, 0, 0xfe))
	f.Add(hello(0, 2, 5, 0))
	f.Add(hello(2, 2, 5, 0))
	f.Add(hello(1, 3, 5, 0))
	f.Add(hello(1<<31, 2, 5, 0))
	f.Add(append(hello(1, 2, 7, 0), "trailing bytes"...))
	f.Add(hello(1, 2, 7, 0)[:20])
	short := hello(1, 2, 7, 0)
	binary.BigEndian.PutUint32(short[1:5], uint32(len(stepMagic)+3))
	f.Add(short[:5+len(stepMagic)+3])
	f.Add([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	f.Add([]byte{stepHello, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.DiscardHandler)) // rank 0 warns of every dropped connection
	f.Cleanup(func() { slog.SetDefault(prev) })
	f.Fuzz(func(t *testing.T, b []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		type result struct {
			rrs []*Remote
			err error
		}
		done := make(chan result, 1)
		go func() {
			rrs, err := acceptFollowers(ctx, ln, 2)
			done <- result{rrs, err}
		}()
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(15 * time.Second))
		if _, err := conn.Write(b); err != nil {
			t.Fatal(err)
		}
		conn.(*net.TCPConn).CloseWrite()
		typ, reply, rerr := readStepFrame(conn)

		want, free, launches := expectHello(b)
		switch want {
		case helloDropped, helloMalformed:
			// Closed without an answer: EOF, or a reset when rank 0 left bytes unread.
			if want == helloDropped && rerr == nil {
				t.Fatalf("%q: want the connection dropped, got frame %d %q, %v", b, typ, reply, rerr)
			}
			if want == helloMalformed && (rerr != nil || typ != stepReject || string(reply) != "malformed hello") {
				t.Fatalf("%q: want a reject, got frame %d %q, %v", b, typ, reply, rerr)
			}
			real, err := dialRank0(ctx, ln.Addr().String(), 1, 2, 99, true)
			if err != nil {
				t.Fatalf("%q: the real rank 1 after it: %v", b, err)
			}
			defer real.Close()
			res := <-done
			if res.err != nil || len(res.rrs) != 1 || res.rrs[0].rank != 1 || res.rrs[0].free != 99 || !res.rrs[0].launches {
				t.Fatalf("%q: then rank 1 connects: %v, %v", b, res.rrs, res.err)
			}
			res.rrs[0].conn.Close()
		case helloRefused:
			res := <-done
			if rerr != nil || typ != stepReject || res.err == nil || res.err.Error() != string(reply) || !strings.Contains(string(reply), "rank ") {
				t.Fatalf("%q: want a refusal, got frame %d %q, %v; acceptFollowers: %v", b, typ, reply, rerr, res.err)
			}
		case helloWelcome:
			res := <-done
			if rerr != nil || typ != stepWelcome || len(reply) != 0 {
				t.Fatalf("%q: want a welcome, got frame %d %q, %v", b, typ, reply, rerr)
			}
			if res.err != nil || len(res.rrs) != 1 || res.rrs[0].rank != 1 || res.rrs[0].free != free || res.rrs[0].launches != launches {
				t.Fatalf("%q: welcomed, but acceptFollowers gives %v, %v", b, res.rrs, res.err)
			}
			res.rrs[0].conn.Close()
		}
	})
}

// fuzzFollower is a follower's executable that keeps its caches (so that no step, whatever
// its number of blocks, allocates them on the host) and runs every step.
type fuzzFollower struct{ runs int }

func (e *fuzzFollower) Run(context.Context, map[string]*tensor.Tensor) ([]*tensor.Tensor, error) {
	e.runs++
	return nil, nil
}

func (e *fuzzFollower) Resident() []string { return []string{"kv_cache.0.k", "kv_cache.0.v"} }

// followReply is a reply a follower sends: the step it answers, and whether it failed.
type followReply struct {
	step   uint64
	failed bool
}

// expectFollow is what a follower that cannot launch steps ahead does with the stream b from
// rank 0, by the protocol's description: the replies it sends, and how Follow ends (nil after
// a goodbye, else an error holding want).
func expectFollow(b []byte) (replies []followReply, bye bool, want string) {
	for steps := 0; ; {
		if len(b) < 5 {
			return replies, false, "without a goodbye"
		}
		typ, n := b[0], binary.BigEndian.Uint32(b[1:5])
		if n > maxStepFrame {
			return replies, false, "read rank 0's next step"
		}
		if uint64(len(b)) < 5+uint64(n) {
			return replies, false, "without a goodbye"
		}
		payload := b[5 : 5+n]
		b = b[5+n:]
		var m stepMsg
		var err error
		switch typ {
		case stepBye:
			return replies, true, ""
		case stepRun:
			m, err = decodeStep(payload)
		case stepLaunch:
			var lm launchMsg
			lm, err = decodeLaunch(payload)
			m = lm.stepMsg
		default:
			return replies, false, "not a step"
		}
		if err != nil {
			return replies, false, "rank 0's step"
		}
		steps++
		if m.blocks < 1 {
			return replies, false, "no KV cache blocks"
		}
		replies = append(replies, followReply{m.step, typ == stepLaunch})
	}
}

// FuzzFollow has a follower read an arbitrary stream of frames from rank 0 (over loopback
// TCP) and checks it against the protocol (expectFollow): the follower replies to each step
// in order, done for a step it ran and failed for a launch (it cannot launch steps ahead),
// returns nil after a goodbye, having sent every reply, and otherwise an error that says
// why, having sent the replies of the steps before (or some of them: an error does not wait
// for replies in flight).
func FuzzFollow(f *testing.F) {
	in := map[string]*tensor.Tensor{"input_ids": tensor.FromI32([]int32{1, 2}, 1, 2), "kv_cache.0.k": {DType: tensor.F32, Shape: []int{4, 4, 1, 2}}}
	step, err := encodeStep(1, in)
	if err != nil {
		f.Fatal(err)
	}
	launch, err := encodeLaunch(2, in, make([]sample.DeviceDraw, 1), true)
	if err != nil {
		f.Fatal(err)
	}
	noCache, err := encodeStep(3, map[string]*tensor.Tensor{"input_ids": tensor.FromI32([]int32{1}, 1, 1)})
	if err != nil {
		f.Fatal(err)
	}
	frames := func(parts ...[]byte) []byte {
		var b bytes.Buffer
		for i := 0; i < len(parts); i += 2 {
			writeStepFrame(&b, parts[i][0], parts[i+1])
		}
		return b.Bytes()
	}
	ty := func(typ byte) []byte { return []byte{typ} }
	f.Add(frames(ty(stepRun), step, ty(stepRun), step, ty(stepBye), nil))
	f.Add(frames(ty(stepRun), step, ty(stepLaunch), launch, ty(stepRun), step, ty(stepBye), nil))
	f.Add(frames(ty(stepRun), step))
	f.Add(frames(ty(stepRun), noCache, ty(stepBye), nil))
	f.Add(frames(ty(stepRun), step[:10], ty(stepBye), nil))
	f.Add(frames(ty(stepWelcome), nil))
	f.Add(frames(ty(stepBye), []byte("extra"), ty(stepRun), step))
	f.Add(append(frames(ty(stepRun), step), 4, 0, 0))
	f.Add([]byte{stepRun, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		accepted := make(chan net.Conn, 1)
		go func() {
			c, _ := ln.Accept()
			accepted <- c
		}()
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		rank0 := <-accepted
		if rank0 == nil {
			t.Fatal("accept failed")
		}
		defer rank0.Close()
		rank0.SetDeadline(time.Now().Add(15 * time.Second))
		go func() {
			rank0.Write(b)
			rank0.(*net.TCPConn).CloseWrite()
		}()
		exe := &fuzzFollower{}
		ferr := Follow(ctx, exe, testSpec, conn)
		conn.Close()
		var got []followReply
		for {
			typ, msg, err := readStepFrame(rank0)
			if err != nil {
				break
			}
			if (typ != stepDone && typ != stepFailed) || len(msg) < 8 || (typ == stepDone) != (len(msg) == 8) {
				t.Fatalf("follower sent frame %d %q", typ, msg)
			}
			got = append(got, followReply{binary.LittleEndian.Uint64(msg), typ == stepFailed})
		}
		want, bye, why := expectFollow(b)
		switch {
		case bye && ferr != nil:
			t.Fatalf("stream %x ends with a goodbye, Follow: %v", b, ferr)
		case !bye && (ferr == nil || !strings.Contains(ferr.Error(), why)):
			t.Fatalf("stream %x: Follow returns %v, want an error with %q", b, ferr, why)
		case bye && !slices.Equal(got, want), !bye && (len(got) > len(want) || !slices.Equal(got, want[:len(got)])):
			t.Fatalf("stream %x: replies %v, want %v (Follow: %v)", b, got, want, ferr)
		}
		runs := 0
		for _, r := range want {
			if !r.failed {
				runs++
			}
		}
		if exe.runs != runs {
			t.Fatalf("stream %x: %d steps run, want %d", b, exe.runs, runs)
		}
	})
}
