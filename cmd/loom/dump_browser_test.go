package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// findChromium is the path of a Chromium or Chrome binary, or "".
func findChromium() string {
	if p := os.Getenv("LOOM_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// The graph dump's index.html in a real headless browser: it loads without script errors,
// shows a column per transform, and the dump of a 24-layer model stays usable through the
// layer filter (one layer's lines in every column, none of another's).
func TestDumpPageInBrowser(t *testing.T) {
	chrome := findChromium()
	if chrome == "" {
		t.Skip("no Chromium: apt-get install -y chromium (or set LOOM_CHROMIUM to a Chrome binary) to run the dump page in a browser")
	}
	begin := time.Now()
	// A 24-layer model with tiny dims: the layer count of Qwen2.5-0.5B.
	addShape(t, "qwen2.5-0.5b", "tiny-24-layers", map[string]any{"vocab_size": 512, "hidden_size": 32, "intermediate_size": 48,
		"num_attention_heads": 2, "num_key_value_heads": 1, "bos_token_id": 300, "eos_token_id": 301})
	dir, dump := t.TempDir(), t.TempDir()
	if _, stderr, err := run(t, "synth", "tiny-24-layers", "--out", dir); err != nil {
		t.Fatalf("synth: %v\n%s", err, stderr)
	}
	if _, stderr, err := run(t, "compile", "--model", dir, "--dump-graphs", dump, "-o", filepath.Join(t.TempDir(), "final.txt"), "--log-level", "warn"); err != nil {
		t.Fatalf("compile: %v\n%s", err, stderr)
	}
	txts, _ := filepath.Glob(filepath.Join(dump, "[0-9][0-9][0-9]_*.txt"))
	if len(txts) < 10 {
		t.Fatalf("%d dumps", len(txts))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1400, 900))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	var mu sync.Mutex
	var scriptErrors []string
	if err := chromedp.Listen(bctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			msg := d.Text
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			scriptErrors = append(scriptErrors, fmt.Sprintf("line %d: %s", d.LineNumber+1, msg))
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError {
				scriptErrors = append(scriptErrors, fmt.Sprintf("console.error %v", ev.Args))
			}
		}
	}); err != nil {
		t.Fatalf("start %s: %v", chrome, err)
	}
	type column struct {
		Title           string
		Width, Height   float64
		Display         string
		Collapsed       bool
		Lines, Expanded int
	}
	t.Logf("model and dump written in %v", time.Since(begin))
	start := time.Now()
	if err := chromedp.Do(bctx, chromedp.Navigate("file://"+filepath.Join(dump, "index.html"))); err != nil {
		t.Fatalf("%v (chromium %s)", err, chrome)
	}
	cols, err := chromedp.Run(bctx, chromedp.Evaluate[[]column](`Array.from(document.querySelectorAll('.col')).map(function (c) {
		var r = c.querySelector('.hdr').getBoundingClientRect();
		return {Title: c.querySelector('.hdr .t').textContent, Width: r.width, Height: r.height,
			Display: getComputedStyle(c).display, Collapsed: c.classList.contains('collapsed'),
			Lines: c.querySelectorAll('pre .l').length};
	})`))
	if err != nil {
		t.Fatal(err)
	}
	layerOptions, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('#layer option')).map(function (o) { return o.value; })`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("page loaded in %v: %d columns", time.Since(start), len(cols))
	// Every column: one per dump file, in order, each header laid out (a column that changed
	// nothing starts collapsed, its header still shown).
	if len(cols) != len(txts) {
		t.Errorf("%d columns, %d dumps", len(cols), len(txts))
	}
	for i, c := range cols {
		if i < len(txts) && !strings.HasPrefix(filepath.Base(txts[i]), c.Title[:3]) {
			t.Errorf("column %d is %q, dump %s", i, c.Title, filepath.Base(txts[i]))
		}
		if c.Display == "none" || c.Width <= 0 || c.Height <= 0 {
			t.Errorf("column %q is not shown: %+v", c.Title, c)
		}
		if c.Lines == 0 {
			t.Errorf("column %q has no lines", c.Title)
		}
	}
	if len(layerOptions) != 2+24 || layerOptions[2] != "0" || layerOptions[len(layerOptions)-1] != "23" {
		t.Fatalf("layer filter options %v, want all, none and 0-23", layerOptions)
	}
	// Collapsing a column by its header (a click on its title) and expanding it again.
	click := `document.querySelector('.col .hdr .t').click()`
	collapsed, err := chromedp.Run(bctx, chromedp.Evaluate[bool](click+`; document.querySelector('.col').classList.contains('collapsed')`))
	if err != nil {
		t.Fatal(err)
	}
	expanded, err := chromedp.Run(bctx, chromedp.Evaluate[bool](click+`; !document.querySelector('.col').classList.contains('collapsed')`))
	if err != nil || !collapsed || !expanded {
		t.Errorf("a click on the first column's header: collapsed %v, a second click expanded %v (%v)", collapsed, expanded, err)
	}

	// The layer filter: layer 7 alone, then the lines outside the layers, then all again.
	type filtered struct {
		Shown, Other, Height int
		Took                 float64
	}
	filter := func(value string) filtered {
		js := fmt.Sprintf(`(function () {
			var sel = document.getElementById('layer'), t0 = performance.now();
			sel.value = %q; sel.dispatchEvent(new Event('change'));
			var h = document.body.scrollHeight, took = performance.now() - t0;
			var shown = 0, other = 0;
			document.querySelectorAll('.col:not(.collapsed) pre .l').forEach(function (l) {
				if (l.offsetParent === null) return;
				var layer = l.getAttribute('data-layer');
				if (%q === '' || (%q === 'none' ? layer === null : layer === %q)) shown++; else other++;
			});
			return {Shown: shown, Other: other, Height: h, Took: took};
		})()`, value, value, value, value)
		f, err := chromedp.Run(bctx, chromedp.Evaluate[filtered](js))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	all := filter("")
	one := filter("7")
	outside := filter("none")
	again := filter("")
	t.Logf("all %+v, layer 7 %+v, outside %+v", all, one, outside)
	if one.Shown == 0 || one.Other != 0 {
		t.Errorf("layer 7: %d of its lines shown, %d of others", one.Shown, one.Other)
	}
	if outside.Shown == 0 || outside.Other != 0 {
		t.Errorf("outside the layers: %d lines shown, %d of layers", outside.Shown, outside.Other)
	}
	if one.Height*8 > all.Height {
		t.Errorf("layer 7's page is %dpx high, the whole %dpx: the filter does not shorten it", one.Height, all.Height)
	}
	if again.Shown != all.Shown || again.Other != 0 {
		t.Errorf("back to all lines: %+v, first %+v", again, all)
	}
	if one.Took > 2000 {
		t.Errorf("filtering took %.0f ms", one.Took)
	}
	// Clicking a value marks it in every column.
	marked, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelector('.col:not(.collapsed) pre .v').click(); document.querySelectorAll('.v.hl').length`))
	if err != nil || marked < 2 {
		t.Errorf("a click on a value marked %d spans (%v)", marked, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(scriptErrors) > 0 {
		t.Errorf("script errors: %v", scriptErrors)
	}
}
