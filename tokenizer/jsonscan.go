package tokenizer

// A strict JSON scanner for the fast loader (fastload.go). It accepts exactly RFC 8259 JSON
// (what encoding/json accepts, up to a smaller nesting depth) and reports anything else as
// not ok, so that the caller falls back to encoding/json, which gives the error. It does
// not unquote strings: callers take the bytes between the quotes when a string has no
// escapes and valid UTF-8, and ask encoding/json otherwise.

// maxScanDepth bounds nesting; deeper documents go to encoding/json (whose bound is 10,000).
const maxScanDepth = 512

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// skipSpace returns the index of the first byte at or after i that is not JSON whitespace.
func skipSpace(d []byte, i int) int {
	for i < len(d) && isJSONSpace(d[i]) {
		i++
	}
	return i
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// strFlags describes a string that scanString has read.
type strFlags uint8

const (
	strEscaped strFlags = 1 << iota // has a backslash escape
	strHigh                         // has a byte of 0x80 or more
	strBadUTF8                      // is not valid UTF-8 (encoding/json reads such bytes as U+FFFD)
)

// plainByte marks the bytes that a string holds as they are: printable ASCII but '"' and '\\'.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// scanString reads the string whose opening quote is d[i] and returns the index after its
// closing quote.
func scanString(d []byte, i int) (end int, fl strFlags, ok bool) {
	i++
	for i < len(d) {
		c := d[i]
		switch {
		case plainByte[c]:
			i++
		case c == '"':
			return i + 1, fl, true
		case c >= 0x80:
			fl |= strHigh
			if c >= 0xC2 && c <= 0xDF && i+1 < len(d) && d[i+1]&0xC0 == 0x80 {
				i += 2 // the common two-byte character (the byte-level alphabet's)
			} else if n := utf8SeqLen(d[i:]); n > 0 {
				i += n
			} else {
				fl |= strBadUTF8
				i++
			}
		case c == '\\':
			fl |= strEscaped
			if i+1 >= len(d) {
				return 0, 0, false
			}
			switch d[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(d) || !isHex(d[i+2]) || !isHex(d[i+3]) || !isHex(d[i+4]) || !isHex(d[i+5]) {
					return 0, 0, false
				}
				i += 6
			default:
				return 0, 0, false
			}
		default: // a control character
			return 0, 0, false
		}
	}
	return 0, 0, false
}

// scanNumber reads the number that starts at d[i] and returns the index after it.
func scanNumber(d []byte, i int) (int, bool) {
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i >= len(d):
		return 0, false
	case d[i] == '0':
		i++
	case d[i] >= '1' && d[i] <= '9':
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	default:
		return 0, false
	}
	if i < len(d) && d[i] == '.' {
		i++
		j := i
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
		if i == j {
			return 0, false
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		j := i
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
		if i == j {
			return 0, false
		}
	}
	return i, true
}

// scanLiteral reads lit (true, false or null) at d[i].
func scanLiteral(d []byte, i int, lit string) (int, bool) {
	if len(d)-i < len(lit) || string(d[i:i+len(lit)]) != lit {
		return 0, false
	}
	return i + len(lit), true
}

// scanValue reads the value that starts at d[i] (no leading whitespace) and returns the
// index after it.
func scanValue(d []byte, i, depth int) (int, bool) {
	if i >= len(d) {
		return 0, false
	}
	switch c := d[i]; {
	case c == '"':
		end, _, ok := scanString(d, i)
		return end, ok
	case c == '{':
		return scanObject(d, i, depth+1, nil)
	case c == '[':
		return scanArray(d, i, depth+1, nil)
	case c == 't':
		return scanLiteral(d, i, "true")
	case c == 'f':
		return scanLiteral(d, i, "false")
	case c == 'n':
		return scanLiteral(d, i, "null")
	case c == '-' || c >= '0' && c <= '9':
		return scanNumber(d, i)
	}
	return 0, false
}

// scanObject reads the object whose '{' is d[i] and returns the index after its '}'. With
// member set, each member is handed to it (key: the quoted key's span, value: the value's
// span, fl as scanString reports it for the key) instead of being scanned, and
// member returns the index after the value; member returning ok false stops the scan.
// member and elem (scanArray) are called with vs < len(d).
func scanObject(d []byte, i, depth int, member func(ks, ke int, fl strFlags, vs int) (int, bool)) (int, bool) {
	if depth > maxScanDepth {
		return 0, false
	}
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == '}' {
		return i + 1, true
	}
	for {
		if i >= len(d) || d[i] != '"' {
			return 0, false
		}
		ks := i
		ke, fl, ok := scanString(d, i)
		if !ok {
			return 0, false
		}
		i = skipSpace(d, ke)
		if i >= len(d) || d[i] != ':' {
			return 0, false
		}
		i = skipSpace(d, i+1)
		if i >= len(d) {
			return 0, false
		}
		if member != nil {
			i, ok = member(ks, ke, fl, i)
		} else {
			i, ok = scanValue(d, i, depth)
		}
		if !ok {
			return 0, false
		}
		i = skipSpace(d, i)
		if i >= len(d) {
			return 0, false
		}
		switch d[i] {
		case ',':
			i = skipSpace(d, i+1)
		case '}':
			return i + 1, true
		default:
			return 0, false
		}
	}
}

// scanArray reads the array whose '[' is d[i] and returns the index after its ']'. With
// elem set, each element (its start index and its position in the array) is handed to it
// instead of being scanned, and elem returns the index after the element.
func scanArray(d []byte, i, depth int, elem func(vs, n int) (int, bool)) (int, bool) {
	if depth > maxScanDepth {
		return 0, false
	}
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == ']' {
		return i + 1, true
	}
	for n := 0; ; n++ {
		if i >= len(d) {
			return 0, false
		}
		var ok bool
		if elem != nil {
			i, ok = elem(i, n)
		} else {
			i, ok = scanValue(d, i, depth)
		}
		if !ok {
			return 0, false
		}
		i = skipSpace(d, i)
		if i >= len(d) {
			return 0, false
		}
		switch d[i] {
		case ',':
			i = skipSpace(d, i+1)
		case ']':
			return i + 1, true
		default:
			return 0, false
		}
	}
}
