// Package hubtest is a fake Hugging Face Hub for tests: the model info API
// (/api/models/ORG/NAME/revision/REV, with ?blobs=true the sizes, git blob ids and LFS
// sha256 of the files) and the file downloads (/ORG/NAME/resolve/REV/FILE, LFS files through
// a redirect to /cdn/SHA256, as the Hub sends them to its CDN), with Range requests, tokens,
// private and gated models, the Hub's error codes, and faults to order: a body cut short, a
// server that ignores Range, bytes that do not match the listed hash, a transfer that stalls.
package hubtest

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Repo is a model repository of the fake Hub at one commit.
type Repo struct {
	ID      string            // ORG/NAME
	Files   map[string][]byte // path in the repository -> content
	Refs    []string          // the branches and tags that name the commit; nil: main
	Private bool              // only Server.Token may see it
	Gated   bool              // its info is public, its files are refused (401 without a token, 403 with one)
	commit  string
}

// Commit is the repository's commit hash: a digest of its files.
func (r *Repo) Commit() string {
	if r.commit == "" {
		h := sha1.New()
		for _, name := range r.names() {
			fmt.Fprintf(h, "%s %s\n", name, GitBlobID(r.Files[name]))
		}
		r.commit = hex.EncodeToString(h.Sum(nil))
	}
	return r.commit
}

func (r *Repo) names() []string {
	names := make([]string, 0, len(r.Files))
	for n := range r.Files {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// IsLFS reports whether the fake Hub stores a file with Git LFS: weights and anything over
// 10 MB, as the Hub's .gitattributes do.
func IsLFS(name string, data []byte) bool {
	for _, ext := range []string{".safetensors", ".bin", ".gguf", ".pt", ".pth", ".onnx"} {
		if strings.HasSuffix(name, ext) {
			return true
		}
	}
	return len(data) > 10<<20
}

// GitBlobID is git's object id of a file: sha1 over "blob SIZE\x00" and the content.
func GitBlobID(data []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(data))
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

// SHA256 is the hex sha256 of data.
func SHA256(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

// Fault spoils the answers that carry a file's bytes.
type Fault struct {
	CutAfter    int  // > 0: the body ends after this many bytes (the headers promise all of them)
	Stall       bool // with CutAfter: after those bytes the answer waits until the client gives up
	IgnoreRange bool // answer 200 with the whole file to a Range request
	Corrupt     bool // flip a byte of the content (the listed size and hash stay)
	Pad         int  // send this many bytes more than the file has
	Times       int  // how many answers it spoils; 0: all
}

// Request is a request the server got.
type Request struct {
	Path  string // the URL path, unescaped
	Range string // the Range header
	Auth  string // the Authorization header
}

// Server is a running fake Hub; its URL is the endpoint (HF_ENDPOINT).
type Server struct {
	*httptest.Server
	Token string // the access token that private repositories need ("" for none)
	// CDNHost, when set, is the host (host:port) that LFS files are redirected to, as the Hub
	// sends them to another host; it must reach this server (e.g. localhost:PORT).
	CDNHost string

	mu       sync.Mutex
	repos    map[string]*Repo
	faults   map[string]*Fault
	requests []Request
}

// New starts a fake Hub with the given repositories, closed when the test ends.
func New(t testing.TB, repos ...*Repo) *Server {
	s := &Server{repos: map[string]*Repo{}, faults: map[string]*Fault{}}
	for _, r := range repos {
		s.repos[r.ID] = r
	}
	api, files := http.NewServeMux(), http.NewServeMux() // two muxes: their patterns overlap
	api.HandleFunc("GET /api/models/{org}/{name}/revision/{rev...}", s.info)
	files.HandleFunc("GET /cdn/{sha}", s.cdn)
	files.HandleFunc("GET /{org}/{name}/resolve/{rev}/{file...}", s.resolve)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests = append(s.requests, Request{Path: r.URL.Path, Range: r.Header.Get("Range"), Auth: r.Header.Get("Authorization")})
		s.mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/api/") {
			api.ServeHTTP(w, r)
		} else {
			files.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// Fault spoils the next answers that carry the bytes of file (a path in any repository).
func (s *Server) Fault(file string, f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[file] = &f
}

// Requests returns the requests so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// ResetRequests forgets the requests so far.
func (s *Server) ResetRequests() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = nil
}

func hubError(w http.ResponseWriter, status int, code, msg string) {
	if code != "" {
		w.Header().Set("X-Error-Code", code)
	}
	w.Header().Set("X-Error-Message", msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// lookup finds the repository and checks the token and the revision; it answers the error
// itself and returns nil when there is one.
func (s *Server) lookup(w http.ResponseWriter, r *http.Request, rev string) *Repo {
	s.mu.Lock()
	repo := s.repos[r.PathValue("org")+"/"+r.PathValue("name")]
	s.mu.Unlock()
	auth := r.Header.Get("Authorization")
	authed := s.Token != "" && auth == "Bearer "+s.Token
	if auth != "" && !authed {
		hubError(w, http.StatusUnauthorized, "", "Invalid credentials in Authorization header")
		return nil
	}
	if repo == nil || repo.Private && !authed {
		if authed {
			hubError(w, http.StatusNotFound, "RepoNotFound", "Repository not found")
		} else {
			hubError(w, http.StatusUnauthorized, "RepoNotFound", "Repository not found")
		}
		return nil
	}
	refs := repo.Refs
	if refs == nil {
		refs = []string{"main"}
	}
	if rev != repo.Commit() && !slices.Contains(refs, rev) {
		hubError(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
		return nil
	}
	return repo
}

func (s *Server) info(w http.ResponseWriter, r *http.Request) {
	repo := s.lookup(w, r, r.PathValue("rev"))
	if repo == nil {
		return
	}
	blobs := r.URL.Query().Get("blobs") == "true" || r.URL.Query().Get("blobs") == "True"
	type lfs struct {
		SHA256      string `json:"sha256"`
		Size        int    `json:"size"`
		PointerSize int    `json:"pointerSize"`
	}
	type sibling struct {
		RFilename string `json:"rfilename"`
		Size      *int   `json:"size,omitempty"`
		BlobID    string `json:"blobId,omitempty"`
		LFS       *lfs   `json:"lfs,omitempty"`
	}
	siblings := []sibling{}
	for _, name := range repo.names() {
		data := repo.Files[name]
		sb := sibling{RFilename: name}
		if blobs {
			n := len(data)
			sb.Size = &n
			if IsLFS(name, data) {
				ptr := pointer(data)
				sb.BlobID = GitBlobID(ptr)
				sb.LFS = &lfs{SHA256: SHA256(data), Size: n, PointerSize: len(ptr)}
			} else {
				sb.BlobID = GitBlobID(data)
			}
		}
		siblings = append(siblings, sb)
	}
	gated := any(false)
	if repo.Gated {
		gated = "manual"
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{
		"_id": "0123456789abcdef01234567", "id": repo.ID, "modelId": repo.ID, "author": strings.Split(repo.ID, "/")[0],
		"sha": repo.Commit(), "private": repo.Private, "gated": gated, "disabled": false,
		"lastModified": "2025-01-01T00:00:00.000Z", "tags": []string{"safetensors"}, "siblings": siblings,
	})
}

// pointer is the Git LFS pointer file of data.
func pointer(data []byte) []byte {
	return fmt.Appendf(nil, "version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n", SHA256(data), len(data))
}

func (s *Server) resolve(w http.ResponseWriter, r *http.Request) {
	repo := s.lookup(w, r, r.PathValue("rev"))
	if repo == nil {
		return
	}
	name := r.PathValue("file")
	data, ok := repo.Files[name]
	if !ok {
		hubError(w, http.StatusNotFound, "EntryNotFound", name+" does not exist on \""+r.PathValue("rev")+"\"")
		return
	}
	if repo.Gated {
		if r.Header.Get("Authorization") == "" {
			hubError(w, http.StatusUnauthorized, "GatedRepo", "Access to model "+repo.ID+" is restricted. You must have access to it and be authenticated to access it. Please log in.")
		} else {
			hubError(w, http.StatusForbidden, "GatedRepo", "Access to model "+repo.ID+" is restricted and you are not in the authorized list. Visit https://huggingface.co/"+repo.ID+" to ask for access.")
		}
		return
	}
	w.Header().Set("X-Repo-Commit", repo.Commit())
	if IsLFS(name, data) {
		sum := SHA256(data)
		w.Header().Set("X-Linked-Etag", `"`+sum+`"`)
		w.Header().Set("X-Linked-Size", fmt.Sprint(len(data)))
		w.Header().Set("ETag", `"`+GitBlobID(pointer(data))+`"`)
		loc := "/cdn/" + sum + "?name=" + name
		if s.CDNHost != "" {
			loc = "http://" + s.CDNHost + loc
		}
		http.Redirect(w, r, loc, http.StatusFound)
		return
	}
	w.Header().Set("ETag", `"`+GitBlobID(data)+`"`)
	s.serve(w, r, name, data)
}

func (s *Server) cdn(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	var name string
	var data []byte
	for _, repo := range s.repos {
		for n, d := range repo.Files {
			if SHA256(d) == r.PathValue("sha") {
				name, data = n, d
			}
		}
	}
	s.mu.Unlock()
	if data == nil {
		http.NotFound(w, r)
		return
	}
	s.serve(w, r, name, data)
}

// serve sends a file's bytes, honoring Range, through the fault set for it.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, name string, data []byte) {
	s.mu.Lock()
	var f Fault
	if p := s.faults[name]; p != nil {
		f = *p
		if p.Times > 0 {
			if p.Times--; p.Times == 0 {
				delete(s.faults, name)
			}
		}
	}
	s.mu.Unlock()
	if f.Corrupt {
		data = bytes.Clone(data)
		data[len(data)/2] ^= 0xff
	}
	if f.Pad > 0 {
		data = append(bytes.Clone(data), make([]byte, f.Pad)...)
	}
	if f.IgnoreRange {
		r.Header.Del("Range")
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	if f.CutAfter > 0 {
		w = &cutWriter{ResponseWriter: w, left: f.CutAfter, stall: f.Stall, r: r}
	}
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
}

// cutWriter ends a body after left bytes: the handler's write fails, and the server closes
// the connection short of the Content-Length it sent. With stall it first waits for the
// client to go.
type cutWriter struct {
	http.ResponseWriter
	left  int
	stall bool
	r     *http.Request
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if len(p) <= c.left {
		c.left -= len(p)
		return c.ResponseWriter.Write(p)
	}
	n, _ := c.ResponseWriter.Write(p[:c.left])
	c.left = 0
	if c.stall {
		http.NewResponseController(c.ResponseWriter).Flush()
		<-c.r.Context().Done()
	}
	return n, errors.New("hubtest: body cut")
}
