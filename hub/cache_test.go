package hub

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const (
	commitA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	commitB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	commitC = "cccccccccccccccccccccccccccccccccccccccc"
)

// writeCache lays out files (path under the cache -> content; content "->TARGET" makes a
// symlink) as huggingface-cli download leaves them.
func writeCache(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if target, ok := strings.CutPrefix(content, "->"); ok {
			err = os.Symlink(target, p)
		} else {
			err = os.WriteFile(p, []byte(content), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// cliCache is a cache that huggingface-cli download filled: Qwen/Qwen3-0.6B at main (commit
// A) and at v1 (commit B), a commit C downloaded by hash, a refs/pr/1, a dataset, a download
// of another model that did not finish, and a ref with no snapshot.
func cliCache(t *testing.T) string {
	const q = "models--Qwen--Qwen3-0.6B/"
	return writeCache(t, map[string]string{
		q + "blobs/1111111111111111111111111111111111111111":                         `{"model_type": "qwen3"}`,
		q + "blobs/2222222222222222222222222222222222222222222222222222222222222222": strings.Repeat("w", 1000),
		q + "blobs/3333333333333333333333333333333333333333333333333333333333333333": strings.Repeat("v", 500),
		q + "refs/main":      commitA,
		q + "refs/v1":        commitB + "\n",
		q + "refs/refs/pr/1": commitB,
		q + "refs/gone":      "dddddddddddddddddddddddddddddddddddddddd",
		q + "refs/bad":       "not a commit",
		q + "snapshots/" + commitA + "/config.json":                                                              "->../../blobs/1111111111111111111111111111111111111111",
		q + "snapshots/" + commitA + "/model.safetensors":                                                        "->../../blobs/2222222222222222222222222222222222222222222222222222222222222222",
		q + "snapshots/" + commitB + "/config.json":                                                              "->../../blobs/1111111111111111111111111111111111111111",
		q + "snapshots/" + commitB + "/model.safetensors":                                                        "->../../blobs/3333333333333333333333333333333333333333333333333333333333333333",
		q + "snapshots/" + commitC + "/config.json":                                                              "->../../blobs/1111111111111111111111111111111111111111",
		q + "snapshots/" + commitC + "/missing.safetensors":                                                      "->../../blobs/4444444444444444444444444444444444444444444444444444444444444444",
		"models--org--partial/blobs/5555555555555555555555555555555555555555555555555555555555555555.incomplete": "part",
		"models--org--partial/refs/main":                                                                         commitA,
		"models--org--partial/snapshots/" + commitA + "/config.json":                                             "{}",
		"datasets--org--data/refs/main":                                                                          commitA,
		"datasets--org--data/snapshots/" + commitA + "/data.json":                                                "{}",
		".locks/models--Qwen--Qwen3-0.6B/x.lock":                                                                 "",
		"CACHEDIR.TAG":                                                                                           "Signature: 8a477f597d28d172789f06886806bc55",
	})
}

func TestResolve(t *testing.T) {
	dir := cliCache(t)
	c := Cache{Dir: dir}
	snap := func(commit string) string {
		return filepath.Join(dir, "models--Qwen--Qwen3-0.6B", "snapshots", commit)
	}
	for _, tc := range []struct {
		ref     string
		want    string
		wantErr []string
	}{
		{"Qwen/Qwen3-0.6B", snap(commitA), nil},
		{"Qwen/Qwen3-0.6B@main", snap(commitA), nil},
		{"Qwen/Qwen3-0.6B@v1", snap(commitB), nil},
		{"Qwen/Qwen3-0.6B@refs/pr/1", snap(commitB), nil},
		{"Qwen/Qwen3-0.6B@" + commitC, snap(commitC), nil},
		{"Qwen/Qwen3-0.6B@v2", "", []string{"Qwen/Qwen3-0.6B@v2 is not in the Hugging Face cache " + dir, "no refs/v2", "cached revisions: gone, main, refs/pr/1, v1"}},
		{"Qwen/Qwen3-0.6B@gone", "", []string{"refs/gone names commit dddddddddddddddddddddddddddddddddddddddd, which has no snapshot"}},
		{"Qwen/Qwen3-0.6B@" + strings.Repeat("e", 40), "", []string{"no snapshot of commit eeee"}},
		{"Qwen/Qwen3-0.6B@bad", "", []string{"refs/bad", `holds "not a commit", not a commit hash`}},
		{"Qwen/Qwen3-1.7B", "", []string{"no folder models--Qwen--Qwen3-1.7B"}},
		{"org/data", "", []string{"no folder models--org--data"}}, // a dataset is no model
	} {
		ref, err := ParseRef(tc.ref)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.Resolve(ref)
		if tc.wantErr != nil {
			if err == nil {
				t.Errorf("Resolve(%s) = %s, want an error", tc.ref, got)
				continue
			}
			for _, s := range tc.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Resolve(%s) error %q does not contain %q", tc.ref, err, s)
				}
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Resolve(%s) = %q, %v; want %q", tc.ref, got, err, tc.want)
		}
	}
	_, err := Cache{Dir: dir}.Resolve(Ref{"Qwen/Qwen3-1.7B", "main"})
	var nc *NotCachedError
	if !errors.As(err, &nc) {
		t.Errorf("a model not cached gives %T, want *NotCachedError", err)
	}
}

func TestList(t *testing.T) {
	dir := cliCache(t)
	got, err := Cache{Dir: dir}.List()
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		repo, commit string
		revs         []string
		files        int
		size         int64
		missing      int
		unfinished   bool
	}
	want := []row{
		{"Qwen/Qwen3-0.6B", commitA, []string{"main"}, 2, 1023, 0, false},
		{"Qwen/Qwen3-0.6B", commitB, []string{"refs/pr/1", "v1"}, 2, 523, 0, false},
		{"Qwen/Qwen3-0.6B", commitC, nil, 1, 23, 1, false},
		{"org/partial", commitA, []string{"main"}, 1, 2, 0, true},
	}
	if len(got) != len(want) {
		t.Fatalf("List = %+v, want %d rows", got, len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.Repo != w.repo || g.Commit != w.commit || !slices.Equal(g.Revisions, w.revs) || g.Files != w.files ||
			g.Size != w.size || g.Missing != w.missing || g.Unfinished != w.unfinished {
			t.Errorf("row %d = %+v, want %+v", i, g, w)
		}
	}
	if rows, err := (Cache{Dir: filepath.Join(dir, "absent")}).List(); err != nil || len(rows) != 0 {
		t.Errorf("List of a missing cache = %v, %v; want nothing", rows, err)
	}
}
