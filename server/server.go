// Package server serves a Loom engine over HTTP with the OpenAI API: POST /v1/completions
// and POST /v1/chat/completions (streaming as server-sent events or not), GET /v1/models,
// GET /health and GET /metrics (Prometheus).
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
	ContextLength int
	// VocabSize bounds token ids in requests; the tokenizer's vocabulary size when 0.
	VocabSize int
	// Defaults are the sampling parameters of a request that sets none (OpenAI's default is
	// temperature 1).
	Defaults sample.Params
	// DefaultMaxTokens is max_tokens of a completion request that gives none (OpenAI: 16);
	// chat requests default to the rest of the context.
	DefaultMaxTokens int
	// MaxBodyBytes limits a request body (default 16 MiB).
	MaxBodyBytes int64
	// Registry receives the server's metrics; a new registry when nil. /metrics serves it.
	Registry *prometheus.Registry
	// Logger logs requests and errors; slog.Default() when nil.
	Logger *slog.Logger
}

// Server is an OpenAI-compatible HTTP server in front of an Engine.
type Server struct {
	cfg     Config
	eng     Engine
	log     *slog.Logger
	vocab   int
	metrics *metrics
	handler http.Handler
	http    *http.Server
	closing atomic.Bool
}

// New returns a server for eng.
func New(eng Engine, cfg Config) (*Server, error) {
	if eng == nil {
		return nil, errors.New("server: no engine")
	}
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
		cfg.MaxBodyBytes = 16 << 20
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, eng: eng, log: cfg.Logger, vocab: cfg.VocabSize}
	if s.vocab <= 0 {
		s.vocab = cfg.Tokenizer.VocabSize()
	}
	var err error
	if s.metrics, err = newMetrics(cfg.Registry, eng); err != nil {
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
		{"GET", "/health", http.HandlerFunc(s.handleHealth)},
		{"GET", "/metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{})},
	}
	allow := map[string]string{} // path -> its Allow header
	for _, rt := range routes {
		mux.Handle(rt.method+" "+rt.path, rt.h)
		allow[rt.path] = rt.method
		if rt.method == "GET" {
			allow[rt.path] = "GET, HEAD" // a GET pattern serves HEAD too
		}
	}
	// The catch-all pattern hides the mux's own 405s, so answer a known path with the wrong
	// method here: 405 with an Allow header, as HTTP asks, rather than 404.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if methods, ok := allow[r.URL.Path]; ok {
			w.Header().Set("Allow", methods)
			writeJSON(w, http.StatusMethodNotAllowed, errorBody{&APIError{Status: http.StatusMethodNotAllowed, Type: typeInvalidRequest,
				Message: fmt.Sprintf("method %s is not allowed for %s; use %s", r.Method, r.URL.Path, methods)}})
			return
		}
		writeJSON(w, http.StatusNotFound, errorBody{&APIError{Status: http.StatusNotFound, Type: typeNotFound,
			Message: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)}})
	})
	s.handler = mux
	s.http = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
		// Request contexts come from context.Background: a signal that stops the
		// process must not cancel the requests it is draining.
	}
	return s, nil
}

// Handler returns the server's HTTP handler (for tests and embedding).
func (s *Server) Handler() http.Handler { return s.handler }

// Serve accepts connections on ln until Shutdown; it then returns nil.
func (s *Server) Serve(ln net.Listener) error {
	s.log.Info("serving", "addr", ln.Addr().String(), "model", s.cfg.Model)
	if err := s.http.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("server: %w", err)
	}
	return nil
}

// Shutdown stops accepting connections, waits for the requests in flight to finish, then
// shuts the engine down. When ctx ends first, the remaining requests are cancelled (their
// connections closed) and Shutdown returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closing.Store(true)
	s.log.Info("shutting down: draining requests in flight")
	err := s.http.Shutdown(ctx)
	if err != nil {
		s.log.Warn("drain timed out; closing the remaining connections", "err", err)
		_ = s.http.Close()
		err = fmt.Errorf("server: shutdown: %w", err)
	}
	// The engine gets its own short grace: after a forced close its requests are being
	// cancelled and end promptly.
	engCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if e := s.eng.Shutdown(engCtx); e != nil {
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

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	if s.closing.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "shutting down"})
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
