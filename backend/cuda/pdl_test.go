package cuda

import (
	"regexp"
	"strings"
	"testing"
)

// braceBody returns the text between the brace at src[open] and its match.
func braceBody(src string, open int) string {
	depth := 0
	for i := open; i < len(src); i++ {
		switch src[i] {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return src[open+1 : i]
			}
		}
	}
	return src[open+1:]
}

// waitsThrough reports whether body waits itself or in an _impl function it calls, directly
// or through other _impl functions.
func waitsThrough(body string, impls map[string]string, waits func(string) bool, seen map[string]bool) bool {
	if waits(body) {
		return true
	}
	for _, c := range implCall.FindAllStringSubmatch(body, -1) {
		if !seen[c[1]] {
			seen[c[1]] = true
			if waitsThrough(impls[c[1]], impls, waits, seen) {
				return true
			}
		}
	}
	return false
}

var (
	implDef  = regexp.MustCompile(`void\s+(\w+_impl)\s*\(`)
	implCall = regexp.MustCompile(`\b(\w+_impl)\s*[<(]`)
)

// Every kernel of a file launched with programmatic dependent launch waits for the
// previous kernel (pdl_wait or pdl_begin) itself or in the _impl functions it calls: a
// kernel that did not could read its inputs before they are written.
func TestPDLFilesWait(t *testing.T) {
	waits := func(body string) bool {
		return strings.Contains(body, "pdl_wait()") || strings.Contains(body, "pdl_begin()")
	}
	for file := range pdlFiles {
		b, err := kernelFS.ReadFile("kernels/" + file)
		if err != nil {
			t.Fatalf("pdlFiles lists %s: %v", file, err)
		}
		src := string(b)
		impls := map[string]string{}
		for _, m := range implDef.FindAllStringSubmatchIndex(src, -1) {
			if open := strings.IndexByte(src[m[1]:], '{'); open >= 0 {
				impls[src[m[2]:m[3]]] = braceBody(src, m[1]+open)
			}
		}
		kernels := 0
		for rest, off := src, 0; ; {
			i := strings.Index(rest, "__global__")
			if i < 0 {
				break
			}
			at := off + i
			open := strings.IndexByte(src[at:], '{')
			if open < 0 {
				t.Fatalf("%s: a __global__ without a body", file)
			}
			header := src[at : at+open]
			body := braceBody(src, at+open)
			ok := waitsThrough(body, impls, waits, map[string]bool{})
			if !ok {
				t.Errorf("%s: kernel %q neither waits (pdl_wait/pdl_begin) nor calls an _impl that does", file, strings.TrimSpace(header))
			}
			kernels++
			off = at + open + 1
			rest = src[off:]
		}
		if kernels == 0 {
			t.Errorf("%s: no kernels found", file)
		}
	}
}
