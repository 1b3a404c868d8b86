package graph

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/loom-ml/loom/tensor"
)

// ParseError is an error in graph text, located at a line and column (both 1-based; the
// column counts characters).
type ParseError struct {
	Line, Col int
	Msg       string
	Err       error // the underlying cause, if any
}

func (e *ParseError) Error() string {
	s := fmt.Sprintf("%d:%d: %s", e.Line, e.Col, e.Msg)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the underlying cause.
func (e *ParseError) Unwrap() error { return e.Err }

// Parse reads a graph in the text form that (*Graph).String prints (see the comment at the top
// of print.go) and returns it verified. Omitted attributes take their declared defaults; the
// types written in the text are kept on the values and must agree with inference. Errors are
// *ParseError values that give the line and column and name the problem, except for problems
// only the final Verify finds, which are returned wrapped.
//
// Whitespace, including line breaks, only separates tokens, and "//" starts a comment that
// runs to the end of the line.
func Parse(text string) (*Graph, error) {
	p := &parser{src: text, defs: map[string]valueDef{}}
	g, err := p.parseGraph()
	if err != nil {
		return nil, err
	}
	if err := Verify(g); err != nil {
		return nil, fmt.Errorf("parse graph: %w", err)
	}
	return g, nil
}

type valueDef struct {
	v   *Value
	pos int
}

type pendingRef struct {
	name string
	pos  int
}

type parser struct {
	src  string
	pos  int
	tok  int // offset of the last token scanned, where a bad attribute value is reported
	g    *Graph
	defs map[string]valueDef
	// pending is the first use of a value that was not defined at that point. Parsing goes
	// on so that a later definition can be reported as "used before its definition"; any other
	// error found after it reports this one instead, since it comes first in the text.
	pending *pendingRef
}

// position converts a byte offset into a 1-based line and column (in characters).
func (p *parser) position(off int) (line, col int) {
	off = min(max(off, 0), len(p.src))
	line = 1 + strings.Count(p.src[:off], "\n")
	start := strings.LastIndexByte(p.src[:off], '\n') + 1
	return line, 1 + utf8.RuneCountInString(p.src[start:off])
}

func (p *parser) errAt(off int, cause error, format string, args ...any) error {
	if p.pending != nil {
		return p.undefinedErr()
	}
	line, col := p.position(off)
	return &ParseError{Line: line, Col: col, Msg: fmt.Sprintf(format, args...), Err: cause}
}

func (p *parser) undefinedErr() error {
	line, col := p.position(p.pending.pos)
	return &ParseError{Line: line, Col: col, Msg: fmt.Sprintf("undefined value %%%s", p.pending.name)}
}

// skipSpace skips whitespace and // comments.
func (p *parser) skipSpace() {
	for p.pos < len(p.src) {
		switch c := p.src[p.pos]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			p.pos++
		case c == '/' && strings.HasPrefix(p.src[p.pos:], "//"):
			if i := strings.IndexByte(p.src[p.pos:], '\n'); i >= 0 {
				p.pos += i + 1
			} else {
				p.pos = len(p.src)
			}
		default:
			return
		}
	}
}

// peek skips space and returns the next byte (0 at the end).
func (p *parser) peek() byte {
	p.skipSpace()
	if p.pos < len(p.src) {
		return p.src[p.pos]
	}
	return 0
}

// accept consumes c if it comes next.
func (p *parser) accept(c byte) bool {
	if p.peek() == c && p.pos < len(p.src) {
		p.pos++
		return true
	}
	return false
}

// expect consumes c or fails, saying what c was expected for.
func (p *parser) expect(c byte, context string) error {
	if p.accept(c) {
		return nil
	}
	return p.errAt(p.pos, nil, "expected %q %s, found %s", c, context, p.found())
}

// found describes the text at the current position (after any space) for error messages.
// It does not move the position.
func (p *parser) found() string {
	save := p.pos
	p.skipSpace()
	start := p.pos
	p.pos = save
	if start >= len(p.src) {
		return "end of input"
	}
	end := start
	for end < len(p.src) && end-start < 24 && isNameByte(p.src[end]) {
		end++
	}
	if end == start {
		_, size := utf8.DecodeRuneInString(p.src[start:])
		end = start + size
	}
	return strconv.Quote(p.src[start:end])
}

func isNameByte(c byte) bool {
	return c == '_' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// scanName reads a run of name characters (letters, digits, '_' and '.'), possibly empty,
// and returns it with its offset.
func (p *parser) scanName() (string, int) {
	p.skipSpace()
	start := p.pos
	p.tok = start
	for p.pos < len(p.src) && isNameByte(p.src[p.pos]) {
		p.pos++
	}
	return p.src[start:p.pos], start
}

// scanNumber reads a number token: an optional sign, then name characters, with a sign
// allowed right after an exponent letter. It accepts 12, -3, 2.0, 1e-05, inf and nan; the
// caller converts and rejects what is malformed.
func (p *parser) scanNumber() (string, int) {
	p.skipSpace()
	start := p.pos
	p.tok = start
	if p.pos < len(p.src) && (p.src[p.pos] == '-' || p.src[p.pos] == '+') {
		p.pos++
	}
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		switch {
		case isNameByte(c):
			p.pos++
		case (c == '-' || c == '+') && p.pos > start && (p.src[p.pos-1] == 'e' || p.src[p.pos-1] == 'E'):
			p.pos++
		default:
			return p.src[start:p.pos], start
		}
	}
	return p.src[start:p.pos], start
}

// scanString reads a Go double-quoted string.
func (p *parser) scanString(context string) (string, int, error) {
	if context != "" {
		context = " " + context
	}
	p.skipSpace()
	start := p.pos
	if p.pos >= len(p.src) || p.src[p.pos] != '"' {
		return "", start, p.errAt(start, nil, "expected a quoted string%s, found %s", context, p.found())
	}
	i := p.pos + 1
	for ; i < len(p.src); i++ {
		c := p.src[i]
		if c == '\\' {
			i++
			continue
		}
		if c == '\n' {
			break
		}
		if c == '"' {
			s, err := strconv.Unquote(p.src[start : i+1])
			if err != nil {
				return "", start, p.errAt(start, err, "bad quoted string%s", context)
			}
			p.pos = i + 1
			return s, start, nil
		}
	}
	return "", start, p.errAt(start, nil, "unterminated string%s", context)
}

func (p *parser) parseGraph() (*Graph, error) {
	kw, off := p.scanName()
	if kw != "graph" {
		p.pos = off
		return nil, p.errAt(off, nil, "expected \"graph\", found %s", p.found())
	}
	var name string
	if p.peek() == '"' {
		s, _, err := p.scanString("as the graph name")
		if err != nil {
			return nil, err
		}
		name = s
	} else {
		name, _ = p.scanName()
	}
	p.g = New(name)
	if err := p.expect('(', "after the graph name"); err != nil {
		return nil, err
	}
	if !p.accept(')') {
		for {
			name, off := p.scanName()
			if name == "" {
				return nil, p.errAt(off, nil, "expected an input name, found %s", p.found())
			}
			if err := p.expect(':', "after input "+name); err != nil {
				return nil, err
			}
			t, toff, err := p.parseType()
			if err != nil {
				return nil, err
			}
			if err := checkType(t); err != nil {
				return nil, p.errAt(toff, err, "input %s: bad type %s", name, t)
			}
			v := &Value{Name: name, Type: t}
			if err := p.define(v, off); err != nil {
				return nil, err
			}
			p.g.Inputs = append(p.g.Inputs, v)
			if p.accept(',') {
				continue
			}
			if err := p.expect(')', "after the graph inputs"); err != nil {
				return nil, err
			}
			break
		}
	}
	if err := p.expect('{', "to open the graph body"); err != nil {
		return nil, err
	}
	for {
		if p.peek() == '%' {
			if err := p.parseNode(); err != nil {
				return nil, err
			}
			continue
		}
		word, off := p.scanName()
		if word != "return" {
			p.pos = off
			return nil, p.errAt(off, nil, "expected a node (%%name = op ...) or return, found %s", p.found())
		}
		break
	}
	if p.peek() == '%' {
		for {
			name, off, err := p.parseRef()
			if err != nil {
				return nil, err
			}
			p.g.Outputs = append(p.g.Outputs, p.resolve(name, off))
			if !p.accept(',') {
				break
			}
		}
	}
	if err := p.expect('}', "to close the graph body"); err != nil {
		return nil, err
	}
	if p.peek() != 0 || p.pos < len(p.src) {
		return nil, p.errAt(p.pos, nil, "unexpected %s after the end of the graph", p.found())
	}
	if p.pending != nil {
		return nil, p.undefinedErr()
	}
	p.finishNames()
	return p.g, nil
}

// finishNames records every name in the graph so that names made later by NewNode never
// collide with parsed ones, and starts numbering after the largest numeric name.
func (p *parser) finishNames() {
	names := make(map[string]bool, len(p.defs))
	next := 0
	for name := range p.defs {
		names[name] = true
		if n, err := strconv.Atoi(name); err == nil && n >= 0 && n < 1<<40 && strconv.Itoa(n) == name {
			next = max(next, n+1)
		}
	}
	p.g.names = names
	p.g.nextID = next
}

// define adds a value to the symbol table.
func (p *parser) define(v *Value, off int) error {
	if d, dup := p.defs[v.Name]; dup {
		line, col := p.position(d.pos)
		return p.errAt(off, nil, "value %%%s is defined twice (first at %d:%d)", v.Name, line, col)
	}
	if p.pending != nil && p.pending.name == v.Name {
		line, col := p.position(p.pending.pos)
		dl, dc := p.position(off)
		return &ParseError{Line: line, Col: col, Msg: fmt.Sprintf("value %%%s is used before its definition at %d:%d", v.Name, dl, dc)}
	}
	p.defs[v.Name] = valueDef{v, off}
	return nil
}

// parseRef reads %name and returns the name and the offset of '%'.
func (p *parser) parseRef() (string, int, error) {
	p.skipSpace()
	off := p.pos
	if p.pos >= len(p.src) || p.src[p.pos] != '%' {
		return "", off, p.errAt(off, nil, "expected a value (%%name), found %s", p.found())
	}
	p.pos++
	start := p.pos
	for p.pos < len(p.src) && isNameByte(p.src[p.pos]) {
		p.pos++
	}
	if p.pos == start {
		return "", off, p.errAt(off, nil, "expected a value name after %%, found %s", p.found())
	}
	return p.src[start:p.pos], off, nil
}

// resolve returns the value a name refers to. An undefined name gives a placeholder and is
// remembered (see parser.pending).
func (p *parser) resolve(name string, off int) *Value {
	if d, ok := p.defs[name]; ok {
		return d.v
	}
	if p.pending == nil {
		p.pending = &pendingRef{name, off}
	}
	return &Value{Name: name}
}

func (p *parser) parseType() (Type, int, error) {
	name, off := p.scanName()
	if name == "" {
		return Type{}, off, p.errAt(off, nil, "expected a type such as f32[B,S], found %s", p.found())
	}
	dt, err := tensor.ParseDType(name)
	if err != nil {
		return Type{}, off, p.errAt(off, err, "bad type")
	}
	s, err := p.parseShape()
	if err != nil {
		return Type{}, off, err
	}
	return Type{dt, s}, off, nil
}

// parseShape reads [d0,d1,...]; each dimension is an integer or a symbol.
func (p *parser) parseShape() (Shape, error) {
	if err := p.expect('[', "to open a shape"); err != nil {
		return nil, err
	}
	s := Shape{}
	if p.accept(']') {
		return s, nil
	}
	for {
		switch c := p.peek(); {
		case c == '-' || c == '+' || c >= '0' && c <= '9':
			tok, off := p.scanNumber()
			n, err := strconv.Atoi(tok)
			if err != nil {
				return nil, p.errAt(off, nil, "bad dimension %q: want an integer or a symbol", tok)
			}
			s = append(s, D(n))
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			name, off := p.scanName()
			if !validSym(name) {
				return nil, p.errAt(off, nil, "bad dimension %q: a symbol has letters, digits and '_'", name)
			}
			s = append(s, Sym(name))
		default:
			return nil, p.errAt(p.pos, nil, "expected a dimension (integer or symbol), found %s", p.found())
		}
		if p.accept(',') {
			continue
		}
		if err := p.expect(']', "to close a shape"); err != nil {
			return nil, err
		}
		return s, nil
	}
}

// parseNode reads one node line: %a[, %b...] = op(inputs) {attrs} : types @scope.
func (p *parser) parseNode() error {
	type outName struct {
		name string
		off  int
	}
	var outs []outName
	for {
		name, off, err := p.parseRef()
		if err != nil {
			return err
		}
		outs = append(outs, outName{name, off})
		if !p.accept(',') {
			break
		}
	}
	if err := p.expect('=', "after the result names"); err != nil {
		return err
	}
	op, opOff := p.scanName()
	if op == "" {
		return p.errAt(opOff, nil, "expected an op name, found %s", p.found())
	}
	spec, ok := Lookup(op)
	if !ok {
		return p.errAt(opOff, nil, "unknown op %q", op)
	}
	attrs := Attrs{}
	var inputs []*Value
	if op == OpParam {
		key, _, err := p.scanString("after param (the checkpoint key)")
		if err != nil {
			return err
		}
		attrs["key"] = key
	} else {
		if err := p.expect('(', "after op "+op); err != nil {
			return err
		}
		if !p.accept(')') {
			for {
				name, off, err := p.parseRef()
				if err != nil {
					return err
				}
				inputs = append(inputs, p.resolve(name, off))
				if p.accept(',') {
					continue
				}
				if err := p.expect(')', "after the inputs of "+op); err != nil {
					return err
				}
				break
			}
		}
	}
	attrsOff := -1
	if p.peek() == '{' {
		attrsOff = p.pos
		p.pos++
		if err := p.parseAttrs(spec, attrs); err != nil {
			return err
		}
	}
	if err := p.expect(':', "before the result types"); err != nil {
		return err
	}
	var types []Type
	var typeOffs []int
	for {
		t, off, err := p.parseType()
		if err != nil {
			return err
		}
		types = append(types, t)
		typeOffs = append(typeOffs, off)
		if !p.accept(',') {
			break
		}
	}
	var scope string
	if p.accept('@') {
		// The scope follows '@' directly, so that "@" at the end of a line cannot take the
		// next line's first word.
		switch {
		case p.pos < len(p.src) && p.src[p.pos] == '"':
			s, _, err := p.scanString("after @")
			if err != nil {
				return err
			}
			scope = s
		case p.pos < len(p.src) && isNameByte(p.src[p.pos]):
			scope, _ = p.scanName()
		default:
			return p.errAt(p.pos, nil, "expected a scope right after @, found %s", p.found())
		}
	}
	if len(types) != len(outs) {
		return p.errAt(typeOffs[0], nil, "%d results are named but %d types are given", len(outs), len(types))
	}
	for i, t := range types {
		if err := checkType(t); err != nil {
			return p.errAt(typeOffs[i], err, "%%%s: bad type %s", outs[i].name, t)
		}
	}
	if op == OpParam && len(types) == 1 {
		// The printer leaves out what the output type already says.
		if _, ok := attrs["dtype"]; !ok {
			attrs["dtype"] = types[0].DType
		}
		if _, ok := attrs["shape"]; !ok {
			attrs["shape"] = types[0].Shape.Clone()
		}
	}
	if err := spec.checkArity(len(inputs)); err != nil {
		return p.errAt(opOff, err, "%%%s", outs[0].name)
	}
	norm, err := spec.NormalizeAttrs(attrs)
	if err != nil {
		if attrsOff < 0 {
			attrsOff = opOff
		}
		return p.errAt(attrsOff, err, "%%%s", outs[0].name)
	}
	n := &Node{Op: op, Inputs: inputs, Attrs: norm, Scope: scope}
	for i, o := range outs {
		v := &Value{Name: o.name, Type: types[i], Producer: n, Index: i}
		if err := p.define(v, o.off); err != nil {
			return err
		}
		n.Outputs = append(n.Outputs, v)
	}
	if p.pending == nil { // inputs are all real values: check the recorded types now
		inferred, err := inferTypes(spec, n)
		if err != nil {
			return p.errAt(opOff, err, "%%%s = %s%s", outs[0].name, op, typeList(inputs))
		}
		if len(inferred) != len(types) {
			return p.errAt(typeOffs[0], nil, "%s gives %d results here, %d are written", op, len(inferred), len(types))
		}
		for i, t := range inferred {
			if !t.Equal(types[i]) {
				return p.errAt(typeOffs[i], nil, "%%%s is written as %s but %s gives %s", outs[i].name, types[i], op, t)
			}
		}
	}
	p.g.Nodes = append(p.g.Nodes, n)
	return nil
}

// parseAttrs reads name=value pairs up to the closing '}' (the '{' is consumed).
func (p *parser) parseAttrs(spec *OpSpec, attrs Attrs) error {
	if p.accept('}') {
		return nil
	}
	for {
		name, off := p.scanName()
		if name == "" {
			return p.errAt(off, nil, "expected an attribute name, found %s", p.found())
		}
		a, ok := spec.Attr(name)
		if !ok {
			return p.errAt(off, nil, "op %s has no attribute %q", spec.Name, name)
		}
		if _, dup := attrs[name]; dup {
			if spec.Name == OpParam && name == "key" {
				return p.errAt(off, nil, "param gives its key as the quoted string after the op name, not as key=")
			}
			return p.errAt(off, nil, "attribute %s of op %s is given twice", name, spec.Name)
		}
		if err := p.expect('=', "after attribute "+name); err != nil {
			return err
		}
		p.skipSpace()
		p.tok = p.pos
		v, err := p.parseAttrValue(a.Type)
		if err != nil {
			var pe *ParseError
			if errors.As(err, &pe) {
				if p.pending == nil {
					pe.Msg = fmt.Sprintf("bad value for attribute %s of op %s: %s", name, spec.Name, pe.Msg)
				}
				return pe
			}
			return p.errAt(p.tok, err, "bad value for attribute %s of op %s", name, spec.Name)
		}
		attrs[name] = v
		if p.accept(',') {
			continue
		}
		return p.expect('}', "after the attributes")
	}
}

// parseAttrValue reads one attribute value of the given type. Plain errors (not
// *ParseError) describe a malformed value; the caller adds the position and the attribute.
func (p *parser) parseAttrValue(t AttrType) (any, error) {
	switch t {
	case AttrInt:
		tok, _ := p.scanNumber()
		return parseInt(tok)
	case AttrFloat:
		tok, _ := p.scanNumber()
		return parseFloat(tok)
	case AttrString:
		s, _, err := p.scanString("")
		if err != nil {
			return nil, err
		}
		return s, nil
	case AttrBool:
		tok, _ := p.scanName()
		switch tok {
		case "true":
			return true, nil
		case "false":
			return false, nil
		}
		return nil, fmt.Errorf("want true or false, found %q", tok)
	case AttrInts:
		out := []int{}
		err := p.parseList(func() error {
			tok, _ := p.scanNumber()
			n, err := parseInt(tok)
			out = append(out, n)
			return err
		})
		return out, err
	case AttrFloats:
		out := []float64{}
		err := p.parseList(func() error {
			tok, _ := p.scanNumber()
			f, err := parseFloat(tok)
			out = append(out, f)
			return err
		})
		return out, err
	case AttrShape:
		if p.peek() != '[' {
			p.tok = p.pos
			return nil, fmt.Errorf("want a shape such as [B,S,64], found %s", p.found())
		}
		return p.parseShape()
	case AttrDType:
		tok, _ := p.scanName()
		return tensor.ParseDType(tok)
	}
	return nil, fmt.Errorf("attributes of type %s cannot be written in text", t)
}

// parseList reads [e, e, ...] calling elem for each element.
func (p *parser) parseList(elem func() error) error {
	if !p.accept('[') {
		p.tok = p.pos
		return fmt.Errorf("want a list in brackets, found %s", p.found())
	}
	if p.accept(']') {
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		if p.accept(',') {
			continue
		}
		if p.accept(']') {
			return nil
		}
		p.tok = p.pos
		return fmt.Errorf("want ',' or ']' in a list, found %s", p.found())
	}
}

func parseInt(tok string) (int, error) {
	if tok == "" {
		return 0, errors.New("want an integer, found nothing")
	}
	n, err := strconv.Atoi(tok)
	if err != nil {
		return 0, fmt.Errorf("want an integer, found %q", tok)
	}
	return n, nil
}

// parseFloat reads what FormatFloat prints, and plain integers: decimal numbers with an
// optional exponent, inf, -inf and nan (in any case). Hexadecimal floats and digit
// separators, which strconv would also take, are refused.
func parseFloat(tok string) (float64, error) {
	if tok == "" {
		return 0, errors.New("want a number, found nothing")
	}
	f, err := strconv.ParseFloat(tok, 64)
	if err != nil || strings.ContainsAny(tok, "_xX") {
		return 0, fmt.Errorf("want a number, found %q", tok)
	}
	return f, nil
}

// validSym reports whether s can be a symbolic dimension in the text form: a letter or '_'
// followed by letters, digits and '_'.
func validSym(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// checkDType reports an error unless dt is one of the element types Loom knows.
func checkDType(dt tensor.DType) error {
	if dt == tensor.Invalid {
		return errors.New("invalid dtype")
	}
	if _, err := tensor.ParseDType(dt.String()); err != nil {
		return fmt.Errorf("unknown dtype %s", dt)
	}
	return nil
}

// checkShape reports an error for a negative constant dimension, a malformed symbol, or a
// dimension that has both a symbol and a size.
func checkShape(s Shape) error {
	for i, d := range s {
		switch {
		case d.IsSym() && !validSym(d.Sym):
			return fmt.Errorf("dimension %d: bad symbol %q", i, d.Sym)
		case d.IsSym() && d.Size != 0:
			return fmt.Errorf("dimension %d: symbol %s also has size %d", i, d.Sym, d.Size)
		case !d.IsSym() && d.Size < 0:
			return fmt.Errorf("dimension %d is negative (%d)", i, d.Size)
		}
	}
	return nil
}

// checkType checks that t is a well-formed value type.
func checkType(t Type) error {
	if err := checkDType(t.DType); err != nil {
		return err
	}
	return checkShape(t.Shape)
}

// sortedKeys returns the attribute names in order.
func sortedKeys(a Attrs) []string {
	out := make([]string, 0, len(a))
	for k := range a {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
