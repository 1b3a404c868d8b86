package graph

import (
	"strings"
	"testing"
)

const equalBase = `graph g(x: f32[B,4], y: f32[B,4]) {
  %a = sub(%x, %y) : f32[B,4] @m
  %b = softmax(%a) : f32[B,4] @m
  %c = sum(%b) {axes=[1]} : f32[B] @m
  return %c, %a
}
`

func TestEqual(t *testing.T) {
	base, err := Parse(equalBase)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		edit func(string) string
		want string // substring of the difference; empty: equal
	}{
		{"same text", func(s string) string { return s }, ""},
		{"other value names", func(s string) string {
			return strings.NewReplacer("%a", "%0", "%b", "%1", "%c", "%result").Replace(s)
		}, ""},
		{"graph name", func(s string) string { return strings.Replace(s, "graph g", "graph h", 1) }, `graph names differ: "g" vs "h"`},
		{"input name", func(s string) string { return strings.ReplaceAll(s, "y", "z") }, "input 1: named y vs z"},
		{"input type", func(s string) string {
			return strings.NewReplacer("y: f32[B,4]", "y: f32[1]").Replace(s)
		}, "input y: type f32[B,4] vs f32[1]"},
		{"input count", func(s string) string { return strings.Replace(s, ", y: f32[B,4])", ", y: f32[B,4], w: f32[1])", 1) }, "2 inputs vs 3"},
		{"op", func(s string) string { return strings.Replace(s, "sub(", "add(", 1) }, "node 0 (%a = sub): op sub vs add"},
		{"attribute", func(s string) string { return strings.Replace(s, "axes=[1]", "axes=[-1]", 1) }, "node 2 (%c = sum): attribute axes=[1] vs [-1]"},
		{"scope", func(s string) string { return strings.Replace(s, "f32[B,4] @m\n  %b", "f32[B,4] @n\n  %b", 1) }, `node 0 (%a = sub): scope "m" vs "n"`},
		{"wiring", func(s string) string { return strings.Replace(s, "sub(%x, %y)", "sub(%y, %x)", 1) }, "node 0 (%a = sub): input 0 is %x vs %y"},
		{"node count", func(s string) string {
			return strings.Replace(s, "  return", "  %d = neg(%c) : f32[B]\n  return", 1)
		}, "3 nodes vs 4"},
		{"outputs", func(s string) string { return strings.Replace(s, "return %c, %a", "return %c, %b", 1) }, "output 1: %a vs %b"},
		{"output count", func(s string) string { return strings.Replace(s, "return %c, %a", "return %c", 1) }, "2 outputs vs 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			other, err := Parse(tt.edit(equalBase))
			if err != nil {
				t.Fatal(err)
			}
			err = Equal(base, other)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Equal: %v", err)
			case tt.want != "" && err == nil:
				t.Errorf("Equal found no difference, want %q", tt.want)
			case tt.want != "" && !strings.Contains(err.Error(), tt.want):
				t.Errorf("Equal: %q lacks %q", err, tt.want)
			}
		})
	}
}

func TestEqualTypesAndAttrs(t *testing.T) {
	base, err := Parse(equalBase)
	if err != nil {
		t.Fatal(err)
	}
	// Output types are compared even where they do not verify.
	c := base.Clone()
	c.Nodes[2].Outputs[0].Type = f32(1)
	if err := Equal(base, c); err == nil || !strings.Contains(err.Error(), "node 2 (%c = sum): output 0 has type f32[B] vs f32[1]") {
		t.Errorf("type change: %v", err)
	}
	c = base.Clone()
	delete(c.Nodes[1].Attrs, "axis")
	if err := Equal(base, c); err == nil || !strings.Contains(err.Error(), "attribute axis=-1 vs absent") {
		t.Errorf("attribute removed: %v", err)
	}
	if err := Equal(c, base); err == nil || !strings.Contains(err.Error(), "attribute axis absent vs -1") {
		t.Errorf("attribute added: %v", err)
	}
	if err := Equal(nil, nil); err != nil {
		t.Errorf("Equal(nil, nil): %v", err)
	}
	if err := Equal(base, nil); err == nil {
		t.Error("Equal(g, nil) found no difference")
	}
}
