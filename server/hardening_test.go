package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/loom-ml/loom/chattemplate"
)

// Tests of issue 21's server defects: huge prompts (2), the API key (3), slow clients (4),
// forced shutdown (6), serving before the model is ready (8), and the new routes.

// rawPost posts body to path and returns the status and the decoded error object (nil for
// a 2xx).
func rawPost(t *testing.T, base, path, body string, header map[string]string) (int, *APIError, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode < 300 {
		return resp.StatusCode, nil, data
	}
	var e struct {
		Error *APIError `json:"error"`
	}
	if err := json.Unmarshal(data, &e); err != nil || e.Error == nil {
		t.Fatalf("%s: %d answer %q is not an OpenAI error object", path, resp.StatusCode, data)
	}
	e.Error.Status = resp.StatusCode
	return resp.StatusCode, e.Error, data
}

// errorCode reads the code of an OpenAI error object (APIError keeps only what it writes).
func errorCode(t *testing.T, data []byte) string {
	t.Helper()
	var e struct {
		Error struct {
			Code *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(data, &e); err != nil || e.Error.Code == nil {
		return ""
	}
	return *e.Error.Code
}

// TestHugePromptsRefusedCheaply sends 15 MB prompts (text, chat and token ids): each gets a
// 400 naming its parameter before it is tokenized or fully decoded, the bytes allocated
// while answering stay within a few times the body (tokenizing it took gigabytes), and
// nothing stays held afterwards.
func TestHugePromptsRefusedCheaply(t *testing.T) {
	env := newEnv(t, "tiny-llama", nil)
	const size = 15 << 20
	text := strings.Repeat("lorem ipsum dolor sit amet ", size/27)
	ids := strings.TrimSuffix(strings.Repeat("5, ", size/3), ", ")
	for _, tc := range []struct {
		name, path, body, param string
		status                  int
	}{
		{"text", "/v1/completions", `{"prompt": "` + text + `", "max_tokens": 1}`, "prompt", http.StatusBadRequest},
		{"text in a list", "/v1/completions", `{"prompt": ["` + text + `"]}`, "prompt", http.StatusBadRequest},
		{"token ids", "/v1/completions", `{"prompt": [` + ids + `]}`, "prompt", http.StatusBadRequest},
		{"chat", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "` + text + `"}]}`, "messages", http.StatusBadRequest},
		{"tokenize", "/tokenize", `{"prompt": "` + text + `"}`, "prompt", http.StatusBadRequest},
		{"over the body limit", "/v1/completions", `{"prompt": "` + text + text + `"}`, "", http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			status, e, data := rawPost(t, env.base, tc.path, tc.body, nil)
			runtime.ReadMemStats(&after)
			if status != tc.status || e.Param != tc.param {
				t.Fatalf("got %d %s, want %d naming %q", status, data, tc.status, tc.param)
			}
			if tc.status == http.StatusBadRequest && errorCode(t, data) != "context_length_exceeded" {
				t.Errorf("code of %s, want context_length_exceeded", data)
			}
			alloc := after.TotalAlloc - before.TotalAlloc
			if limit := uint64(4 * len(tc.body)); alloc > limit {
				t.Errorf("answering a %d-byte body allocated %d bytes, want at most %d", len(tc.body), alloc, limit)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			if held := int64(after.HeapAlloc) - int64(before.HeapAlloc); held > 4<<20 {
				t.Errorf("%d bytes more heap held after the request", held)
			}
			t.Logf("%d-byte body: %d bytes allocated", len(tc.body), alloc)
		})
	}
	if reqs, _, _ := env.eng.snapshot(); len(reqs) != 0 {
		t.Errorf("%d requests reached the engine", len(reqs))
	}
}

// TestPromptPastContextStopsTokenizing: a prompt within the byte bound but with more
// tokens than the context is refused after tokenizing only a part of it, and a prompt that
// fits is tokenized exactly as a whole.
func TestPromptPastContextStopsTokenizing(t *testing.T) {
	env := newEnv(t, "tiny-llama", nil) // context 256: 8192 bytes of text
	// tenBytes is a tokenizer with a token per 10 bytes, for text that fits only after the
	// first parts are tokenized.
	tenBytes := func(s string, _ bool) ([]int, error) { return make([]int, len(s)/10), nil }
	for _, tc := range []struct {
		name      string
		text      string
		limit     int
		over      bool
		maxCopied int // most bytes handed to the tokenizer
		encode    func(string, bool) ([]int, error)
	}{
		{"short", "The quick brown fox", 256, false, 19, env.tok.Encode},
		{"long, fits", strings.Repeat("antidisestablishmentarianism ", 250), 5000, false, 29 * 250, env.tok.Encode},
		{"fits after a part", strings.Repeat("0123456789", 900), 1000, false, 4096 + 9000, tenBytes},
		{"past the context", strings.Repeat("a b ", 2000), 256, true, 4096, env.tok.Encode},
		{"past the context, no spaces", strings.Repeat("ab", 5000), 256, true, 4096, env.tok.Encode},
		{"far past", strings.Repeat("word ", 100000), 256, true, 4096, env.tok.Encode},
	} {
		t.Run(tc.name, func(t *testing.T) {
			copied := 0
			encode := tc.encode
			counting := func(s string, special bool) ([]int, error) {
				copied += len(s)
				return encode(s, special)
			}
			ids, over, err := encodeWithin(counting, tc.text, true, tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			if over != tc.over || copied > tc.maxCopied {
				t.Fatalf("over=%v after tokenizing %d bytes, want over=%v within %d bytes", over, copied, tc.over, tc.maxCopied)
			}
			whole, err := encode(tc.text, true)
			if err != nil {
				t.Fatal(err)
			}
			if !over && !slicesEqual(ids, whole) {
				t.Errorf("ids differ from the whole text's")
			}
			if over && (len(ids) < tc.limit || len(whole) < len(ids)) {
				t.Errorf("over with %d ids, the whole has %d, limit %d", len(ids), len(whole), tc.limit)
			}
		})
	}
	// Through the server: under the byte bound, over the context.
	status, e, data := rawPost(t, env.base, "/v1/completions", `{"prompt": "`+strings.Repeat("a b ", 2000)+`"}`, nil)
	if status != http.StatusBadRequest || e.Param != "prompt" || !strings.Contains(e.Message, "at least") {
		t.Errorf("got %d %s", status, data)
	}
}

func slicesEqual(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestAPIKey: with Config.APIKey every route but /health wants the bearer key, answering
// OpenAI's 401 invalid_api_key otherwise; the openai-go client with the key works.
func TestAPIKey(t *testing.T) {
	env := newEnv(t, "tiny-llama", func(c *Config, _ *fakeEngine) { c.APIKey = "sk-test-123" })
	for _, tc := range []struct {
		method, path, auth string
		status             int
	}{
		{"GET", "/health", "", http.StatusOK},
		{"GET", "/v1/models", "", http.StatusUnauthorized},
		{"GET", "/v1/models", "Bearer sk-wrong", http.StatusUnauthorized},
		{"GET", "/v1/models", "Bearer sk-test-1234", http.StatusUnauthorized},
		{"GET", "/v1/models", "Basic sk-test-123", http.StatusUnauthorized},
		{"GET", "/v1/models", "Bearer sk-test-123", http.StatusOK},
		{"GET", "/v1/models/tiny", "", http.StatusUnauthorized},
		{"GET", "/metrics", "", http.StatusUnauthorized},
		{"GET", "/metrics", "Bearer sk-test-123", http.StatusOK},
		{"POST", "/v1/completions", "", http.StatusUnauthorized},
		{"POST", "/v1/chat/completions", "Bearer nope", http.StatusUnauthorized},
		{"POST", "/tokenize", "", http.StatusUnauthorized},
		{"POST", "/detokenize", "", http.StatusUnauthorized},
		{"GET", "/no/such/route", "", http.StatusUnauthorized},
	} {
		req, err := http.NewRequestWithContext(ctxT(t), tc.method, env.base+tc.path, strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s %s %q: %d %s, want %d", tc.method, tc.path, tc.auth, resp.StatusCode, data, tc.status)
			continue
		}
		if tc.status == http.StatusUnauthorized {
			var e struct {
				Error map[string]any `json:"error"`
			}
			if json.Unmarshal(data, &e) != nil || e.Error["type"] != "invalid_request_error" || e.Error["code"] != "invalid_api_key" || e.Error["message"] == "" {
				t.Errorf("%s %s: 401 body %s is not OpenAI's", tc.method, tc.path, data)
			}
		}
	}
	// openai-go: without the key, with a wrong one, with the right one.
	prompt := openai.CompletionNewParams{Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(2)}
	for _, key := range []string{"", "sk-wrong"} {
		c := openai.NewClient(option.WithBaseURL(env.base+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
		_, err := c.Completions.New(ctxT(t), prompt)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized || apiErr.Code != "invalid_api_key" {
			t.Errorf("key %q: got %v, want 401 invalid_api_key", key, err)
		}
	}
	c := openai.NewClient(option.WithBaseURL(env.base+"/v1/"), option.WithAPIKey("sk-test-123"), option.WithMaxRetries(0))
	if _, err := c.Completions.New(ctxT(t), prompt); err != nil {
		t.Errorf("with the key: %v", err)
	}
	if _, err := c.Models.Get(ctxT(t), "tiny"); err != nil {
		t.Errorf("with the key: %v", err)
	}
}

// syncLog is a log sink safe for the server's goroutines.
type syncLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// TestWarnWithoutKeyBeyondLoopback: Serve warns on an address beyond loopback without a
// key, and not on loopback or with a key.
func TestWarnWithoutKeyBeyondLoopback(t *testing.T) {
	env := newEnv(t, "tiny-llama", nil) // for its tokenizer and engine
	for _, tc := range []struct {
		addr, key string
		warn      bool
	}{
		{"127.0.0.1:0", "", false},
		{"0.0.0.0:0", "", true},
		{"0.0.0.0:0", "k", false},
	} {
		var log syncLog
		srv, err := New(env.eng, Config{Model: "tiny", Tokenizer: env.tok, ContextLength: 64, Logger: slog.New(slog.NewTextHandler(&log, nil)), APIKey: tc.key})
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ln) }()
		eventually(t, "serving", func() bool { return strings.Contains(log.String(), "serving") })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = srv.http.Shutdown(ctx) // the engine is the env's, shut down by it
		cancel()
		<-done
		if got := strings.Contains(log.String(), "without an API key"); got != tc.warn {
			t.Errorf("%s key %q: warned %v, want %v:\n%s", tc.addr, tc.key, got, tc.warn, log.String())
		}
	}
}

// TestCORS: no CORS headers without allowed origins; with them, preflight requests are
// answered for allowed origins, refused for others, and answers carry the origin.
func TestCORS(t *testing.T) {
	plain := newEnv(t, "tiny-llama", nil)
	some := newEnv(t, "tiny-llama", func(c *Config, _ *fakeEngine) {
		c.AllowedOrigins = []string{"https://app.example"}
		c.APIKey = "k" // a preflight carries no key, and must not need one
	})
	anyOrigin := newEnv(t, "tiny-llama", func(c *Config, _ *fakeEngine) { c.AllowedOrigins = []string{"*"} })
	for _, tc := range []struct {
		name       string
		env        *testEnv
		method     string
		origin     string
		status     int
		allowed    string // Access-Control-Allow-Origin
		preflights bool
	}{
		{"unset preflight", plain, "OPTIONS", "https://app.example", http.StatusMethodNotAllowed, "", true},
		{"unset get", plain, "GET", "https://app.example", http.StatusOK, "", false},
		{"allowed preflight", some, "OPTIONS", "https://app.example", http.StatusNoContent, "https://app.example", true},
		{"other preflight", some, "OPTIONS", "https://evil.example", http.StatusForbidden, "", true},
		{"allowed get", some, "GET", "https://app.example", http.StatusUnauthorized, "https://app.example", false},
		{"other get", some, "GET", "https://evil.example", http.StatusUnauthorized, "", false},
		{"any preflight", anyOrigin, "OPTIONS", "https://x.example", http.StatusNoContent, "*", true},
		{"any get", anyOrigin, "GET", "https://x.example", http.StatusOK, "*", false},
	} {
		req, err := http.NewRequestWithContext(ctxT(t), tc.method, tc.env.base+"/v1/models", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Origin", tc.origin)
		if tc.preflights {
			req.Header.Set("Access-Control-Request-Method", "POST")
			req.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		h := resp.Header
		if resp.StatusCode != tc.status || h.Get("Access-Control-Allow-Origin") != tc.allowed {
			t.Errorf("%s: %d, Access-Control-Allow-Origin %q; want %d, %q", tc.name, resp.StatusCode, h.Get("Access-Control-Allow-Origin"), tc.status, tc.allowed)
		}
		if tc.status == http.StatusNoContent && (!strings.Contains(h.Get("Access-Control-Allow-Methods"), "POST") ||
			!strings.Contains(h.Get("Access-Control-Allow-Headers"), "authorization")) {
			t.Errorf("%s: preflight headers %v", tc.name, h)
		}
		if tc.env == plain {
			for k := range h {
				if strings.HasPrefix(k, "Access-Control-") {
					t.Errorf("%s: CORS header %s without allowed origins", tc.name, k)
				}
			}
		}
	}
}

// dialRaw opens a connection to the env's server.
func dialRaw(t *testing.T, env *testEnv) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(env.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedWithin reads from c until the server closes it, failing if that takes longer than
// d; it returns what was read.
func closedWithin(t *testing.T, c net.Conn, d time.Duration, what string) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	data, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: the server kept the connection open past %v (read %q)", what, d, data)
	}
	return string(data)
}

// TestSlowClients holds the server to its timeouts over real connections: a body trickled
// byte by byte gets 408 and the connection closes, as do trickled headers and an idle
// keep-alive connection; a stream that outlasts the write timeout many times over goes on.
func TestSlowClients(t *testing.T) {
	env := newEnv(t, "tiny-llama", func(c *Config, e *fakeEngine) {
		c.ReadTimeout, c.IdleTimeout, c.WriteTimeout = 300*time.Millisecond, 300*time.Millisecond, 100*time.Millisecond
		e.delay = 10 * time.Millisecond
	})
	trickle := func(c net.Conn, s string, stop <-chan struct{}) {
		for i := range len(s) {
			select {
			case <-stop:
				return
			case <-time.After(30 * time.Millisecond):
			}
			if _, err := c.Write([]byte{s[i]}); err != nil {
				return
			}
		}
	}

	t.Run("body", func(t *testing.T) {
		c := dialRaw(t, env)
		body := `{"prompt": "` + strings.Repeat("x", 200) + `"}`
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
		stop := make(chan struct{})
		defer close(stop)
		go trickle(c, body, stop)
		got := closedWithin(t, c, 5*time.Second, "trickled body")
		if !strings.HasPrefix(got, "HTTP/1.1 408") || !strings.Contains(got, "request_timeout") {
			t.Errorf("trickled body answered %q, want 408 request_timeout", got)
		}
	})
	t.Run("headers", func(t *testing.T) {
		c := dialRaw(t, env)
		stop := make(chan struct{})
		defer close(stop)
		go trickle(c, "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "+strings.Repeat("y", 500)+"\r\n\r\n", stop)
		closedWithin(t, c, 5*time.Second, "trickled headers")
	})
	t.Run("idle", func(t *testing.T) {
		c := dialRaw(t, env)
		fmt.Fprintf(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
		r := bufio.NewReader(c)
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("health: %d", resp.StatusCode)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var ne net.Error
		if _, err := r.ReadByte(); err == nil || errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("idle keep-alive connection: read %v, want it closed by the server", err)
		}
	})
	t.Run("long stream", func(t *testing.T) {
		st := env.client.Completions.NewStreaming(ctxT(t), openai.CompletionNewParams{
			Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(80),
		}, option.WithJSONSet("ignore_eos", true))
		text, start := "", time.Now()
		for st.Next() {
			if ch := st.Current(); len(ch.Choices) > 0 {
				text += ch.Choices[0].Text
			}
		}
		if err := st.Err(); err != nil {
			t.Fatalf("a stream of %v, past the write timeout: %v", time.Since(start), err)
		}
		if want := env.want(t, 80); text != want {
			t.Errorf("stream %q, want %q", text, want)
		}
	})
}

// TestConnectionCap: past MaxConnections a new connection gets 503 at once; when one
// closes, a new one is served.
func TestConnectionCap(t *testing.T) {
	env := newEnv(t, "tiny-llama", func(c *Config, _ *fakeEngine) { c.MaxConnections = 2 })
	a, b := dialRaw(t, env), dialRaw(t, env)
	_ = b
	// The server has accepted both once one of them is answered.
	fmt.Fprintf(a, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(a), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	third := dialRaw(t, env)
	fmt.Fprintf(third, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	got := closedWithin(t, third, 5*time.Second, "connection past the cap")
	if !strings.HasPrefix(got, "HTTP/1.1 503") || !strings.Contains(got, "too_many_connections") {
		t.Errorf("connection past the cap: %q", got)
	}
	a.Close()
	eventually(t, "a slot to free", func() bool {
		c := dialRaw(t, env)
		fmt.Fprintf(c, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// readSSE reads a whole event stream and returns its events' data.
func readSSE(t *testing.T, body io.Reader) []string {
	t.Helper()
	data, _ := io.ReadAll(body)
	var events []string
	for _, ev := range strings.Split(string(data), "\n\n") {
		if d, ok := strings.CutPrefix(ev, "data: "); ok {
			events = append(events, d)
		}
	}
	return events
}

// TestForcedShutdownEndsStreams: when the drain times out, every open stream (completion,
// chat, several choices) ends with an error event and [DONE].
func TestForcedShutdownEndsStreams(t *testing.T) {
	env := newEnv(t, "tiny-llama", func(_ *Config, e *fakeEngine) { e.delay = 20 * time.Millisecond })
	bodies := map[string]string{
		"/v1/completions":      `{"prompt": "hi", "max_tokens": 200, "stream": true}`,
		"/v1/chat/completions": `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200, "stream": true}`,
		"/v1/completions#n":    `{"prompt": "hi", "max_tokens": 200, "stream": true, "n": 3}`,
	}
	var wg sync.WaitGroup
	results := map[string][]string{}
	var mu sync.Mutex
	started := make(chan struct{}, len(bodies))
	for path, body := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, _, _ := strings.Cut(path, "#")
			resp, err := http.Post(env.base+p, "application/json", strings.NewReader(body))
			if err != nil {
				t.Error(err)
				started <- struct{}{}
				return
			}
			defer resp.Body.Close()
			r := bufio.NewReader(resp.Body)
			first, _ := r.ReadString('\n') // the first event is out: the stream is open
			started <- struct{}{}
			events := readSSE(t, io.MultiReader(strings.NewReader(first), r))
			mu.Lock()
			results[path] = events
			mu.Unlock()
		}()
	}
	for range bodies {
		<-started
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := env.srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("shutdown = %v, want the deadline error", err)
	}
	wg.Wait()
	for path, events := range results {
		n := len(events)
		if n < 2 || events[n-1] != "[DONE]" {
			t.Errorf("%s: stream does not end with [DONE]: %q", path, events)
			continue
		}
		var e struct {
			Error map[string]any `json:"error"`
		}
		if json.Unmarshal([]byte(events[n-2]), &e) != nil || e.Error["type"] != typeUnavailable || e.Error["code"] != "server_shutdown" {
			t.Errorf("%s: the event before [DONE] is %q, want the shutdown error", path, events[n-2])
		}
	}
	if len(results) != len(bodies) {
		t.Errorf("%d streams read, want %d", len(results), len(bodies))
	}
}

// TestLoadingThenReady: a server made before its engine answers /health and the API with
// 503 (metrics work), then serves once Ready.
func TestLoadingThenReady(t *testing.T) {
	env := newEnv(t, "tiny-llama", nil)
	srv, err := NewLoading(Config{Model: "tiny", Tokenizer: env.tok, ContextLength: 64, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	base := "http://" + ln.Addr().String()
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	if code, body := get("/health"); code != http.StatusServiceUnavailable || !strings.Contains(body, "loading") {
		t.Errorf("health while loading: %d %s", code, body)
	}
	if code, body := get("/metrics"); code != http.StatusOK {
		t.Errorf("metrics while loading: %d %s", code, body)
	}
	client := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithMaxRetries(0))
	_, err = client.Models.List(ctxT(t))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable || apiErr.Code != "model_loading" {
		t.Errorf("models while loading: %v", err)
	}
	eng := &fakeEngine{script: env.eng.script, eos: env.eng.eos, blockSize: 16, blocks: 64}
	if err := srv.Ready(eng); err != nil {
		t.Fatal(err)
	}
	if code, body := get("/health"); code != http.StatusOK {
		t.Errorf("health when ready: %d %s", code, body)
	}
	if _, err := client.Completions.New(ctxT(t), openai.CompletionNewParams{
		Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(2),
	}); err != nil {
		t.Errorf("completion when ready: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Error(err)
	}
}

// TestTokenizeRoutes: /tokenize and /detokenize in vLLM's shapes, through openai-go's
// generic Post.
func TestTokenizeRoutes(t *testing.T) {
	env := newEnv(t, "tiny-qwen2", nil)
	client := openai.NewClient(option.WithBaseURL(env.base+"/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	prompt := "Hello there, tokenizer."
	withSpecial, _ := env.tok.Encode(prompt, true)
	without, _ := env.tok.Encode(prompt, false)
	type tokenized struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []int    `json:"tokens"`
		TokenStrs   []string `json:"token_strs"`
	}
	for _, tc := range []struct {
		name string
		body map[string]any
		want []int
	}{
		{"prompt", map[string]any{"prompt": prompt}, withSpecial},
		{"prompt without specials", map[string]any{"prompt": prompt, "add_special_tokens": false}, without},
		{"model named", map[string]any{"model": "tiny", "prompt": prompt}, withSpecial},
	} {
		var out tokenized
		if err := client.Post(ctxT(t), "tokenize", tc.body, &out); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slicesEqual(out.Tokens, tc.want) || out.Count != len(tc.want) || out.MaxModelLen != 256 || out.TokenStrs != nil {
			t.Errorf("%s: %+v, want tokens %v", tc.name, out, tc.want)
		}
	}
	// Messages render with the chat template, without special tokens added.
	var out tokenized
	msgs := []map[string]string{{"role": "user", "content": prompt}}
	if err := client.Post(ctxT(t), "tokenize", map[string]any{"messages": msgs, "return_token_strs": true}, &out); err != nil {
		t.Fatal(err)
	}
	text, err := env.tmpl.Render([]chattemplate.Message{{Role: "user", Content: prompt}}, true)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := env.tok.Encode(text, false)
	if !slicesEqual(out.Tokens, want) || len(out.TokenStrs) != len(want) {
		t.Errorf("messages: %+v, want %v", out, want)
	}
	// Detokenize gives the text back.
	var back struct {
		Prompt string `json:"prompt"`
	}
	if err := client.Post(ctxT(t), "detokenize", map[string]any{"tokens": without}, &back); err != nil {
		t.Fatal(err)
	}
	if back.Prompt != prompt {
		t.Errorf("detokenize: %q, want %q", back.Prompt, prompt)
	}
	// Bad requests name the parameter.
	for _, tc := range []struct {
		path, body, param string
		status            int
	}{
		{"/tokenize", `{}`, "prompt", 400},
		{"/tokenize", `{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}`, "messages", 400},
		{"/tokenize", `{"prompt": 5}`, "prompt", 400},
		{"/tokenize", `{"prompt": "a", "model": "other"}`, "model", 404},
		{"/tokenize", `{"messages": [{"content": "x"}]}`, "messages[0].role", 400},
		{"/detokenize", `{}`, "tokens", 400},
		{"/detokenize", `{"tokens": [1, -1]}`, "tokens", 400},
		{"/detokenize", `{"tokens": [1, 100000000]}`, "tokens", 400},
		{"/detokenize", `{"tokens": "abc"}`, "tokens", 400},
	} {
		status, e, data := rawPost(t, env.base, tc.path, tc.body, nil)
		if status != tc.status || e == nil || e.Param != tc.param {
			t.Errorf("%s %s: %d %s, want %d naming %s", tc.path, tc.body, status, data, tc.status, tc.param)
		}
	}
}

// TestModelByID: GET /v1/models/{id} for the served model (a name with a slash, as Hub
// names have), 404 model_not_found for others.
func TestModelByID(t *testing.T) {
	env := newEnv(t, "tiny-llama", func(c *Config, _ *fakeEngine) { c.Model = "Org/tiny" })
	m, err := env.client.Models.Get(ctxT(t), "Org/tiny")
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != "Org/tiny" || m.Object != "model" {
		t.Errorf("model %+v", m)
	}
	_, err = env.client.Models.Get(ctxT(t), "other")
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
		t.Errorf("other model: %v", err)
	}
	resp, err := http.Post(env.base+"/v1/models/Org/tiny", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST a model: %d Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

// TestNChoices: n choices, streamed or not, each with its index and the whole text; the
// prompt counts once in usage; each choice is its own engine request with its own seed.
func TestNChoices(t *testing.T) {
	env := newEnv(t, "tiny-llama", nil)
	prompt := "The quick brown fox"
	promptIDs, _ := env.tok.Encode(prompt, true)
	want := env.want(t, 7)
	for _, stream := range []bool{false, true} {
		before, _, _ := env.eng.snapshot()
		params := openai.CompletionNewParams{Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
			MaxTokens: openai.Int(7), N: openai.Int(3), Seed: openai.Int(40)}
		texts, finishes := map[int64]string{}, map[int64]string{}
		var u openai.CompletionUsage
		if stream {
			params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
			st := env.client.Completions.NewStreaming(ctxT(t), params)
			for st.Next() {
				c := st.Current()
				for _, ch := range c.Choices {
					texts[ch.Index] += ch.Text
					finishes[ch.Index] += string(ch.FinishReason)
				}
				if c.Usage.TotalTokens > 0 {
					u = c.Usage
				}
			}
			if err := st.Err(); err != nil {
				t.Fatal(err)
			}
		} else {
			c, err := env.client.Completions.New(ctxT(t), params)
			if err != nil {
				t.Fatal(err)
			}
			for _, ch := range c.Choices {
				texts[ch.Index], finishes[ch.Index] = ch.Text, string(ch.FinishReason)
			}
			u = c.Usage
		}
		for i := range int64(3) {
			if texts[i] != want || finishes[i] != "length" {
				t.Errorf("stream=%v: choice %d %q (%s), want %q (length)", stream, i, texts[i], finishes[i], want)
			}
		}
		if len(texts) != 3 || u.PromptTokens != int64(len(promptIDs)) || u.CompletionTokens != 21 || u.TotalTokens != u.PromptTokens+21 {
			t.Errorf("stream=%v: %d choices, usage %+v; want 3, prompt %d once, 21 completion tokens", stream, len(texts), u, len(promptIDs))
		}
		after, _, _ := env.eng.snapshot()
		seeds := map[int64]bool{}
		for _, r := range after[len(before):] {
			seeds[r.Sampling.Seed] = r.Sampling.HasSeed
		}
		if len(after)-len(before) != 3 || !seeds[40] || !seeds[41] || !seeds[42] {
			t.Errorf("stream=%v: engine requests %+v, want 3 with seeds 40, 41, 42", stream, after[len(before):])
		}
	}
	// Chat, through the accumulator.
	st := env.client.Chat.Completions.NewStreaming(ctxT(t), openai.ChatCompletionNewParams{Model: "tiny",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(5), N: openai.Int(2)})
	var acc openai.ChatCompletionAccumulator
	for st.Next() {
		acc.AddChunk(st.Current())
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Choices) != 2 || acc.Choices[0].Message.Content != env.want(t, 5) || acc.Choices[1].Message.Content != env.want(t, 5) ||
		acc.Choices[1].Index != 1 || acc.Choices[1].FinishReason != "length" {
		t.Errorf("chat n=2: %+v", acc.Choices)
	}
	c, err := env.client.Chat.Completions.New(ctxT(t), openai.ChatCompletionNewParams{Model: "tiny",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(5), N: openai.Int(2)})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Choices) != 2 || c.Choices[1].Index != 1 || c.Usage.CompletionTokens != 10 {
		t.Errorf("chat n=2: %+v usage %+v", c.Choices, c.Usage)
	}
	// One choice refused by the engine refuses the request and cancels the others.
	env.eng.mu.Lock()
	env.eng.blocks = env.eng.used + 1
	env.eng.mu.Unlock()
	_, err = env.client.Completions.New(ctxT(t), openai.CompletionNewParams{Model: "tiny",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}, MaxTokens: openai.Int(3), N: openai.Int(4)})
	if err == nil {
		t.Error("n=4 past the KV cache: no error")
	}
	eventually(t, "the admitted choices to end", func() bool { return env.eng.Stats().KVBlocksUsed == 0 })
}
