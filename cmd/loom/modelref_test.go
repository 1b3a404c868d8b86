package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestResolveModel(t *testing.T) {
	const commit = "0123456789abcdef0123456789abcdef01234567"
	cache := hubEnv(t, "http://127.0.0.1:1")
	snap := filepath.Join(cache, "models--org--name", "snapshots", commit)
	for path, content := range map[string]string{
		filepath.Join(cache, "models--org--name", "refs", "main"): commit,
		filepath.Join(snap, "config.json"):                        "{}",
	} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	work := t.TempDir()
	if err := os.MkdirAll(filepath.Join(work, "local", "model"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(work)
	for _, tc := range []struct {
		model   string
		offline bool
		want    string
		wantErr []string
	}{
		{"", false, "", nil},
		{"org/name", false, snap, nil},
		{"org/name@main", false, snap, nil},
		{"org/name@" + commit, false, snap, nil},
		{"local/model", false, "local/model", nil},           // a directory that exists wins
		{"./missing", false, "./missing", nil},               // not a name: the command says what is missing
		{"/abs/missing/dir", false, "/abs/missing/dir", nil}, // likewise
		{"org/name@v2", false, "", []string{"model org/name@v2: no such directory", "no refs/v2 (cached revisions: main)", `download it with "loom pull org/name@v2"`}},
		{"org/other", false, "", []string{"model org/other: no such directory", "not in the Hugging Face cache " + cache, "no folder models--org--other", `"loom pull org/other"`}},
		{"org/other", true, "", []string{`"loom pull org/other"`, "HF_HUB_OFFLINE is set: unset it first"}},
		{"org/name", true, snap, nil},
	} {
		if tc.offline {
			t.Setenv("HF_HUB_OFFLINE", "1")
		} else {
			t.Setenv("HF_HUB_OFFLINE", "")
		}
		m := tc.model
		err := resolveModels(&m)
		if tc.wantErr == nil {
			if err != nil || m != tc.want {
				t.Errorf("resolve %q (offline %v) = %q, %v; want %q", tc.model, tc.offline, m, err, tc.want)
			}
			continue
		}
		if err == nil {
			t.Errorf("resolve %q = %q, want an error", tc.model, m)
			continue
		}
		for _, s := range tc.wantErr {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("resolve %q: error %q lacks %q", tc.model, err, s)
			}
		}
	}
}

func TestResolveServeModel(t *testing.T) {
	const commit = "0123456789abcdef0123456789abcdef01234567"
	cache := hubEnv(t, "http://127.0.0.1:1")
	snap := filepath.Join(cache, "models--org--name", "snapshots", commit)
	if err := os.MkdirAll(snap, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(cache, "models--org--name", "refs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cache, "models--org--name", "refs", "main"), []byte(commit), 0o644); err != nil {
		t.Fatal(err)
	}
	local := t.TempDir()
	for _, tc := range []struct {
		flag, name string
		args       []string
		wantDir    string
		wantName   string
		wantErr    string
	}{
		{"", "", []string{"org/name"}, snap, "org/name", ""},
		{"org/name", "", nil, snap, "org/name", ""},
		{"org/name", "", []string{"org/name"}, snap, "org/name", ""},
		{"", "mine", []string{"org/name"}, snap, "mine", ""},
		{"", "", []string{local}, local, "", ""},
		{local, "", nil, local, "", ""},
		{"", "", nil, "", "", "no model: give a checkpoint directory or a Hugging Face name"},
		{local, "", []string{"org/name"}, "", "", "two models"},
		{"", "", []string{"org/absent"}, "", "", `"loom pull org/absent"`},
	} {
		dir, name := tc.flag, tc.name
		err := resolveServeModel(&dir, &name, tc.args)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("--model %q %q: error %v, want %q", tc.flag, tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil || dir != tc.wantDir || name != tc.wantName {
			t.Errorf("--model %q --served-model-name %q %q = %q, %q, %v; want %q, %q", tc.flag, tc.name, tc.args, dir, name, err, tc.wantDir, tc.wantName)
		}
	}
}

// TestServeModelArgCLI: loom serve takes its model as the argument, as vllm serve does, and
// refuses before anything loads when there is none or it is not cached.
func TestServeModelArgCLI(t *testing.T) {
	hubEnv(t, "http://127.0.0.1:1")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve"}, "no model"},
		{[]string{"serve", "org/absent"}, `download it with "loom pull org/absent"`},
		{[]string{"serve", "--model", "org/absent"}, `download it with "loom pull org/absent"`},
		{[]string{"serve", "org/a", "--model", "org/b"}, "two models"},
		{[]string{"serve", "org/a", "org/b"}, "accepts at most 1 arg"},
		{[]string{"generate", "--model", "org/absent", "--prompt-ids", "1"}, `download it with "loom pull org/absent"`},
	} {
		_, _, err := run(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("loom %q: error %v, want %q", tc.args, err, tc.want)
		}
	}
}
