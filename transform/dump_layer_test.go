package transform

import (
	"strings"
	"testing"
)

// Lines belong to the layer of their scope, or without one to the layer their names name;
// the page's filter lists every layer.
func TestDumpLineLayer(t *testing.T) {
	for line, want := range map[string]string{
		`  %3 = linear(%2, %model.layers.12.mlp.up_proj.weight) : f32[B,S,8] @model.layers.12.mlp`:                                            "12",
		`  %model.layers.3.input_layernorm.weight = param "model.layers.3.input_layernorm.weight" : bf16[64] @model.layers.3.input_layernorm`: "3",
		`  %9 = add(%7, %model.layers.4.x) : f32[4] @model.norm`:                                                                              "",
		`  %9 = add(%7, %model.layers.4.x) : f32[4]`:                                                                                          "4",
		`  %1 = neg(%x) : f32[4] @model`:                                                                                                      "",
		`  %1 = neg(%x) : f32[4] @model.sublayers.2`:                                                                                          "",
	} {
		if got := lineLayer(line); got != want {
			t.Errorf("lineLayer(%q) = %q, want %q", line, got, want)
		}
	}
	var sb strings.Builder
	snaps := []snapshot{{file: "000_input.txt", title: "input", lines: []string{"graph g() {", "  %a = neg(%x) : f32[4] @model.layers.0.mlp", "  %b = neg(%a) : f32[4] @model.layers.1.mlp", "}"}}}
	if err := writeHTML(&sb, "g", snaps); err != nil {
		t.Fatal(err)
	}
	page := sb.String()
	for _, want := range []string{`<select id="layer">`, `<option value="none">`, `<option value="1">layer 1</option></select>`, `<div class="l" data-layer="0">`, `outside the 2 layers`} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}
