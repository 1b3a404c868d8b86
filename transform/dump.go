package transform

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/loom-ml/loom/graph"
)

// Dumps. With a dump directory the optimizer writes
//
//	000_input.txt                     the graph it was given
//	001_post_export_cleanup_noop.txt  the graph after each transform that ran (rank 0's)
//	...
//	index.html                        every one of them side by side
//
// index.html is self-contained (inline CSS and JavaScript, nothing fetched), so it opens from
// the file system: one column per transform; lines new since the column to the left are
// marked, and the lines it removed are listed above its graph; columns of transforms that
// changed nothing start collapsed; a click on a column's header collapses or expands it, and a
// click on a %value marks that value in every column. A layer filter shows only the lines of
// one layer (by their scope, model.layers.N), or only those outside the layers, in every
// column, so that the page of a deep model stays usable. Files of an earlier dump in the same
// directory are removed first.

// snapshot is the graph text after one transform.
type snapshot struct {
	file    string
	title   string // "post_export / cleanup_noop"
	summary string // "matches=3 | time: 0.4ms"
	lines   []string
}

type dumper struct {
	dir   string
	name  string // graph name
	snaps []snapshot
}

var dumpFileRE = regexp.MustCompile(`^[0-9]{3}_.*\.txt$`)

func newDumper(dir string, g *graph.Graph) (*dumper, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("dump graphs: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("dump graphs: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() && (dumpFileRE.MatchString(e.Name()) || e.Name() == "index.html") {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return nil, fmt.Errorf("dump graphs: remove an earlier dump: %w", err)
			}
		}
	}
	d := &dumper{dir: dir, name: g.Name}
	return d, d.write("000_input.txt", "input", "", g)
}

// add writes the graph after the transform that r describes.
func (d *dumper) add(r Result, g *graph.Graph) error {
	file := fmt.Sprintf("%03d_%s_%s.txt", len(d.snaps), r.Stage, r.Name)
	summary := strings.TrimPrefix(r.Summary(), fmt.Sprintf("[stage=%s transform=%s] [SUMMARY] ", r.Stage, r.Name))
	return d.write(file, r.Stage.String()+" / "+r.Name, summary, g)
}

func (d *dumper) write(file, title, summary string, g *graph.Graph) error {
	text := g.String()
	if err := os.WriteFile(filepath.Join(d.dir, file), []byte(text), 0o644); err != nil {
		return fmt.Errorf("dump graphs: %w", err)
	}
	d.snaps = append(d.snaps, snapshot{file: file, title: title, summary: summary, lines: strings.Split(strings.TrimSuffix(text, "\n"), "\n")})
	return nil
}

// finish writes index.html.
func (d *dumper) finish() error {
	f, err := os.Create(filepath.Join(d.dir, "index.html"))
	if err != nil {
		return fmt.Errorf("dump graphs: %w", err)
	}
	w := bufio.NewWriter(f)
	err = writeHTML(w, d.name, d.snaps)
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("dump graphs: %w", err)
	}
	return nil
}

// scopeRE finds a line's scope (" @model.layers.3.mlp" at its end), layerRE the layer in a
// scope or, for a line without one, in its value and param names.
var (
	scopeRE = regexp.MustCompile(` @(\S+)$`)
	layerRE = regexp.MustCompile(`(?:^|[.%"])layers\.(\d+)(?:\.|$|")`)
)

// lineLayer is the layer a graph line belongs to, or "" for one outside the layers.
func lineLayer(line string) string {
	if m := scopeRE.FindStringSubmatch(line); m != nil {
		if l := layerRE.FindStringSubmatch(m[1]); l != nil {
			return l[1]
		}
		return ""
	}
	if l := layerRE.FindStringSubmatch(line); l != nil {
		return l[1]
	}
	return ""
}

// valueRE finds value references in a graph line.
var valueRE = regexp.MustCompile(`%[A-Za-z0-9_.]+`)

// writeHTML writes the side-by-side page. A line is "changed" in a column when the column to
// its left has no line with the same text; node lines name their values, so the comparison
// follows nodes across transforms.
func writeHTML(w io.Writer, name string, snaps []snapshot) error {
	ew := &errWriter{w: w}
	layers := -1
	for _, s := range snaps {
		for _, l := range s.lines {
			if n, err := strconv.Atoi(lineLayer(l)); err == nil && n > layers {
				layers = n
			}
		}
	}
	var opts strings.Builder
	for i := 0; i <= layers; i++ {
		fmt.Fprintf(&opts, `<option value="%d">layer %d</option>`, i, i)
	}
	ew.printf(htmlHead, html.EscapeString(name), html.EscapeString(name), len(snaps)-1, layers+1, opts.String())
	var prev map[string]int
	for i, s := range snaps {
		count := make(map[string]int, len(s.lines))
		for _, l := range s.lines {
			count[l]++
		}
		// Multiset difference: lines added here, and lines of the previous column gone here.
		added := make([]bool, len(s.lines))
		nAdded := 0
		if prev != nil {
			left := make(map[string]int, len(prev))
			for l, n := range prev {
				left[l] = n
			}
			for j, l := range s.lines {
				if left[l] > 0 {
					left[l]--
				} else {
					added[j] = true
					nAdded++
				}
			}
			var removed []string
			for _, l := range snaps[i-1].lines {
				if left[l] > 0 {
					left[l]--
					removed = append(removed, l)
				}
			}
			writeColumn(ew, i, s, added, nAdded, removed)
		} else {
			writeColumn(ew, i, s, added, 0, nil)
		}
		prev = count
	}
	ew.printf("%s", htmlTail)
	return ew.err
}

func writeColumn(ew *errWriter, i int, s snapshot, added []bool, nAdded int, removed []string) {
	class := "col"
	if i > 0 && nAdded == 0 && len(removed) == 0 {
		class += " same collapsed"
	}
	stat := "unchanged"
	if i == 0 {
		stat = fmt.Sprintf("%d lines", len(s.lines))
	} else if class == "col" {
		stat = fmt.Sprintf("+%d −%d lines", nAdded, len(removed))
	}
	ew.printf(`<div class="%s"><div class="hdr" title="click to collapse or expand"><div class="t">%03d %s</div>`,
		class, i, html.EscapeString(s.title))
	if s.summary != "" {
		ew.printf(`<div class="s">%s</div>`, html.EscapeString(s.summary))
	}
	ew.printf(`<div class="s">%s · <a href="%s">%s</a></div></div><div class="body">`,
		html.EscapeString(stat), html.EscapeString(s.file), html.EscapeString(s.file))
	if len(removed) > 0 {
		ew.printf(`<details class="rm"><summary>%d removed</summary>`, len(removed))
		for _, l := range removed {
			ew.printf(`<div class="l"%s>%s</div>`, layerAttr(l), markValues(l))
		}
		ew.printf("</details>")
	}
	ew.printf("<pre>")
	for j, l := range s.lines {
		if added[j] {
			ew.printf(`<div class="l add"%s>%s</div>`, layerAttr(l), markValues(l))
		} else {
			ew.printf(`<div class="l"%s>%s</div>`, layerAttr(l), markValues(l))
		}
	}
	ew.printf("</pre></div></div>\n")
}

// layerAttr is the data-layer attribute of a line in a layer (the page's layer filter), or
// nothing for a line outside the layers.
func layerAttr(line string) string {
	if l := lineLayer(line); l != "" {
		return ` data-layer="` + l + `"`
	}
	return ""
}

// markValues escapes a line and wraps each %value in a span the page can highlight.
func markValues(line string) string {
	var sb strings.Builder
	last := 0
	for _, m := range valueRE.FindAllStringIndex(line, -1) {
		sb.WriteString(html.EscapeString(line[last:m[0]]))
		v := html.EscapeString(line[m[0]:m[1]])
		fmt.Fprintf(&sb, `<span class="v" data-v="%s">%s</span>`, v, v)
		last = m[1]
	}
	sb.WriteString(html.EscapeString(line[last:]))
	return sb.String()
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}

const htmlHead = `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>%s: graph after each transform</title>
<style>
body { font: 13px system-ui, sans-serif; margin: 8px; background: #fff; color: #222; }
h1 { font-size: 16px; margin: 4px 0; }
p.help { color: #555; margin: 4px 0 8px; }
.cols { display: flex; align-items: flex-start; gap: 6px; overflow-x: auto; }
.col { border: 1px solid #bbb; border-radius: 3px; flex: none; max-width: 72ch; }
.hdr { background: #eef; padding: 4px 6px; cursor: pointer; border-bottom: 1px solid #bbb; }
.hdr .t { font-weight: 600; white-space: nowrap; }
.hdr .s { color: #555; font-size: 12px; white-space: nowrap; }
.body { overflow-x: auto; }
pre { margin: 0; padding: 4px 6px; font: 12px ui-monospace, Menlo, Consolas, monospace; }
.l { white-space: pre; }
.add { background: #d7f5d3; }
details.rm { font: 12px ui-monospace, Menlo, Consolas, monospace; padding: 2px 6px; background: #fbe3e3; }
details.rm .l { text-decoration: line-through; color: #844; }
.same .hdr { background: #f4f4f4; }
.collapsed .body { display: none; }
.collapsed .hdr { writing-mode: vertical-rl; min-height: 16em; }
.collapsed .hdr .s a { display: none; }
.v { cursor: pointer; }
.v.hl { background: #ffe066; outline: 1px solid #e0a800; }
.bar { margin: 4px 0 8px; }
</style><style id="layer-filter"></style></head>
<body>
<h1>graph %s: %d transforms</h1>
<p class="help">One column per transform, left to right. Green lines are new or changed since
the column to the left; the lines a transform removed are listed above its graph. Columns of
transforms that changed nothing start collapsed: click a header to collapse or expand a column.
Click a %%value to mark it in every column. The layer filter shows one layer's lines (or those
outside the %d layers) in every column.</p>
<div class="bar"><label>layer filter <select id="layer"><option value="">all lines</option><option value="none">outside the layers</option>%s</select></label></div>
<div class="cols">
`

const htmlTail = `</div>
<script>
document.querySelectorAll('.hdr').forEach(function (h) {
  h.addEventListener('click', function (e) {
    if (e.target.tagName === 'A') return;
    h.parentElement.classList.toggle('collapsed');
  });
});
// The layer filter is one style rule, so that it costs nothing per line however deep the model.
document.getElementById('layer').addEventListener('change', function (e) {
  var v = e.target.value, css = '';
  if (v === 'none') css = '.l[data-layer] { display: none; }';
  else if (/^[0-9]+$/.test(v)) css = '.l:not([data-layer="' + v + '"]) { display: none; }';
  document.getElementById('layer-filter').textContent = css;
});
var marked = null;
document.addEventListener('click', function (e) {
  var t = e.target;
  if (!t.classList || !t.classList.contains('v')) return;
  var name = t.getAttribute('data-v');
  document.querySelectorAll('.v.hl').forEach(function (s) { s.classList.remove('hl'); });
  if (marked === name) { marked = null; return; }
  marked = name;
  document.querySelectorAll('.v').forEach(function (s) {
    if (s.getAttribute('data-v') === name) s.classList.add('hl');
  });
});
</script>
</body></html>
`
