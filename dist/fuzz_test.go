package dist

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
)

// FuzzReadFrame reads frames from an arbitrary stream, as the rendezvous and the step
// transport do. Each frame read is the type byte and the payload its header announces, at
// most max bytes, and consumes exactly its bytes; writing it again gives those bytes back.
// The stream ends with io.EOF when it ends between frames, io.ErrUnexpectedEOF inside one,
// and an error naming the protocol when a header announces more than max.
func FuzzReadFrame(f *testing.F) {
	var b bytes.Buffer
	WriteFrame(&b, 1, []byte("loom-nccl-rendezvous/1\x00\x00\x00\x01\x00\x00\x00\x02"))
	WriteFrame(&b, 7, nil)
	f.Add(b.Bytes(), uint16(64))
	f.Add([]byte{3, 0, 0, 1, 0}, uint16(255))
	f.Add([]byte{3, 0, 0, 0, 2, 'a'}, uint16(2))
	f.Add([]byte{3, 0}, uint16(0))
	f.Fuzz(func(t *testing.T, stream []byte, max16 uint16) {
		max := uint32(max16)
		r := bytes.NewReader(stream)
		for {
			before := r.Len()
			typ, payload, err := ReadFrame(r, max, "the fuzz protocol")
			if err != nil {
				switch {
				case before == 0 && !errors.Is(err, io.EOF):
					t.Fatalf("at the end of the stream: %v, want io.EOF", err)
				case before > 0 && before < 5 && !errors.Is(err, io.ErrUnexpectedEOF):
					t.Fatalf("%d bytes left: %v, want io.ErrUnexpectedEOF", before, err)
				case before >= 5:
					rest := stream[len(stream)-before:]
					n := binary.BigEndian.Uint32(rest[1:5])
					switch {
					case n > max && !strings.Contains(err.Error(), "not the fuzz protocol"):
						t.Fatalf("frame of %d bytes (max %d): %v", n, max, err)
					case n <= max && !errors.Is(err, io.ErrUnexpectedEOF):
						t.Fatalf("frame of %d bytes with %d left: %v", n, before-5, err)
					}
				}
				return
			}
			used := stream[len(stream)-before : len(stream)-r.Len()]
			if uint32(len(payload)) > max || len(used) != 5+len(payload) || typ != used[0] {
				t.Fatalf("frame %d of %d bytes (max %d) from %d bytes", typ, len(payload), max, len(used))
			}
			var w bytes.Buffer
			if err := WriteFrame(&w, typ, payload); err != nil || !bytes.Equal(w.Bytes(), used) {
				t.Fatalf("frame %x writes back as %x (%v)", used, w.Bytes(), err)
			}
		}
	})
}
