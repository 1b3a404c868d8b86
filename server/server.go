// Package server serves a Loom engine over HTTP with the OpenAI API: POST /v1/completions
// and POST /v1/chat/completions (streaming as server-sent events or not, n choices),
// GET /v1/models and /v1/models/{id}, POST /tokenize and /detokenize (vLLM's shapes),
// GET /health and GET /metrics (Prometheus).
//
// Against abuse: a text prompt longer than the context can hold (promptBytesPerToken bytes a
// token) is refused before it is tokenized, and one within that bound is tokenized only as
// far as the context; the body is capped (Config.MaxBodyBytes), and so are the open
// connections; headers and bodies must arrive within Config.ReadTimeout, each write must go
// out within Config.WriteTimeout (per write, so streams may last), idle keep-alive
// connections close. Config.APIKey guards every route but /health; Config.AllowedOrigins
// turns on CORS. A server made by NewLoading listens while the model loads, answering 503
// until Ready.
//
// The engine works in tokens; the server does the text: it encodes prompts, renders chat
// templates, detokenizes incrementally, and applies stop strings (holding back text that
// could be the start of one, and cancelling the engine request when one is found). Invalid
// requests get HTTP 400 with an OpenAI-style error object that names the parameter. A client
// that disconnects cancels its request, which frees its KV cache blocks.
package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/loom-ml/loom/chattemplate"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tokenizer"
)

// Config configures a Server.
type Config struct {
	// Model is the name the model is served under (the "model" field of requests).
	Model string
	// Tokenizer encodes prompts and decodes generated tokens (required).
	Tokenizer *tokenizer.Tokenizer
	// ChatTemplate renders chat messages; nil makes /v1/chat/completions answer 400.
	ChatTemplate *chattemplate.Template
	// ContextLength is the most tokens (prompt plus completion) of a request (required).
	// It also bounds a text prompt's bytes before it is tokenized: promptBytesPerToken bytes
	// a token.
	ContextLength int
	// VocabSize bounds token ids in requests; the tokenizer's vocabulary size when 0.
	VocabSize int
	// Defaults are the sampling parameters of a request that sets none (OpenAI's default is
	// temperature 1).
	Defaults sample.Params
	// DefaultMaxTokens is max_tokens of a completion request that gives none (OpenAI: 16);
	// chat requests default to the rest of the context.
	DefaultMaxTokens int
	// MaxBodyBytes limits a request body (default 16 MiB). A body that says it is larger is
	// refused before a byte of it is read.
	MaxBodyBytes int64
	// APIKey, when set, must come as "Authorization: Bearer KEY" with every request but
	// GET /health; others get 401 invalid_api_key.
	APIKey string
	// AllowedOrigins are the origins that browsers may call the API from (CORS); "*" allows
	// any. When empty no CORS headers are sent and preflight requests are not answered.
	AllowedOrigins []string
	// MaxConnections caps the open connections (default 1024; negative: no cap). A
	// connection past the cap gets a 503 and is closed at once.
	MaxConnections int
	// ReadTimeout bounds the time a client takes to send a request's headers, and then,
	// separately, its body (default 30s; negative: none). A late body gets 408.
	ReadTimeout time.Duration
	// WriteTimeout bounds each write to a client, so that one that stops reading is dropped
	// (default 60s; negative: none). It applies per write, not per response: a stream may
	// last as long as its generation does.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no request for this long
	// (default 60s; negative: none).
	IdleTimeout time.Duration
	// Registry receives the server's metrics; a new registry when nil. /metrics serves it.
	Registry *prometheus.Registry
	// Logger logs requests and errors; slog.Default() when nil.
	Logger *slog.Logger
}

// The defaults of Config's limits.
const (
	defaultMaxBodyBytes   = 16 << 20
	defaultMaxConnections = 1024
	defaultReadTimeout    = 30 * time.Second
	defaultWriteTimeout   = 60 * time.Second
	defaultIdleTimeout    = 60 * time.Second
	// forceGrace is how long a forced shutdown waits for the open streams to write their
	// error event and [DONE] before it closes the connections.
	forceGrace = 2 * time.Second
)

// engineRef holds the engine once it is ready.
type engineRef struct{ Engine }

// Server is an OpenAI-compatible HTTP server in front of an Engine.
type Server struct {
	cfg     Config
	engRef  atomic.Pointer[engineRef]
	log     *slog.Logger
	vocab   int
	metrics *metrics
	handler http.Handler
	http    *http.Server
	closing atomic.Bool
	// forced ends when a shutdown stops waiting for requests: the open generations then end
	// with an error event (see errShutdown).
	forced context.Context
	force  context.CancelFunc
	// active counts the API requests being handled.
	active atomic.Int64
}

// New returns a server for eng, ready to serve.
func New(eng Engine, cfg Config) (*Server, error) {
	if eng == nil {
		return nil, errors.New("server: no engine")
	}
	s, err := NewLoading(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.Ready(eng); err != nil {
		return nil, err
	}
	return s, nil
}

// NewLoading returns a server whose engine is not there yet (the model is loading): it can
// listen at once, GET /health answers 503 {"status": "loading"} and the API 503
// service_unavailable until Ready gives it the engine.
func NewLoading(cfg Config) (*Server, error) {
	if cfg.Tokenizer == nil {
		return nil, errors.New("server: no tokenizer")
	}
	if cfg.ContextLength <= 0 {
		return nil, fmt.Errorf("server: context length must be positive, got %d", cfg.ContextLength)
	}
	if cfg.Model == "" {
		cfg.Model = "loom"
	}
	if cfg.DefaultMaxTokens == 0 {
		cfg.DefaultMaxTokens = 16
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = defaultMaxBodyBytes
	}
	cfg.MaxConnections = orDefault(cfg.MaxConnections, defaultMaxConnections)
	cfg.ReadTimeout = orDefault(cfg.ReadTimeout, defaultReadTimeout)
	cfg.WriteTimeout = orDefault(cfg.WriteTimeout, defaultWriteTimeout)
	cfg.IdleTimeout = orDefault(cfg.IdleTimeout, defaultIdleTimeout)
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, log: cfg.Logger, vocab: cfg.VocabSize}
	s.forced, s.force = context.WithCancel(context.Background())
	if s.vocab <= 0 {
		s.vocab = cfg.Tokenizer.VocabSize()
	}
	var err error
	if s.metrics, err = newMetrics(cfg.Registry, s.engine); err != nil {
		return nil, fmt.Errorf("server: register metrics: %w", err)
	}
	mux := http.NewServeMux()
	routes := []struct {
		method, path string
		h            http.Handler
	}{
		{"POST", "/v1/completions", s.api("completions", s.handleCompletions)},
		{"POST", "/v1/chat/completions", s.api("chat_completions", s.handleChat)},
		{"GET", "/v1/models", s.api("models", s.handleModels)},
		{"GET", "/v1/models/{id...}", s.api("model", s.handleModel)},
		{"POST", "/tokenize", s.api("tokenize", s.handleTokenize)},
		{"POST", "/detokenize", s.api("detokenize", s.handleDetokenize)},
		{"GET", "/health", http.HandlerFunc(s.handleHealth)},
		{"GET", "/metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{})},
	}
	allow := map[string]string{} // path (a prefix when it ends with /) -> its Allow header
	for _, rt := range routes {
		mux.Handle(rt.method+" "+rt.path, rt.h)
		path, _, _ := strings.Cut(rt.path, "{")
		allow[path] = rt.method
		if rt.method == "GET" {
			allow[path] = "GET, HEAD" // a GET pattern serves HEAD too
		}
	}
	// The catch-all pattern hides the mux's own 405s, so answer a known path with the wrong
	// method here: 405 with an Allow header, as HTTP asks, rather than 404.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		methods, ok := allow[r.URL.Path]
		if !ok && strings.HasPrefix(r.URL.Path, "/v1/models/") {
			methods, ok = allow["/v1/models/"]
		}
		if ok {
			w.Header().Set("Allow", methods)
			writeJSON(w, http.StatusMethodNotAllowed, errorBody{&APIError{Status: http.StatusMethodNotAllowed, Type: typeInvalidRequest,
				Message: fmt.Sprintf("method %s is not allowed for %s; use %s", r.Method, r.URL.Path, methods)}})
			return
		}
		writeJSON(w, http.StatusNotFound, errorBody{&APIError{Status: http.StatusNotFound, Type: typeNotFound,
			Message: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)}})
	})
	s.handler = s.guard(mux)
	s.http = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: max(cfg.ReadTimeout, 0),
		IdleTimeout:       max(cfg.IdleTimeout, 0),
		// No ReadTimeout or WriteTimeout: they would bound a whole request, and end a long
		// stream. The body's read deadline is set per request (readBody) and the write
		// deadline per write (deadlineWriter).
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
		// Request contexts come from context.Background: a signal that stops the
		// process must not cancel the requests it is draining.
	}
	return s, nil
}

// orDefault is v, or def when v is 0; a negative v (none) becomes 0.
func orDefault[T int | time.Duration](v, def T) T {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// Ready hands the loaded model's engine to a server made by NewLoading: from now on it
// serves the API and /health answers 200.
func (s *Server) Ready(eng Engine) error {
	if eng == nil {
		return errors.New("server: no engine")
	}
	if !s.engRef.CompareAndSwap(nil, &engineRef{eng}) {
		return errors.New("server: the engine is already set")
	}
	return nil
}

// engine returns the engine, nil while the model loads.
func (s *Server) engine() Engine {
	if r := s.engRef.Load(); r != nil {
		return r.Engine
	}
	return nil
}

// Handler returns the server's HTTP handler (for tests and embedding).
func (s *Server) Handler() http.Handler { return s.handler }

// Serve accepts connections on ln until Shutdown; it then returns nil. At most
// Config.MaxConnections are open at once. It warns when ln listens beyond the loopback
// interface without an API key.
func (s *Server) Serve(ln net.Listener) error {
	addr := ln.Addr().String()
	s.log.Info("serving", "addr", addr, "model", s.cfg.Model)
	if s.cfg.APIKey == "" && !loopback(ln.Addr()) {
		s.log.Warn("listening beyond the loopback interface without an API key: anyone who can reach this address can use the model; set --api-key or LOOM_API_KEY", "addr", addr)
	}
	if s.cfg.MaxConnections > 0 {
		ln = newLimitListener(ln, s.cfg.MaxConnections, s.log)
	}
	if err := s.http.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("server: %w", err)
	}
	return nil
}

// loopback reports whether addr is a loopback address (an unspecified one, 0.0.0.0 or ::,
// is every interface, so not).
func loopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return addr.Network() == "unix"
	}
	return tcp.IP.IsLoopback()
}

// Shutdown stops accepting connections, waits for the requests in flight to finish, then
// shuts the engine down. When ctx ends first the shutdown is forced: every open stream ends
// with an error event and [DONE] (a request not yet answered gets 503), the connections are
// closed, and Shutdown returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closing.Store(true)
	s.log.Info("shutting down: draining requests in flight")
	err := s.http.Shutdown(ctx)
	if err != nil {
		s.log.Warn("drain timed out; ending the open streams and closing the connections", "err", err)
		s.force()
		// The handlers write their last events as their generations end; give them a moment.
		for deadline := time.Now().Add(forceGrace); s.active.Load() > 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		_ = s.http.Close()
		err = fmt.Errorf("server: shutdown: %w", err)
	}
	eng := s.engine()
	if eng == nil {
		return err
	}
	// The engine gets its own short grace: after a forced close its requests are being
	// cancelled and end promptly.
	engCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if e := eng.Shutdown(engCtx); e != nil {
		err = errors.Join(err, fmt.Errorf("server: engine shutdown: %w", e))
	}
	return err
}

// apiHandler handles one API endpoint; it writes its own success response and returns an
// error for the caller to answer.
type apiHandler func(w http.ResponseWriter, r *http.Request) error

// api wraps h with error answers and request metrics.
func (s *Server) api(endpoint string, h apiHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.active.Add(1)
		defer s.active.Add(-1)
		sw := &statusWriter{ResponseWriter: w}
		start := time.Now()
		err := h(sw, r)
		switch {
		case errors.Is(err, errClientGone):
			sw.status = 499 // nginx's "client closed request", for metrics and logs only
		case err != nil && sw.status == 0:
			s.writeError(sw, r, err)
		case err != nil:
			s.log.Warn("request failed after its response started", "path", r.URL.Path, "err", err)
		}
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		s.metrics.countRequest(endpoint, sw.status)
		s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "status", sw.status, "time", time.Since(start).Round(time.Microsecond))
	})
}

// statusWriter remembers the status code of a response.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (to flush).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, modelList{Object: "list", Data: []modelCard{{
		ID: s.cfg.Model, Object: "model", Created: time.Now().Unix(), OwnedBy: "loom", MaxModelLen: s.cfg.ContextLength,
	}}})
	return nil
}

func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if id != s.cfg.Model {
		e := badParam("model", "the model %q does not exist; this server serves %q", id, s.cfg.Model)
		e.Status, e.Code = http.StatusNotFound, "model_not_found"
		return e
	}
	writeJSON(w, http.StatusOK, modelCard{ID: s.cfg.Model, Object: "model", Created: time.Now().Unix(), OwnedBy: "loom", MaxModelLen: s.cfg.ContextLength})
	return nil
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	switch {
	case s.closing.Load():
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "shutting down"})
		return
	case s.engine() == nil:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "loading"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// newID returns a random request id with the given prefix.
func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
