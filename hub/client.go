package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Client downloads models from the Hub into a cache.
type Client struct {
	Endpoint string // the Hub's address, e.g. DefaultEndpoint
	Token    string // sent as "Authorization: Bearer TOKEN" when not empty
	Cache    Cache
	Offline  bool         // download nothing: Pull finds the model in the cache or fails
	HTTP     *http.Client // nil: http.DefaultClient
	// Progress, when set, hears of each file of a pull (see Event); it is called from the
	// goroutine that calls Pull.
	Progress func(Event)
	// Retries is how many more times a file's download is tried after a transfer breaks or
	// the server answers 408, 429 or 5xx, each resuming where the last one ended. RetryWait is
	// the wait before the first retry, doubled for each next one.
	Retries   int
	RetryWait time.Duration
}

// NewClient returns a client for the Hub and cache that env names, with 3 retries.
func NewClient(env Env) *Client {
	return &Client{Endpoint: env.Endpoint, Token: env.Token, Cache: Cache{Dir: env.CacheDir}, Offline: env.Offline,
		Retries: 3, RetryWait: time.Second}
}

// File is a file of a repository as the Hub lists it.
type File struct {
	Name   string // path in the repository, '/'-separated
	Size   int64  // bytes
	BlobID string // git object id (sha1 of "blob SIZE\x00" and the content)
	SHA256 string // the content's sha256 for a file stored with Git LFS; "" for a file kept in git
}

// Blob is the file's name in the cache's blobs/: the sha256 of an LFS file, else the git
// object id (the ETag the Hub sends for it, which huggingface_hub names blobs by).
func (f File) Blob() string {
	if f.SHA256 != "" {
		return f.SHA256
	}
	return f.BlobID
}

// Info is a repository at one commit.
type Info struct {
	Repo   string
	Commit string
	Files  []File
}

// EventKind says what an Event reports.
type EventKind int

const (
	// Planned: the files of the pull are known. Files and Size are their count and bytes.
	Planned EventKind = iota
	// Cached: File was already in the cache, Size bytes.
	Cached
	// Started: File's download starts; Done bytes of its Size are on disk already (a resume).
	Started
	// Advanced: Done bytes of File's Size are on disk.
	Advanced
	// Restarted: the server ignored the range asked for: File's download starts over.
	Restarted
	// Retrying: File's transfer broke at Done of Size bytes (Err) and is tried again.
	Retrying
	// Finished: File is downloaded and checked.
	Finished
)

// Event is news of a pull for Client.Progress.
type Event struct {
	Kind  EventKind
	File  string
	Size  int64
	Done  int64
	Files int
	Err   error // Retrying: what broke
}

// HTTPError is a Hub answer other than success, with the Hub's error code and message.
type HTTPError struct {
	Status  int
	URL     string
	Code    string // X-Error-Code: RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo...
	Message string // X-Error-Message, else the body's "error"
}

func (e *HTTPError) Error() string {
	s := fmt.Sprintf("GET %s: %d %s", e.URL, e.Status, http.StatusText(e.Status))
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// transient reports whether a later try may succeed.
func (e *HTTPError) transient() bool {
	return e.Status == http.StatusRequestTimeout || e.Status == http.StatusTooManyRequests || e.Status >= 500
}

// httpClient is c.HTTP (else a default client) that drops the token when a redirect leaves
// the Hub's host: the Hub sends LFS files to its CDN by signed URLs, which need no token and
// must not get it (Go would send it on to a subdomain such as cdn-lfs.huggingface.co).
// huggingface_hub (through requests) does the same.
func (c *Client) httpClient() *http.Client {
	hc := http.Client{}
	if c.HTTP != nil {
		hc = *c.HTTP
	}
	if hc.CheckRedirect == nil {
		hc.CheckRedirect = func(req *http.Request, via []*http.Request) error {
			if len(via) >= 10 {
				return errors.New("stopped after 10 redirects")
			}
			if req.URL.Host != via[0].URL.Host {
				req.Header.Del("Authorization")
			}
			return nil
		}
	}
	return &hc
}

func (c *Client) emit(e Event) {
	if c.Progress != nil {
		c.Progress(e)
	}
}

// get sends a GET with the token and the extra headers; an answer other than 2xx is an
// *HTTPError (its body read and closed).
func (c *Client) get(ctx context.Context, u string, header http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("User-Agent", "loom (huggingface_hub-compatible)")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	herr := &HTTPError{Status: resp.StatusCode, URL: u, Code: resp.Header.Get("X-Error-Code"), Message: resp.Header.Get("X-Error-Message")}
	if herr.Message == "" {
		var body struct {
			Error any `json:"error"`
		}
		if data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10)); err == nil && json.Unmarshal(data, &body) == nil && body.Error != nil {
			herr.Message = fmt.Sprint(body.Error)
		}
	}
	return nil, herr
}

// explain turns a failed request about ref (file "" for the model info) into a message that
// says what to do.
func (c *Client) explain(ref Ref, file string, err error) error {
	var h *HTTPError
	if !errors.As(err, &h) {
		return fmt.Errorf("%s: %w", ref, err)
	}
	page := c.Endpoint + "/" + ref.Repo
	switch {
	case h.Code == "GatedRepo" || (h.Status == http.StatusForbidden && strings.Contains(strings.ToLower(h.Message), "gated")):
		return fmt.Errorf("%s is a gated model: accept its terms at %s, then set HF_TOKEN to an access token of that account (%w)", ref.Repo, page, err)
	case h.Code == "RevisionNotFound":
		return fmt.Errorf("%s has no revision %q on %s (%w)", ref.Repo, ref.Revision, c.Endpoint, err)
	case h.Code == "EntryNotFound" && file != "":
		return fmt.Errorf("%s: the Hub has no file %s, which it listed (%w)", ref, file, err)
	case h.Status == http.StatusUnauthorized && c.Token == "":
		return fmt.Errorf("%s: the Hub refused access without a token: the model does not exist on %s, or it is private or gated; "+
			"check the name, or set HF_TOKEN to an access token that can read it (%w)", ref.Repo, c.Endpoint, err)
	case h.Status == http.StatusUnauthorized:
		return fmt.Errorf("%s: the Hub refused the token in HF_TOKEN: the model does not exist on %s, or the token is invalid or cannot read it (%w)", ref.Repo, c.Endpoint, err)
	case h.Status == http.StatusForbidden:
		return fmt.Errorf("%s: the token in HF_TOKEN may not read this model (%w)", ref.Repo, err)
	case h.Status == http.StatusNotFound && file == "":
		return fmt.Errorf("%s: no such model on %s (%w)", ref.Repo, c.Endpoint, err)
	}
	return fmt.Errorf("%s: %w", ref, err)
}

// blobName is what a blob may be called: a sha256 or a git object id in hex.
var blobName = regexp.MustCompile(`^(?:[0-9a-f]{40}|[0-9a-f]{64})$`)

// Info asks the Hub for the commit of ref and its files with their sizes and hashes
// (GET /api/models/ORG/NAME/revision/REV?blobs=true).
func (c *Client) Info(ctx context.Context, ref Ref) (*Info, error) {
	if c.Offline {
		return nil, fmt.Errorf("%s: HF_HUB_OFFLINE is set: not asking the Hub", ref)
	}
	u := c.Endpoint + "/api/models/" + ref.Repo + "/revision/" + url.PathEscape(ref.Revision) + "?blobs=true"
	resp, err := c.get(ctx, u, nil)
	if err != nil {
		return nil, c.explain(ref, "", err)
	}
	defer resp.Body.Close()
	var body struct {
		ID       string `json:"id"`
		SHA      string `json:"sha"`
		Siblings []struct {
			RFilename string `json:"rfilename"`
			Size      *int64 `json:"size"`
			BlobID    string `json:"blobId"`
			LFS       *struct {
				SHA256 string `json:"sha256"`
				Size   int64  `json:"size"`
			} `json:"lfs"`
		} `json:"siblings"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&body); err != nil {
		return nil, fmt.Errorf("%s: GET %s: the answer is not the model info JSON: %w", ref, u, err)
	}
	if !IsCommit(body.SHA) {
		return nil, fmt.Errorf("%s: GET %s: the answer has no commit hash (sha %q)", ref, u, body.SHA)
	}
	info := &Info{Repo: ref.Repo, Commit: body.SHA}
	for _, s := range body.Siblings {
		f := File{Name: s.RFilename, BlobID: s.BlobID}
		if s.Size != nil {
			f.Size = *s.Size
		}
		if s.LFS != nil {
			f.SHA256, f.Size = s.LFS.SHA256, s.LFS.Size
		}
		// Names and hashes become paths in the cache: refuse any that would leave it.
		if !filepath.IsLocal(filepath.FromSlash(f.Name)) || strings.Contains(f.Name, "\\") || path.Clean(f.Name) != f.Name {
			return nil, fmt.Errorf("%s: the Hub lists a file named %q, which is not a path inside the repository", ref, f.Name)
		}
		if s.Size == nil && s.LFS == nil || !blobName.MatchString(f.Blob()) || f.Size < 0 {
			return nil, fmt.Errorf("%s: the Hub lists %s without a size and a hash (blobId %q)", ref, f.Name, f.Blob())
		}
		info.Files = append(info.Files, f)
	}
	return info, nil
}

// Pull downloads the files of ref that Loom reads (Select) into the cache, skipping those
// already there, records refs/REV, and returns the snapshot folder. A broken transfer leaves
// blobs/<name>.incomplete, which the next pull resumes; a file whose size or hash differs
// from what the Hub reports is removed and named in the error. With Offline set it returns
// the cached snapshot and asks the Hub nothing.
func (c *Client) Pull(ctx context.Context, ref Ref) (string, error) {
	if c.Offline {
		dir, err := c.Cache.Resolve(ref)
		if err != nil {
			return "", fmt.Errorf("HF_HUB_OFFLINE is set, so nothing is downloaded, and %w", err)
		}
		return dir, nil
	}
	info, err := c.Info(ctx, ref)
	if err != nil {
		return "", err
	}
	files, sharded, err := Select(info.Files)
	if err != nil {
		return "", fmt.Errorf("%s at commit %s: %w", ref, info.Commit, err)
	}
	snap := filepath.Join(c.Cache.RepoDir(ref.Repo), "snapshots", info.Commit)
	if err := os.MkdirAll(c.Cache.Dir, 0o755); err != nil {
		return "", err
	}
	writeCacheTag(c.Cache.Dir)
	if sharded {
		index := files[len(files)-1]
		if err := c.fetch(ctx, ref, info.Commit, index); err != nil {
			return "", err
		}
		data, err := os.ReadFile(filepath.Join(snap, IndexFile))
		if err != nil {
			return "", err
		}
		shards, err := Shards(data, info.Files)
		if err != nil {
			return "", fmt.Errorf("%s at commit %s: %w", ref, info.Commit, err)
		}
		files = append(files, shards...)
	}
	var total int64
	for _, f := range files {
		total += f.Size
	}
	c.emit(Event{Kind: Planned, Files: len(files), Size: total})
	for _, f := range files {
		if err := c.fetch(ctx, ref, info.Commit, f); err != nil {
			return "", err
		}
	}
	if err := c.Cache.writeRef(ref.Repo, ref.Revision, info.Commit); err != nil {
		return "", err
	}
	return snap, nil
}

// writeCacheTag marks the cache as one for backup tools (https://bford.info/cachedir/), as
// huggingface_hub does; a failure is no error.
func writeCacheTag(dir string) {
	path := filepath.Join(dir, "CACHEDIR.TAG")
	if _, err := os.Stat(path); err == nil {
		return
	}
	_ = os.WriteFile(path, []byte("Signature: 8a477f597d28d172789f06886806bc55\n# This file is a cache directory tag: the Hugging Face hub cache (written by Loom).\n"), 0o644)
}
