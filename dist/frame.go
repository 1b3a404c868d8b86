package dist

import (
	"encoding/binary"
	"fmt"
	"io"
)

// The framing of Loom's small TCP protocols between ranks (the NCCL rendezvous, the engine's
// step transport): a type byte, a big-endian uint32 length and the payload.

// WriteFrame writes one frame in a single Write.
func WriteFrame(w io.Writer, typ byte, payload []byte) error {
	buf := make([]byte, 5, 5+len(payload))
	buf[0] = typ
	binary.BigEndian.PutUint32(buf[1:], uint32(len(payload)))
	_, err := w.Write(append(buf, payload...))
	return err
}

// ReadFrame reads one frame of at most max payload bytes; a larger one is an error saying
// the peer does not speak protocol. A connection closed between frames is io.EOF, one
// closed inside a frame io.ErrUnexpectedEOF.
func ReadFrame(r io.Reader, max uint32, protocol string) (byte, []byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n > max {
		return 0, nil, fmt.Errorf("frame of %d bytes (at most %d): not %s", n, max, protocol)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return head[0], payload, nil
}
