package hub

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loom-ml/loom/hub/hubtest"
)

// noise is n deterministic pseudo-random bytes.
func noise(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// tinyRepo is a model repository with the files Loom reads and some it does not.
func tinyRepo() *hubtest.Repo {
	return &hubtest.Repo{ID: "loom-test/tiny", Files: map[string][]byte{
		"config.json":                              []byte(`{"model_type": "llama"}`),
		"generation_config.json":                   []byte(`{"eos_token_id": 2}`),
		"tokenizer.json":                           []byte(`{"model": {"type": "BPE"}}`),
		"tokenizer_config.json":                    []byte(`{"chat_template": "{{ messages }}"}`),
		"chat_template.jinja":                      []byte(`{% for m in messages %}{{ m.content }}{% endfor %}`),
		"additional_chat_templates/tool_use.jinja": []byte(`tools`),
		"model.safetensors":                        noise(300_000, 1),
		"README.md":                                []byte("# tiny"),
		".gitattributes":                           []byte("*.safetensors filter=lfs"),
		"pytorch_model.bin":                        noise(1000, 2),
		"onnx/model.onnx":                          noise(1000, 3),
	}}
}

// loomNames are the files of tinyRepo that a pull fetches.
var loomNames = []string{"additional_chat_templates/tool_use.jinja", "chat_template.jinja", "config.json",
	"generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}

func testClient(t *testing.T, srv *hubtest.Server) *Client {
	return &Client{Endpoint: srv.URL, Cache: Cache{Dir: filepath.Join(t.TempDir(), "hub")}, HTTP: srv.Client(), RetryWait: time.Millisecond}
}

// snapshotFiles lists the files under dir, '/'-separated, sorted.
func snapshotFiles(t *testing.T, dir string) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		names = append(names, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

func wantErr(t *testing.T, err error, subs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one containing %q", subs)
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not contain %q", err, s)
		}
	}
}

func TestPull(t *testing.T) {
	repo := tinyRepo()
	srv := hubtest.New(t, repo)
	c := testClient(t, srv)
	var events []Event
	c.Progress = func(e Event) {
		if e.Kind != Advanced {
			events = append(events, e)
		}
	}
	dir, err := c.Pull(context.Background(), Ref{repo.ID, "main"})
	if err != nil {
		t.Fatal(err)
	}
	repoDir := filepath.Join(c.Cache.Dir, "models--loom-test--tiny")
	if want := filepath.Join(repoDir, "snapshots", repo.Commit()); dir != want {
		t.Fatalf("snapshot %s, want %s", dir, want)
	}
	if got := snapshotFiles(t, dir); !slices.Equal(got, loomNames) {
		t.Errorf("snapshot holds %q, want only the files Loom reads %q", got, loomNames)
	}
	for _, name := range loomNames {
		path := filepath.Join(dir, filepath.FromSlash(name))
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, repo.Files[name]) {
			t.Errorf("%s: content differs from the Hub's (err %v)", name, err)
		}
		// huggingface_hub's layout: a relative link to blobs/<sha256> for LFS files, to
		// blobs/<git blob id> for the others.
		blob := hubtest.GitBlobID(repo.Files[name])
		if hubtest.IsLFS(name, repo.Files[name]) {
			blob = hubtest.SHA256(repo.Files[name])
		}
		target, err := os.Readlink(path)
		up := strings.Repeat("../", 2+strings.Count(name, "/"))
		if err != nil || target != up+"blobs/"+blob {
			t.Errorf("%s links to %q (%v), want %q", name, target, err, up+"blobs/"+blob)
		}
	}
	if ref, err := os.ReadFile(filepath.Join(repoDir, "refs", "main")); err != nil || string(ref) != repo.Commit() {
		t.Errorf("refs/main = %q, %v; want %s", ref, err, repo.Commit())
	}
	if _, err := os.Stat(filepath.Join(c.Cache.Dir, "CACHEDIR.TAG")); err != nil {
		t.Error(err)
	}
	var fetched []string
	for _, r := range srv.Requests() {
		fetched = append(fetched, r.Path)
		if strings.Contains(r.Path, "README") || strings.Contains(r.Path, ".bin") || strings.Contains(r.Path, "onnx") {
			t.Errorf("fetched %s, which Loom does not read", r.Path)
		}
	}
	if fetched[0] != "/api/models/loom-test/tiny/revision/main" {
		t.Errorf("first request %s, want the model info", fetched[0])
	}
	if events[0].Kind != Planned || events[0].Files != len(loomNames) {
		t.Errorf("first event %+v, want Planned with %d files", events[0], len(loomNames))
	}
	if n := count(events, Finished); n != len(loomNames) {
		t.Errorf("%d Finished events, want %d", n, len(loomNames))
	}
	if got, err := c.Cache.Resolve(Ref{repo.ID, "main"}); err != nil || got != dir {
		t.Errorf("Resolve after the pull = %q, %v; want %s", got, err, dir)
	}

	// A second pull asks for the info only.
	srv.ResetRequests()
	events = nil
	if again, err := c.Pull(context.Background(), Ref{repo.ID, "main"}); err != nil || again != dir {
		t.Fatalf("second pull = %q, %v", again, err)
	}
	if reqs := srv.Requests(); len(reqs) != 1 {
		t.Errorf("second pull made %d requests, want only the info: %+v", len(reqs), reqs)
	}
	if n := count(events, Cached); n != len(loomNames) {
		t.Errorf("second pull: %d Cached events, want %d", n, len(loomNames))
	}
}

func count(events []Event, k EventKind) int {
	n := 0
	for _, e := range events {
		if e.Kind == k {
			n++
		}
	}
	return n
}

func TestPullRevisions(t *testing.T) {
	repo := tinyRepo()
	repo.Refs = []string{"main", "v1.0", "refs/pr/1"}
	srv := hubtest.New(t, repo)
	for _, tc := range []struct {
		rev     string
		refFile string // the ref the pull writes; "" for none
	}{
		{"main", "refs/main"},
		{"v1.0", "refs/v1.0"},
		{"refs/pr/1", "refs/refs/pr/1"},
		{repo.Commit(), ""},
	} {
		t.Run(tc.rev, func(t *testing.T) {
			c := testClient(t, srv)
			dir, err := c.Pull(context.Background(), Ref{repo.ID, tc.rev})
			if err != nil {
				t.Fatal(err)
			}
			refs, _ := filepath.Glob(filepath.Join(c.Cache.RepoDir(repo.ID), "refs", "*"))
			if tc.refFile == "" {
				if len(refs) != 0 {
					t.Errorf("pull by commit wrote refs %v", refs)
				}
			} else if data, err := os.ReadFile(filepath.Join(c.Cache.RepoDir(repo.ID), filepath.FromSlash(tc.refFile))); err != nil || string(data) != repo.Commit() {
				t.Errorf("%s = %q, %v", tc.refFile, data, err)
			}
			if got, err := c.Cache.Resolve(Ref{repo.ID, tc.rev}); err != nil || got != dir {
				t.Errorf("Resolve = %q, %v; want %s", got, err, dir)
			}
		})
	}
}

func TestPullSharded(t *testing.T) {
	repo := &hubtest.Repo{ID: "loom-test/sharded", Files: map[string][]byte{
		"config.json":                      []byte(`{}`),
		"model.safetensors.index.json":     []byte(`{"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"}}`),
		"model-00001-of-00002.safetensors": noise(5000, 4),
		"model-00002-of-00002.safetensors": noise(6000, 5),
		"consolidated.safetensors":         noise(11000, 6), // Mistral's second copy: not read
	}}
	srv := hubtest.New(t, repo)
	c := testClient(t, srv)
	dir, err := c.Pull(context.Background(), Ref{repo.ID, "main"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"}
	if got := snapshotFiles(t, dir); !slices.Equal(got, want) {
		t.Errorf("snapshot holds %q, want %q", got, want)
	}
}

// TestPullResume cuts a download short: the pull fails naming the file and keeps the bytes
// it got in blobs/<sha256>.incomplete; the next pull asks for the rest only.
func TestPullResume(t *testing.T) {
	for _, tc := range []struct {
		name    string
		retries int
		second  hubtest.Fault // the fault of the answer to the resume
		restart bool          // the resume gets the whole file again
	}{
		{"next pull", 0, hubtest.Fault{}, false},
		{"retry within the pull", 2, hubtest.Fault{}, false},
		{"server ignores Range", 0, hubtest.Fault{IgnoreRange: true, Times: 1}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := tinyRepo()
			srv := hubtest.New(t, repo)
			c := testClient(t, srv)
			c.Retries = tc.retries
			restarted, retried := false, false
			c.Progress = func(e Event) {
				restarted = restarted || e.Kind == Restarted
				retried = retried || e.Kind == Retrying && e.Done == 100_000 && e.Err != nil
			}
			const cut = 100_000
			srv.Fault("model.safetensors", hubtest.Fault{CutAfter: cut, Times: 1})
			sum := hubtest.SHA256(repo.Files["model.safetensors"])
			part := filepath.Join(c.Cache.RepoDir(repo.ID), "blobs", sum+".incomplete")
			ref := Ref{repo.ID, "main"}
			dir, err := c.Pull(context.Background(), ref)
			if tc.retries == 0 {
				wantErr(t, err, "model.safetensors", fmt.Sprintf("at %d of %d bytes", cut, len(repo.Files["model.safetensors"])), "loom pull again to resume")
				if st, err := os.Stat(part); err != nil || st.Size() != cut {
					t.Fatalf("after the cut: %s: %v (want %d bytes)", part, err, cut)
				}
				if _, err := c.Cache.Resolve(ref); err == nil {
					t.Error("an unfinished pull resolves: refs/main was written before the files")
				}
				srv.Fault("model.safetensors", tc.second)
				if dir, err = c.Pull(context.Background(), ref); err != nil {
					t.Fatal(err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(dir, "model.safetensors"))
			if err != nil || !bytes.Equal(got, repo.Files["model.safetensors"]) {
				t.Fatalf("resumed file differs (err %v)", err)
			}
			if _, err := os.Stat(part); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s left behind: %v", part, err)
			}
			var ranges []string
			for _, r := range srv.Requests() {
				if r.Range != "" && strings.HasPrefix(r.Path, "/cdn/") { // the resolve redirects there, Range and all
					ranges = append(ranges, r.Range)
				}
			}
			if want := []string{fmt.Sprintf("bytes=%d-", cut)}; !slices.Equal(ranges, want) {
				t.Errorf("Range requests %q, want %q", ranges, want)
			}
			if retried != (tc.retries > 0) {
				t.Errorf("Retrying event at the cut: %v, want %v", retried, tc.retries > 0)
			}
			if restarted != tc.restart {
				t.Errorf("Restarted event: %v, want %v", restarted, tc.restart)
			}
		})
	}
}

// TestPullLeftovers: a .incomplete longer than the file, and a finished blob of the wrong
// size, are thrown away and downloaded again.
func TestPullLeftovers(t *testing.T) {
	for _, suffix := range []string{".incomplete", ""} {
		repo := tinyRepo()
		srv := hubtest.New(t, repo)
		c := testClient(t, srv)
		blobs := filepath.Join(c.Cache.RepoDir(repo.ID), "blobs")
		if err := os.MkdirAll(blobs, 0o755); err != nil {
			t.Fatal(err)
		}
		bad := filepath.Join(blobs, hubtest.SHA256(repo.Files["model.safetensors"])+suffix)
		if err := os.WriteFile(bad, noise(400_000, 9), 0o644); err != nil {
			t.Fatal(err)
		}
		dir, err := c.Pull(context.Background(), Ref{repo.ID, "main"})
		if err != nil {
			t.Fatalf("%q: %v", suffix, err)
		}
		if got, _ := os.ReadFile(filepath.Join(dir, "model.safetensors")); !bytes.Equal(got, repo.Files["model.safetensors"]) {
			t.Errorf("%q: the leftover was kept", suffix)
		}
	}
}

func TestPullCancel(t *testing.T) {
	repo := tinyRepo()
	srv := hubtest.New(t, repo)
	c := testClient(t, srv)
	c.Retries = 3
	srv.Fault("model.safetensors", hubtest.Fault{CutAfter: 50_000, Stall: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.Progress = func(e Event) {
		if e.Kind == Advanced && e.File == "model.safetensors" && e.Done >= 50_000 {
			cancel()
		}
	}
	_, err := c.Pull(ctx, Ref{repo.ID, "main"})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	wantErr(t, err, "model.safetensors", "kept for the next pull")
	part := filepath.Join(c.Cache.RepoDir(repo.ID), "blobs", hubtest.SHA256(repo.Files["model.safetensors"])+".incomplete")
	if st, err := os.Stat(part); err != nil || st.Size() != 50_000 {
		t.Errorf("%s: %v, want the 50000 bytes received", part, err)
	}
}

func TestPullErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(srv *hubtest.Server, repo *hubtest.Repo, c *Client) Ref
		want  []string
		gone  string // a file that must not be in blobs/ afterwards (no partial, no blob)
	}{
		{"wrong sha256", func(srv *hubtest.Server, repo *hubtest.Repo, c *Client) Ref {
			srv.Fault("model.safetensors", hubtest.Fault{Corrupt: true})
			return Ref{repo.ID, "main"}
		}, []string{"model.safetensors", "sha256 is ", "the Hub lists " + hubtest.SHA256(tinyRepo().Files["model.safetensors"]), "removed the download"},
			hubtest.SHA256(tinyRepo().Files["model.safetensors"])},
		{"wrong git object id", func(srv *hubtest.Server, repo *hubtest.Repo, c *Client) Ref {
			srv.Fault("config.json", hubtest.Fault{Corrupt: true})
			return Ref{repo.ID, "main"}
		}, []string{"config.json", "git object id is", "removed the download"}, hubtest.GitBlobID(tinyRepo().Files["config.json"])},
		{"unknown model without token", func(srv *hubtest.Server, repo *hubtest.Repo, c *Client) Ref {
			return Ref{"loom-test/absent", "main"}
		}, []string{"loom-test/absent", "401", "does not exist", "private or gated", "HF_TOKEN"}, ""},
		{"private without token", func(srv *hubtest.Server, repo *hubtest.Repo, c *Client) Ref {
			repo.Private = true
			return Ref{repo.ID, "main"}
		}, []string{"loom-test/tiny", "401 Unauthorized", "HF_TOKEN"}, ""},
		{"wrong token", func(srv *hubtest.Server, repo *hubtest.Repo, c *Client) Ref {
			repo.Private = true
			c.Token = "hf_wrong"
			return Ref{repo.ID, "main"}
		}, []string{"refused the token in HF_TOKEN", "Invalid credentials"}, ""},
		{"unknown model with token", func(srv *hubtest.Server, repo *hubtest.Repo, c *Client) Ref {
			c.Token = "hf_good"
			return Ref{"loom-test/absent", "main"}
		}, []string{"loom-test/absent", "no such model", "404 Not Found"}, ""},
		{"unknown revision", func(srv *hubtest.Server, repo *hubtest.Repo, c *Client) Ref {
			return Ref{repo.ID, "v9"}
		}, []string{`has no revision "v9"`, "404"}, ""},
		{"gated without token", func(srv *hubtest.Server, repo *hubtest.Repo, c *Client) Ref {
			repo.Gated = true
			return Ref{repo.ID, "main"}
		}, []string{"gated model", "accept its terms at http://127.0.0.1:", "/loom-test/tiny, then", "HF_TOKEN", "401"}, ""},
		{"gated with token", func(srv *hubtest.Server, repo *hubtest.Repo, c *Client) Ref {
			repo.Gated = true
			c.Token = "hf_good"
			return Ref{repo.ID, "main"}
		}, []string{"gated model", "403"}, ""},
		{"pytorch only", func(srv *hubtest.Server, repo *hubtest.Repo, c *Client) Ref {
			delete(repo.Files, "model.safetensors")
			return Ref{repo.ID, "main"}
		}, []string{"no *.safetensors weights", "pytorch_model.bin", "Loom reads safetensors"}, ""},
		{"no config", func(srv *hubtest.Server, repo *hubtest.Repo, c *Client) Ref {
			delete(repo.Files, "config.json")
			return Ref{repo.ID, "main"}
		}, []string{"no config.json"}, ""},
		{"index names a missing shard", func(srv *hubtest.Server, repo *hubtest.Repo, c *Client) Ref {
			repo.Files["model.safetensors.index.json"] = []byte(`{"weight_map": {"w": "model-00001-of-00002.safetensors"}}`)
			return Ref{repo.ID, "main"}
		}, []string{"model.safetensors.index.json names model-00001-of-00002.safetensors", "does not have"}, ""},
		{"file longer than listed", func(srv *hubtest.Server, repo *hubtest.Repo, c *Client) Ref {
			srv.Fault("model.safetensors", hubtest.Fault{Pad: 10})
			return Ref{repo.ID, "main"}
		}, []string{"model.safetensors", "more bytes than the Hub lists", "removed the download"}, hubtest.SHA256(tinyRepo().Files["model.safetensors"])},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := tinyRepo()
			srv := hubtest.New(t, repo)
			srv.Token = "hf_good"
			c := testClient(t, srv)
			ref := tc.setup(srv, repo, c)
			_, err := c.Pull(context.Background(), ref)
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantErr(t, err, tc.want...)
			t.Log(err)
			if tc.gone != "" {
				for _, p := range []string{tc.gone, tc.gone + ".incomplete"} {
					if _, err := os.Stat(filepath.Join(c.Cache.RepoDir(repo.ID), "blobs", p)); !errors.Is(err, os.ErrNotExist) {
						t.Errorf("blobs/%s is still there: %v", p, err)
					}
				}
			}
		})
	}
}

// TestPullPrivateWithToken: the token goes to the Hub with every request, and not to the
// CDN on another host that LFS files are redirected to, even a subdomain of the Hub's (to
// which Go's client would send it on).
func TestPullPrivateWithToken(t *testing.T) {
	for _, otherHost := range []bool{false, true} {
		repo := tinyRepo()
		repo.Private = true
		srv := hubtest.New(t, repo)
		srv.Token = "hf_good"
		c := testClient(t, srv)
		c.Token = "hf_good"
		if otherHost {
			// hub.test and cdn.hub.test, both dialed to the fake Hub.
			addr := srv.Listener.Addr().String()
			c.HTTP = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			}}}
			c.Endpoint, srv.CDNHost = "http://hub.test", "cdn.hub.test"
		}
		if _, err := c.Pull(context.Background(), Ref{repo.ID, "main"}); err != nil {
			t.Fatal(err)
		}
		cdn := 0
		for _, r := range srv.Requests() {
			want := "Bearer hf_good"
			if strings.HasPrefix(r.Path, "/cdn/") {
				cdn++
				if otherHost {
					want = ""
				}
			}
			if r.Auth != want {
				t.Errorf("CDN on another host %v: %s sent Authorization %q, want %q", otherHost, r.Path, r.Auth, want)
			}
		}
		if cdn == 0 {
			t.Errorf("no request reached the CDN")
		}
	}
}

func TestPullOffline(t *testing.T) {
	repo := tinyRepo()
	srv := hubtest.New(t, repo)
	c := testClient(t, srv)
	c.Offline = true
	_, err := c.Pull(context.Background(), Ref{repo.ID, "main"})
	wantErr(t, err, "HF_HUB_OFFLINE", "nothing is downloaded", "loom-test/tiny is not in the Hugging Face cache", "no folder models--loom-test--tiny")
	if reqs := srv.Requests(); len(reqs) != 0 {
		t.Errorf("offline pull sent %d requests", len(reqs))
	}
	c.Offline = false
	dir, err := c.Pull(context.Background(), Ref{repo.ID, "main"})
	if err != nil {
		t.Fatal(err)
	}
	srv.ResetRequests()
	c.Offline = true
	if got, err := c.Pull(context.Background(), Ref{repo.ID, "main"}); err != nil || got != dir {
		t.Errorf("offline pull of a cached model = %q, %v; want %s", got, err, dir)
	}
	_, err = c.Pull(context.Background(), Ref{repo.ID, "v2"})
	wantErr(t, err, "HF_HUB_OFFLINE", "no refs/v2 (cached revisions: main)")
	if reqs := srv.Requests(); len(reqs) != 0 {
		t.Errorf("offline pull sent %d requests", len(reqs))
	}
}
