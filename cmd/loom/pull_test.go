package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/loom-ml/loom/hub"
	"github.com/loom-ml/loom/hub/hubtest"
)

// hubEnv points the Hub settings at srv and a fresh cache, and returns the cache folder.
func hubEnv(t *testing.T, endpoint string) string {
	t.Helper()
	home := t.TempDir()
	cache := filepath.Join(home, "hub")
	for k, v := range map[string]string{"HF_ENDPOINT": endpoint, "HF_HOME": home, "HF_HUB_CACHE": cache,
		"HF_TOKEN": "", "HUGGING_FACE_HUB_TOKEN": "", "HF_TOKEN_PATH": "", "HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": "", "HUGGINGFACE_HUB_CACHE": ""} {
		t.Setenv(k, v)
	}
	return cache
}

// tinyLlamaRepo is testdata/tiny-llama as a Hub repository, with files Loom does not read.
func tinyLlamaRepo(t *testing.T) *hubtest.Repo {
	t.Helper()
	src := filepath.Join("..", "..", "testdata", "tiny-llama")
	files := map[string][]byte{"README.md": []byte("# tiny"), "pytorch_model.bin": []byte("not read"), "reference.json": []byte("{}")}
	for _, name := range []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "model.safetensors"} {
		data, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		files[name] = data
	}
	return &hubtest.Repo{ID: "loom-test/tiny-llama", Files: files}
}

func TestPullListAndUse(t *testing.T) {
	repo := tinyLlamaRepo(t)
	srv := hubtest.New(t, repo)
	cache := hubEnv(t, srv.URL)
	snap := filepath.Join(cache, "models--loom-test--tiny-llama", "snapshots", repo.Commit())

	stdout, _, err := run(t, "list")
	if err != nil || !strings.Contains(stdout, "no models in the Hugging Face cache "+cache) {
		t.Errorf("list of an empty cache: %q, %v", stdout, err)
	}
	_, _, err = run(t, "tokenize", "--model", "loom-test/tiny-llama", "--text", "Hello")
	if err == nil || !strings.Contains(err.Error(), `download it with "loom pull loom-test/tiny-llama"`) {
		t.Errorf("a model not pulled yet: %v, want the advice to run loom pull", err)
	}
	if n := len(srv.Requests()); n != 0 {
		t.Errorf("resolving a model sent %d requests to the Hub: it must not download", n)
	}

	stdout, stderr, err := run(t, "pull", "loom-test/tiny-llama")
	if err != nil {
		t.Fatalf("pull: %v\n%s", err, stderr)
	}
	if stdout != snap+"\n" {
		t.Errorf("pull printed %q, want the snapshot folder %s", stdout, snap)
	}
	for _, s := range []string{"loom-test/tiny-llama: 6 files", "downloading model.safetensors", "done model.safetensors", "pulled loom-test/tiny-llama"} {
		if !strings.Contains(stderr, s) {
			t.Errorf("pull's stderr lacks %q:\n%s", s, stderr)
		}
	}
	if strings.Contains(stderr, "\r") || strings.Contains(stderr, "\x1b[") {
		t.Errorf("pull drew a terminal bar on a buffer:\n%q", stderr)
	}

	stdout, _, err = run(t, "list")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^loom-test/tiny-llama +main +` + repo.Commit() + ` +\d+\.\d [KM]B +6 *$`)
	if !strings.HasPrefix(stdout, "MODEL") || !row.MatchString(stdout) {
		t.Errorf("list:\n%s\nwant a header and a row matching %s", stdout, row)
	}

	local, _, err := run(t, "tokenize", "--model", filepath.Join("..", "..", "testdata", "tiny-llama"), "--text", "Hello world")
	if err != nil {
		t.Fatal(err)
	}
	for _, model := range []string{"loom-test/tiny-llama", "loom-test/tiny-llama@main", "loom-test/tiny-llama@" + repo.Commit()} {
		byName, stderr, err := run(t, "tokenize", "--model", model, "--text", "Hello world")
		if err != nil || byName != local {
			t.Errorf("tokenize --model %s = %q, %v; the directory gives %q\n%s", model, byName, err, local, stderr)
		}
	}
	if _, stderr, err := run(t, "inspect", "--model", "loom-test/tiny-llama"); err != nil {
		t.Errorf("inspect --model loom-test/tiny-llama: %v\n%s", err, stderr)
	}

	// Offline: the cached model serves, nothing is asked of the Hub.
	srv.ResetRequests()
	t.Setenv("HF_HUB_OFFLINE", "1")
	stdout, stderr, err = run(t, "pull", "loom-test/tiny-llama")
	if err != nil || stdout != snap+"\n" || !strings.Contains(stderr, "HF_HUB_OFFLINE is set") {
		t.Errorf("offline pull of a cached model: %q, %q, %v", stdout, stderr, err)
	}
	_, _, err = run(t, "pull", "loom-test/other")
	if err == nil || !strings.Contains(err.Error(), "HF_HUB_OFFLINE is set, so nothing is downloaded") {
		t.Errorf("offline pull of a model not cached: %v", err)
	}
	if n := len(srv.Requests()); n != 0 {
		t.Errorf("offline commands sent %d requests", n)
	}
}

func TestPullErrorsCLI(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		setup func(srv *hubtest.Server, repo *hubtest.Repo)
		want  []string
	}{
		{"wrong hash", []string{"loom-test/tiny-llama"}, func(srv *hubtest.Server, repo *hubtest.Repo) {
			srv.Fault("model.safetensors", hubtest.Fault{Corrupt: true})
		}, []string{"model.safetensors", "sha256", "removed the download"}},
		{"private", []string{"loom-test/tiny-llama"}, func(srv *hubtest.Server, repo *hubtest.Repo) { repo.Private = true },
			[]string{"401", "HF_TOKEN"}},
		{"unknown revision", []string{"loom-test/tiny-llama@v3"}, nil, []string{`no revision "v3"`, "404"}},
		{"not a name", []string{"tiny-llama"}, nil, []string{"want ORG/NAME"}},
		{"no argument", nil, nil, []string{"accepts 1 arg"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := tinyLlamaRepo(t)
			srv := hubtest.New(t, repo)
			hubEnv(t, srv.URL)
			if tc.setup != nil {
				tc.setup(srv, repo)
			}
			_, _, err := run(t, append([]string{"pull"}, tc.args...)...)
			if err == nil {
				t.Fatalf("no error, want one naming %q", tc.want)
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q lacks %q", err, s)
				}
			}
		})
	}
}

// TestPullRetries: a transfer cut short is resumed within the pull (a Range request for the
// rest), and the plain progress says so.
func TestPullRetries(t *testing.T) {
	repo := tinyLlamaRepo(t)
	srv := hubtest.New(t, repo)
	cache := hubEnv(t, srv.URL)
	srv.Fault("model.safetensors", hubtest.Fault{CutAfter: 4096, Times: 1})
	_, stderr, err := run(t, "pull", "loom-test/tiny-llama")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "model.safetensors: the transfer broke at 4.1 KB of") {
		t.Errorf("stderr does not tell of the retry:\n%s", stderr)
	}
	got, err := os.ReadFile(filepath.Join(cache, "models--loom-test--tiny-llama", "snapshots", repo.Commit(), "model.safetensors"))
	if err != nil || string(got) != string(repo.Files["model.safetensors"]) {
		t.Errorf("the resumed file differs (%v)", err)
	}
	resumed := false
	for _, r := range srv.Requests() {
		resumed = resumed || r.Range == "bytes=4096-"
	}
	if !resumed {
		t.Errorf("no Range request for the rest: %+v", srv.Requests())
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 999: "999 B", 1000: "1.0 KB", 1_500_000: "1.5 MB", 988_097_824: "988.1 MB", 16_000_000_000: "16.0 GB", 2_000_000_000_000_000: "2000.0 TB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestPullProgressTerminal: on a terminal the pull is one status line with a bar over the
// whole pull's bytes, cleared before each line printed above it.
func TestPullProgressTerminal(t *testing.T) {
	var buf strings.Builder
	p := &pullProgress{w: &buf, tty: true, name: "org/name", start: time.Now()}
	p.event(hub.Event{Kind: hub.Planned, Files: 2, Size: 1000})
	p.event(hub.Event{Kind: hub.Cached, File: "config.json", Size: 100, Done: 100})
	p.event(hub.Event{Kind: hub.Started, File: "model.safetensors", Size: 900})
	p.drawn = time.Time{} // past the redraw interval
	p.event(hub.Event{Kind: hub.Advanced, File: "model.safetensors", Size: 900, Done: 400})
	p.event(hub.Event{Kind: hub.Finished, File: "model.safetensors", Size: 900, Done: 900})
	p.clear()
	out := buf.String()
	bar := "\r\x1b[2Korg/name [============            ] 50% 500 B of 1.0 KB"
	for _, s := range []string{"org/name: 2 files, 1.0 KB\n", "  downloading model.safetensors (900 B)\n", bar, "model.safetensors", "\r\x1b[2K  done model.safetensors (900 B, "} {
		if !strings.Contains(out, s) {
			t.Errorf("terminal output lacks %q:\n%q", s, out)
		}
	}
	if strings.Contains(out, "config.json") {
		t.Errorf("a cached file is listed on a terminal:\n%q", out)
	}
	if p.fetched != 400 {
		t.Errorf("fetched %d bytes, want 400", p.fetched)
	}
}
