package transformtest

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/tools/txtar"
)

func TestDiff(t *testing.T) {
	tests := []struct{ a, b, want string }{
		{"x\ny\n", "x\ny\n", "  x\n  y\n"},
		{"x\ny\nz\n", "x\nz\n", "  x\n- y\n  z\n"},
		{"x\nz\n", "x\ny\nz\n", "  x\n+ y\n  z\n"},
		{"a\n", "b\n", "+ b\n- a\n"},
	}
	for _, tt := range tests {
		if got := Diff(tt.a, tt.b); got != tt.want {
			t.Errorf("Diff(%q, %q) =\n%s\nwant\n%s", tt.a, tt.b, got, tt.want)
		}
	}
}

func TestWriteUpdate(t *testing.T) {
	file := filepath.Join(t.TempDir(), "case.txtar")
	const input = "graph g(x: f32[4]) {\n  return %x\n}\n"
	orig := "A comment.\n-- input --\n" + input + "-- options --\ncast: false\n-- output --\nstale\n-- matches --\n9\n"
	if err := os.WriteFile(file, []byte(orig), 0o644); err != nil {
		t.Fatal(err)
	}
	// Unchanged graph: the output section goes, matches is rewritten, the rest stays.
	writeUpdate(t, file, txtar.Parse([]byte(orig)), input, input, 0)
	got, _ := os.ReadFile(file)
	want := "A comment.\n-- input --\n" + input + "-- options --\ncast: false\n-- matches --\n0\n"
	if string(got) != want {
		t.Errorf("after update:\n%s\nwant\n%s", got, want)
	}
	// Changed graph: an output section is added.
	const out = "graph g(x: f32[4]) {\n  %0 = neg(%x) : f32[4]\n  return %0\n}\n"
	writeUpdate(t, file, txtar.Parse(got), out, input, 1)
	got, _ = os.ReadFile(file)
	want = "A comment.\n-- input --\n" + input + "-- options --\ncast: false\n-- output --\n" + out + "-- matches --\n1\n"
	if string(got) != want {
		t.Errorf("after update:\n%s\nwant\n%s", got, want)
	}
}
