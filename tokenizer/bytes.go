package tokenizer

import "unicode/utf8"

// byteToRune and runeToByte are GPT-2's reversible byte <-> character table used by the
// ByteLevel pre-tokenizer and decoder: printable Latin-1 bytes map to themselves and the
// other 68 bytes to U+0100 upwards, so that every byte has a visible, non-space character.
var (
	byteToRune [256]rune
	byteToStr  [256]string
	runeToByte [324]int16 // -1 for characters outside the table
)

func init() {
	for i := range runeToByte {
		runeToByte[i] = -1
	}
	n := 0
	for b := 0; b < 256; b++ {
		var r rune
		switch {
		case b >= '!' && b <= '~', b >= 0xA1 && b <= 0xAC, b >= 0xAE && b <= 0xFF:
			r = rune(b)
		default:
			r = rune(256 + n)
			n++
		}
		byteToRune[b] = r
		byteToStr[b] = string(r)
		runeToByte[r] = int16(b)
	}
}

// byteOfRune returns the byte that ByteLevel character r stands for.
func byteOfRune(r rune) (byte, bool) {
	if r < 0 || int(r) >= len(runeToByte) || runeToByte[r] < 0 {
		return 0, false
	}
	return byte(runeToByte[r]), true
}

// byteLevelEncode maps every byte of s to its ByteLevel character.
func byteLevelEncode(s string) string {
	buf := make([]byte, 0, 2*len(s))
	for i := 0; i < len(s); i++ {
		buf = append(buf, byteToStr[s[i]]...)
	}
	return string(buf)
}

// utf8SeqLen reports how s begins: n > 0 is the length of a well-formed UTF-8 character at the
// start of s; n < 0 means the first -n bytes are an ill-formed sequence that must be replaced by
// one U+FFFD (the "maximal subpart" rule of Unicode, as Rust's from_utf8_lossy and Python's
// errors="replace" apply it); n == 0 means s is a proper prefix of a well-formed character, so
// more bytes could still complete it. s must not be empty.
func utf8SeqLen(s []byte) int {
	b := s[0]
	if b < 0x80 {
		return 1
	}
	var size int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case b >= 0xC2 && b <= 0xDF:
		size = 2
	case b == 0xE0:
		size, lo = 3, 0xA0
	case b >= 0xE1 && b <= 0xEC, b == 0xEE, b == 0xEF:
		size = 3
	case b == 0xED:
		size, hi = 3, 0x9F
	case b == 0xF0:
		size, lo = 4, 0x90
	case b >= 0xF1 && b <= 0xF3:
		size = 4
	case b == 0xF4:
		size, hi = 4, 0x8F
	default:
		return -1
	}
	for i := 1; i < size; i++ {
		if i >= len(s) {
			return 0
		}
		c := s[i]
		if i == 1 {
			if c < lo || c > hi {
				return -1
			}
		} else if c < 0x80 || c > 0xBF {
			return -i
		}
	}
	return size
}

// appendLossy appends b to dst as valid UTF-8, replacing each ill-formed subsequence with
// U+FFFD exactly as Rust's String::from_utf8_lossy does. When final is false, a trailing
// incomplete character is not converted; its length is returned as rest so the caller can
// keep those bytes until more arrive.
func appendLossy(dst []byte, b []byte, final bool) (out []byte, rest int) {
	for i := 0; i < len(b); {
		if b[i] < utf8.RuneSelf {
			dst = append(dst, b[i])
			i++
			continue
		}
		n := utf8SeqLen(b[i:])
		switch {
		case n > 0:
			dst = append(dst, b[i:i+n]...)
			i += n
		case n < 0:
			dst = append(dst, "\uFFFD"...)
			i += -n
		default: // incomplete at the end
			if !final {
				return dst, len(b) - i
			}
			dst = append(dst, "\uFFFD"...)
			i = len(b)
		}
	}
	return dst, 0
}

// sanitizeUTF8 returns s with each byte that is not part of a valid UTF-8 encoding replaced
// by U+FFFD (the same decoding as a Go range loop). Valid input is returned unchanged.
func sanitizeUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	buf := make([]byte, 0, len(s)+8)
	for _, r := range s {
		buf = utf8.AppendRune(buf, r)
	}
	return string(buf)
}
