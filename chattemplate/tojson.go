package chattemplate

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"
)

// transformers replaces Jinja's tojson filter with json.dumps(x, ensure_ascii=False,
// indent=indent, separators=separators, sort_keys=sort_keys). The template engine's own
// tojson sorts keys when indenting, so templates are compiled with "| tojson" renamed to this
// filter, which follows Python's output exactly (key order, separators, float format).
const tojsonName = "loom_tojson"

var tojsonUse = regexp.MustCompile(`(\|\s*)tojson\b`)

func rewriteToJSON(src string) string { return tojsonUse.ReplaceAllString(src, "${1}"+tojsonName) }

// toJSON is the tojson filter: args[0] is the value; kwargs may hold indent, separators and
// sort_keys (ensure_ascii is always off, as in transformers).
func toJSON(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), fmt.Errorf("tojson: no value")
	}
	e := jsonEncoder{item: ", ", key: ": "}
	if ind, ok := kwargs["indent"]; ok && !ind.IsNone() && !ind.IsUndefined() {
		switch {
		case ind.IsInt():
			e.indent = strings.Repeat(" ", int(max(ind.AsInt(), 0)))
		case ind.IsString():
			e.indent = ind.AsString()
		default:
			return jinja.Undefined(), fmt.Errorf("tojson: indent must be an int or a string")
		}
		e.pretty, e.item = true, ","
	}
	if len(args) > 1 && !e.pretty && args[1].IsInt() { // tojson(4): indent given positionally
		e.indent, e.pretty, e.item = strings.Repeat(" ", int(max(args[1].AsInt(), 0))), true, ","
	}
	if sep, ok := kwargs["separators"]; ok && !sep.IsNone() && !sep.IsUndefined() {
		if !sep.IsList() || sep.AsList().Len() != 2 || !sep.AsList().Get(0).IsString() || !sep.AsList().Get(1).IsString() {
			return jinja.Undefined(), fmt.Errorf("tojson: separators must be two strings")
		}
		e.item, e.key = sep.AsList().Get(0).AsString(), sep.AsList().Get(1).AsString()
	}
	if sk, ok := kwargs["sort_keys"]; ok {
		e.sortKeys = sk.IsTruthy()
	}
	if err := e.encode(args[0], 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(e.b.String()), nil
}

type jsonEncoder struct {
	b         strings.Builder
	item, key string
	indent    string
	pretty    bool
	sortKeys  bool
	// open holds the lists and dicts being written: a template can make a list hold
	// itself (messages.append(messages)), which Python refuses and which recursed here
	// until the stack overflowed.
	open map[any]bool
}

// enter marks the list or dict c as being written, failing as Python does when it already is.
func (e *jsonEncoder) enter(c any) error {
	if e.open[c] {
		return fmt.Errorf("tojson: circular reference detected")
	}
	if e.open == nil {
		e.open = map[any]bool{}
	}
	e.open[c] = true
	return nil
}

func (e *jsonEncoder) newline(depth int) {
	if e.pretty {
		e.b.WriteByte('\n')
		for range depth {
			e.b.WriteString(e.indent)
		}
	}
}

func (e *jsonEncoder) encode(v jinja.Value, depth int) error {
	switch {
	case v.IsNone() || v.IsUndefined():
		e.b.WriteString("null")
	case v.IsBool():
		e.b.WriteString(strconv.FormatBool(v.AsBool()))
	case v.IsInt():
		e.b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		e.b.WriteString(pythonFloat(v.AsFloat()))
	case v.IsString():
		writeJSONString(&e.b, v.AsString())
	case v.IsList():
		if err := e.enter(v.AsList()); err != nil {
			return err
		}
		defer delete(e.open, v.AsList())
		items := v.AsList().Items
		return e.container('[', ']', len(items), depth, func(i int) error {
			return e.encode(items[i], depth+1)
		})
	case v.IsDict():
		d := v.AsDict()
		if err := e.enter(d); err != nil {
			return err
		}
		defer delete(e.open, d)
		keys := d.OrderedKeys()
		if e.sortKeys {
			keys = append([]string(nil), keys...)
			sort.Strings(keys)
		}
		return e.container('{', '}', len(keys), depth, func(i int) error {
			writeJSONString(&e.b, keys[i])
			e.b.WriteString(e.key)
			val, _ := d.Get(keys[i])
			return e.encode(val, depth+1)
		})
	default:
		return fmt.Errorf("tojson: cannot encode %s", v.String())
	}
	return nil
}

// container writes a list or an object of n items between left and right, one item at a
// time by item(i), with the separator and (when indenting) one line each. An empty one is
// written as left and right alone, as Python does.
func (e *jsonEncoder) container(left, right byte, n, depth int, item func(i int) error) error {
	e.b.WriteByte(left)
	if n == 0 {
		e.b.WriteByte(right)
		return nil
	}
	for i := range n {
		if i > 0 {
			e.b.WriteString(e.item)
		}
		e.newline(depth + 1)
		if err := item(i); err != nil {
			return err
		}
	}
	e.newline(depth)
	e.b.WriteByte(right)
	return nil
}

// writeJSONString writes s as Python's json.dumps with ensure_ascii=False does: only the
// quote, the backslash and control characters are escaped.
func writeJSONString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// pythonFloat formats f as Python's repr(float): the shortest digits that read back as f,
// in fixed notation for exponents from -4 to 15 (with ".0" when integral), else scientific.
func pythonFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	sci := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	mant, expStr, _ := strings.Cut(sci, "e")
	exp, _ := strconv.Atoi(expStr)
	if exp < -4 || exp >= 16 {
		return mant + "e" + fmt.Sprintf("%+03d", exp)
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}
