// Package transformtest runs golden tests of transforms, in the manner of
// golang.org/x/tools/go/analysis/analysistest.
//
// Each case is a txtar archive in the transform's testdata directory, such as
// transform/testdata/cleanup_cse/commutative.txtar:
//
//	What the case is about (the archive's comment).
//	-- input --
//	graph g(x: f32[4]) {
//	  ...
//	}
//	-- options --
//	commutative: false
//	-- output --
//	graph g(x: f32[4]) {
//	  ...
//	}
//	-- matches --
//	2
//
// input is the graph given to the transform; options (optional) is YAML decoded over the
// transform's defaults as under its key in a config file; output is the expected graph
// (absent: the graph must come out unchanged); matches is the expected match count; error
// (optional, instead of output and matches) is text the transform's error must contain.
// The transform runs as the optimizer runs it (transform.Apply), verifier included.
//
// Since go test -update writes the expected text from what the transform produced, every
// case is also checked numerically: the input graph and the transformed graph (after an
// error, what the transform left) run on the CPU backend with the same random inputs and
// weights, and their outputs must be equal, bit for bit for exact transforms and unchanged
// graphs, within a few rounding units of the graphs' coarsest float dtype otherwise. Graphs
// with collectives run on in-process ranks (package dist/local): a graph split by sharding
// rank by rank against the unsplit one, a graph that is already one rank's as every rank's
// graph, each transformed as that rank. See numeric.go.
//
// go test -update rewrites output and matches from what the transform produced; the
// numeric check still runs.
package transformtest

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/transform"
	"golang.org/x/tools/txtar"
)

var update = flag.Bool("update", false, "rewrite the output and matches of golden transform tests")

// Run runs every testdata case in dir (dir/*.txtar) for transform t, each as a subtest. It
// also requires that dir holds at least one case that matches and one that must not (a case
// whose expected match count is 0), so that every pattern is held to what it must leave
// alone.
func Run(t *testing.T, dir string, tr *transform.Transform) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.txtar"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no golden cases in %s", dir)
	}
	var matching, nonMatching int
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".txtar")
		t.Run(name, func(t *testing.T) {
			matches, ok := runCase(t, file, tr)
			switch {
			case !ok:
			case matches > 0:
				matching++
			default:
				nonMatching++
			}
		})
	}
	if matching == 0 {
		t.Errorf("%s: no case in which %s matches", dir, tr.Name)
	}
	if nonMatching == 0 {
		t.Errorf("%s: no case in which %s must not match (matches 0)", dir, tr.Name)
	}
}

// runCase runs one archive and returns the expected match count, with ok false for error
// cases and cases that could not run.
func runCase(t *testing.T, file string, tr *transform.Transform) (matches int, ok bool) {
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	ar := txtar.Parse(data)
	sections := map[string]string{}
	for _, f := range ar.Files {
		if _, dup := sections[f.Name]; dup {
			t.Fatalf("%s: section %q given twice", file, f.Name)
		}
		switch f.Name {
		case "input", "options", "output", "matches", "error":
		default:
			t.Fatalf("%s: unknown section %q (want input, options, output, matches, error)", file, f.Name)
		}
		sections[f.Name] = string(f.Data)
	}
	input, hasInput := sections["input"]
	if !hasInput {
		t.Fatalf("%s: no input section", file)
	}
	g, err := graph.Parse(input)
	if err != nil {
		t.Fatalf("%s: input: %v", file, err)
	}
	inputText := g.String()
	in, _ := graph.Parse(input) // the transform rewrites g in place

	c := &transform.Context{Logger: slog.New(transform.NewLineHandler(testWriter{t}, slog.LevelDebug))}
	options := []byte(sections["options"])
	info, runErr := transform.Apply(context.Background(), c, tr, g, options)

	if wantErr, isErrCase := sections["error"]; isErrCase {
		want := strings.TrimSpace(wantErr)
		switch {
		case runErr == nil:
			t.Errorf("%s: no error, want one containing %q", file, want)
		case !strings.Contains(runErr.Error(), want):
			t.Errorf("%s: error %q, want one containing %q", file, runErr, want)
		}
		// What the failed transform left must still compute what the input computes.
		if err := graph.Verify(g); err != nil {
			t.Errorf("%s: after the error the graph does not verify: %v", file, err)
		} else {
			checkNumeric(t, file, tr, in, g, options)
		}
		return 0, false
	}
	if runErr != nil {
		t.Fatalf("%s: %v", file, runErr)
	}
	got := g.String()

	if *update {
		writeUpdate(t, file, ar, got, inputText, info.Matches)
		checkNumeric(t, file, tr, in, g, options)
		return info.Matches, true
	}

	want := inputText
	if out, ok := sections["output"]; ok {
		wg, err := graph.Parse(out)
		if err != nil {
			t.Fatalf("%s: output: %v", file, err)
		}
		want = wg.String()
	}
	if got != want {
		t.Errorf("%s: the graph differs from output (-want +got):\n%s\nrun go test -update to accept the new output", file, Diff(want, got))
	}
	wantMatches := -1
	if m, ok := sections["matches"]; ok {
		if wantMatches, err = strconv.Atoi(strings.TrimSpace(m)); err != nil {
			t.Fatalf("%s: matches: %v", file, err)
		}
	} else {
		t.Errorf("%s: no matches section (run go test -update to add it)", file)
	}
	if wantMatches >= 0 && info.Matches != wantMatches {
		t.Errorf("%s: matches = %d, want %d", file, info.Matches, wantMatches)
	}
	checkNumeric(t, file, tr, in, g, options)
	return wantMatches, wantMatches >= 0
}

// writeUpdate rewrites the output and matches sections of an archive.
func writeUpdate(t *testing.T, file string, ar *txtar.Archive, got, input string, matches int) {
	var files []txtar.File
	for _, f := range ar.Files {
		if f.Name != "output" && f.Name != "matches" {
			files = append(files, f)
		}
	}
	if got != input {
		files = append(files, txtar.File{Name: "output", Data: []byte(got)})
	}
	files = append(files, txtar.File{Name: "matches", Data: []byte(strconv.Itoa(matches) + "\n")})
	out := txtar.Format(&txtar.Archive{Comment: ar.Comment, Files: files})
	old, _ := os.ReadFile(file)
	if bytes.Equal(old, out) {
		return
	}
	if err := os.WriteFile(file, out, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("updated %s", file)
}

// Diff returns a line diff of two texts: lines only in a start with "-", lines only in b
// with "+", common lines with " ".
func Diff(a, b string) string {
	x := strings.Split(strings.TrimSuffix(a, "\n"), "\n")
	y := strings.Split(strings.TrimSuffix(b, "\n"), "\n")
	// Longest common subsequence by dynamic programming; graphs in tests are small.
	lcs := make([][]int, len(x)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(y)+1)
	}
	for i := len(x) - 1; i >= 0; i-- {
		for j := len(y) - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var sb strings.Builder
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		switch {
		case i < len(x) && j < len(y) && x[i] == y[j]:
			fmt.Fprintf(&sb, "  %s\n", x[i])
			i, j = i+1, j+1
		case j < len(y) && (i == len(x) || lcs[i][j+1] >= lcs[i+1][j]):
			fmt.Fprintf(&sb, "+ %s\n", y[j])
			j++
		default:
			fmt.Fprintf(&sb, "- %s\n", x[i])
			i++
		}
	}
	return sb.String()
}

// testWriter sends log lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
