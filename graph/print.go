package graph

import (
	"math"
	"strconv"
	"strings"
)

// Text form. A graph prints as
//
//	graph llama(input_ids: i32[B,S], positions: i32[B,S]) {
//	  %model.embed_tokens.weight = param "model.embed_tokens.weight" : bf16[512,64]
//	  %0 = embedding(%model.embed_tokens.weight, %input_ids) : bf16[B,S,64] @model
//	  %1, %2 = split(%0) {axis=-1, sizes=[32,32]} : bf16[B,S,32], bf16[B,S,32]
//	  return %1, %2
//	}
//
// Attributes print in the order the op declares them, and only where they differ from the
// declared default. A param prints its checkpoint key as a string after the op name; its
// dtype comes from the output type, and its full shape too unless the param is a slice. The
// scope (provenance) follows "@", and is quoted (Go syntax) unless it is a plain name; so is
// the graph name. Parse reads this form back to an equal graph.

// String returns the graph's text form.
func (g *Graph) String() string {
	var sb strings.Builder
	sb.WriteString("graph ")
	sb.WriteString(quoteIfNeeded(g.Name))
	sb.WriteString("(")
	for i, in := range g.Inputs {
		if i > 0 {
			sb.WriteString(", ")
		}
		if in == nil {
			sb.WriteString("<nil>")
			continue
		}
		sb.WriteString(in.Name)
		sb.WriteString(": ")
		sb.WriteString(in.Type.String())
	}
	sb.WriteString(") {\n")
	for _, n := range g.Nodes {
		sb.WriteString("  ")
		sb.WriteString(n.String())
		sb.WriteString("\n")
	}
	sb.WriteString("  return")
	for i, o := range g.Outputs {
		if i > 0 {
			sb.WriteString(",")
		}
		sb.WriteString(" ")
		sb.WriteString(o.String())
	}
	sb.WriteString("\n}\n")
	return sb.String()
}

// String returns the node's line in the text form (without indentation).
func (n *Node) String() string {
	if n == nil {
		return "<nil node>"
	}
	var sb strings.Builder
	for i, o := range n.Outputs {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString(o.String())
	}
	sb.WriteString(" = ")
	sb.WriteString(n.Op)
	skip := map[string]bool{}
	if n.Op == OpParam {
		sb.WriteString(" ")
		sb.WriteString(strconv.Quote(n.Attrs.String("key")))
		skip["key"], skip["dtype"] = true, true
		skip["shape"] = n.Attrs.Int("slice_dim") < 0 && n.Attrs.Int("member_parts") <= 1
	} else {
		sb.WriteString("(")
		for i, in := range n.Inputs {
			if i > 0 {
				sb.WriteString(", ")
			}
			if in == nil {
				sb.WriteString("%<nil>")
			} else {
				sb.WriteString(in.String())
			}
		}
		sb.WriteString(")")
	}
	if spec := n.Spec(); spec != nil {
		var parts []string
		for _, a := range spec.Attrs {
			v, ok := n.Attrs[a.Name]
			if !ok || skip[a.Name] || (a.Default != nil && AttrEqual(v, a.Default)) {
				continue
			}
			parts = append(parts, a.Name+"="+FormatAttr(v))
		}
		if len(parts) > 0 {
			sb.WriteString(" {")
			sb.WriteString(strings.Join(parts, ", "))
			sb.WriteString("}")
		}
	}
	sb.WriteString(" : ")
	for i, o := range n.Outputs {
		if i > 0 {
			sb.WriteString(", ")
		}
		if o == nil {
			sb.WriteString("<nil>")
		} else {
			sb.WriteString(o.Type.String())
		}
	}
	if n.Scope != "" {
		sb.WriteString(" @")
		sb.WriteString(quoteIfNeeded(n.Scope))
	}
	return sb.String()
}

// quoteIfNeeded returns s as is when it is a valid name (or empty), else Go-quoted.
func quoteIfNeeded(s string) string {
	if s == "" || validName(s) {
		return s
	}
	return strconv.Quote(s)
}

// FormatAttr prints an attribute value in the text form.
func FormatAttr(v any) string {
	switch x := v.(type) {
	case int:
		return strconv.Itoa(x)
	case float64:
		return FormatFloat(x)
	case string:
		return strconv.Quote(x)
	case bool:
		return strconv.FormatBool(x)
	case []int:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = strconv.Itoa(e)
		}
		return "[" + strings.Join(parts, ",") + "]"
	case []float64:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = FormatFloat(e)
		}
		return "[" + strings.Join(parts, ",") + "]"
	case Shape:
		return x.String()
	case interface{ String() string }:
		return x.String()
	}
	return "?"
}

// FormatFloat prints a float so that it parses back to the same bits and never looks like an
// integer: 2 prints as 2.0, and infinities and NaN as inf, -inf and nan.
func FormatFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	s := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(s, ".e") {
		s += ".0"
	}
	return s
}
