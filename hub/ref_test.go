package hub

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseRef(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Ref
		wantErr string
	}{
		{"Qwen/Qwen3-0.6B", Ref{"Qwen/Qwen3-0.6B", "main"}, ""},
		{"meta-llama/Llama-3.2-1B@v1.0", Ref{"meta-llama/Llama-3.2-1B", "v1.0"}, ""},
		{"org/name@refs/pr/1", Ref{"org/name", "refs/pr/1"}, ""},
		{"a_b/c.d@0123456789abcdef0123456789abcdef01234567", Ref{"a_b/c.d", "0123456789abcdef0123456789abcdef01234567"}, ""},
		{"gpt2", Ref{}, "one '/'"},
		{"a/b/c", Ref{}, "one '/'"},
		{"./a", Ref{}, `"." is not a valid Hub name`},
		{"/abs", Ref{}, `"" is not a valid Hub name`},
		{"/abs/path", Ref{}, "one '/'"},
		{"org/na--me", Ref{}, "no '--'"},
		{"org/na..me", Ref{}, "no '--' or '..'"},
		{"org/-name", Ref{}, "not a valid Hub name"},
		{"org/name@", Ref{}, "empty revision"},
		{"org/name@../../etc", Ref{}, "invalid revision"},
		{"org/name@/abs", Ref{}, "invalid revision"},
		{"org/name@a b", Ref{}, "invalid revision"},
		{"org/" + strings.Repeat("x", 96), Ref{}, "longer than 96"},
	} {
		got, err := ParseRef(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseRef(%q) error = %v, want one containing %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseRef(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	if s := (Ref{"a/b", "main"}).String(); s != "a/b" {
		t.Errorf("String of main = %q", s)
	}
	if s := (Ref{"a/b", "v2"}).String(); s != "a/b@v2" {
		t.Errorf("String of v2 = %q", s)
	}
}

func TestRepoFolder(t *testing.T) {
	for _, tc := range []struct {
		folder string
		repo   string
		ok     bool
	}{
		{"models--Qwen--Qwen3-0.6B", "Qwen/Qwen3-0.6B", true},
		{"models--gpt2", "gpt2", true},
		{"datasets--org--data", "", false},
		{"models--a--b--c", "", false},
		{".locks", "", false},
	} {
		repo, ok := repoFromFolder(tc.folder)
		if repo != tc.repo || ok != tc.ok {
			t.Errorf("repoFromFolder(%q) = %q, %v; want %q, %v", tc.folder, repo, ok, tc.repo, tc.ok)
		}
		if ok && strings.Contains(repo, "/") && RepoFolder(repo) != tc.folder {
			t.Errorf("RepoFolder(%q) = %q, want %q", repo, RepoFolder(repo), tc.folder)
		}
	}
}

func TestEnv(t *testing.T) {
	home := t.TempDir()
	tokenFile := filepath.Join(home, "tok")
	if err := os.WriteFile(tokenFile, []byte("hf_file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(home, "hfhome"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "hfhome", "token"), []byte("hf_login"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want Env
	}{
		{"defaults", nil, Env{CacheDir: filepath.Join(home, ".cache/huggingface/hub"), Endpoint: DefaultEndpoint}},
		{"xdg", map[string]string{"XDG_CACHE_HOME": "/x"}, Env{CacheDir: "/x/huggingface/hub", Endpoint: DefaultEndpoint}},
		{"hf home", map[string]string{"HF_HOME": "/h", "XDG_CACHE_HOME": "/x"}, Env{CacheDir: "/h/hub", Endpoint: DefaultEndpoint}},
		{"hub cache wins", map[string]string{"HF_HUB_CACHE": "~/c", "HF_HOME": "/h"}, Env{CacheDir: filepath.Join(home, "c"), Endpoint: DefaultEndpoint}},
		{"legacy hub cache", map[string]string{"HUGGINGFACE_HUB_CACHE": "/old", "HF_HOME": "/h"}, Env{CacheDir: "/old", Endpoint: DefaultEndpoint}},
		{"endpoint", map[string]string{"HF_ENDPOINT": "http://mirror:8080/"}, Env{CacheDir: filepath.Join(home, ".cache/huggingface/hub"), Endpoint: "http://mirror:8080"}},
		{"offline 1", map[string]string{"HF_HUB_OFFLINE": "1", "HF_HOME": "/h"}, Env{CacheDir: "/h/hub", Endpoint: DefaultEndpoint, Offline: true}},
		{"offline yes", map[string]string{"HF_HUB_OFFLINE": "yes", "HF_HOME": "/h"}, Env{CacheDir: "/h/hub", Endpoint: DefaultEndpoint, Offline: true}},
		{"offline 0", map[string]string{"HF_HUB_OFFLINE": "0", "HF_HOME": "/h"}, Env{CacheDir: "/h/hub", Endpoint: DefaultEndpoint}},
		{"transformers offline", map[string]string{"TRANSFORMERS_OFFLINE": "true", "HF_HOME": "/h"}, Env{CacheDir: "/h/hub", Endpoint: DefaultEndpoint, Offline: true}},
		{"token", map[string]string{"HF_TOKEN": " hf_env ", "HF_TOKEN_PATH": tokenFile, "HF_HOME": "/h"}, Env{CacheDir: "/h/hub", Endpoint: DefaultEndpoint, Token: "hf_env"}},
		{"token path", map[string]string{"HF_TOKEN_PATH": tokenFile, "HF_HOME": "/h"}, Env{CacheDir: "/h/hub", Endpoint: DefaultEndpoint, Token: "hf_file"}},
		{"login token", map[string]string{"HF_HOME": filepath.Join(home, "hfhome")}, Env{CacheDir: filepath.Join(home, "hfhome/hub"), Endpoint: DefaultEndpoint, Token: "hf_login"}},
	} {
		got := envFrom(func(k string) string { return tc.env[k] }, home)
		if got != tc.want {
			t.Errorf("%s: envFrom = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
