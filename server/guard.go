package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// This file holds what stands between a connection and the API: the connection cap, the
// per-write deadlines, CORS, the API key, and the 503 while the model loads.

// guard wraps the routes with, in order: per-write deadlines, CORS (answering preflight
// requests), the API key (every route but /health), and 503 until the engine is ready
// (every route but /health and /metrics).
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A keep-alive connection keeps the write deadline of its last request's last write.
		rc := http.NewResponseController(w)
		_ = rc.SetWriteDeadline(time.Time{})
		if s.cfg.WriteTimeout > 0 {
			w = &deadlineWriter{ResponseWriter: w, rc: rc, d: s.cfg.WriteTimeout}
		}
		if s.cors(w, r) {
			return
		}
		if r.URL.Path != "/health" {
			if err := s.checkAPIKey(r); err != nil {
				w.Header().Set("WWW-Authenticate", `Bearer realm="loom"`)
				s.metrics.countRequest("auth", err.Status)
				writeJSON(w, err.Status, errorBody{err})
				return
			}
			if s.engine() == nil && r.URL.Path != "/metrics" {
				writeJSON(w, http.StatusServiceUnavailable, errorBody{&APIError{Status: http.StatusServiceUnavailable,
					Type: typeUnavailable, Code: "model_loading", Message: "the model is still loading; retry when GET /health answers 200"}})
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineWriter sets the connection's write deadline before each write: a client that
// takes no data for d is dropped, however long its response (a stream) lasts.
type deadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (w *deadlineWriter) Write(b []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// checkAPIKey checks the bearer token against Config.APIKey, in constant time (the hashes
// are compared, so that not even the key's length shows).
func (s *Server) checkAPIKey(r *http.Request) *APIError {
	if s.cfg.APIKey == "" {
		return nil
	}
	unauthorized := func(msg string) *APIError {
		return &APIError{Status: http.StatusUnauthorized, Type: typeInvalidRequest, Code: "invalid_api_key", Message: msg}
	}
	auth := r.Header.Get("Authorization")
	if auth == "" {
		return unauthorized("missing API key: send it as the header Authorization: Bearer KEY")
	}
	scheme, token, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return unauthorized("the Authorization header must be Bearer KEY")
	}
	got, want := sha256.Sum256([]byte(strings.TrimSpace(token))), sha256.Sum256([]byte(s.cfg.APIKey))
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		return unauthorized("incorrect API key provided")
	}
	return nil
}

// cors sets the CORS headers of a request from an allowed origin and answers a preflight
// request; it reports whether the request is answered. Without Config.AllowedOrigins it
// does nothing (a preflight then gets the route's 405).
func (s *Server) cors(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if len(s.cfg.AllowedOrigins) == 0 || origin == "" {
		return false
	}
	h := w.Header()
	h.Add("Vary", "Origin")
	anyOrigin := slices.Contains(s.cfg.AllowedOrigins, "*")
	if !anyOrigin && !slices.Contains(s.cfg.AllowedOrigins, origin) {
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			writeJSON(w, http.StatusForbidden, errorBody{&APIError{Status: http.StatusForbidden, Type: typeInvalidRequest,
				Message: fmt.Sprintf("origin %q is not allowed (--allowed-origins)", origin)}})
			return true
		}
		return false // no CORS headers: the browser keeps the answer from the page
	}
	if anyOrigin {
		h.Set("Access-Control-Allow-Origin", "*")
	} else {
		h.Set("Access-Control-Allow-Origin", origin)
	}
	if r.Method != http.MethodOptions || r.Header.Get("Access-Control-Request-Method") == "" {
		return false
	}
	h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
	allowHeaders := r.Header.Get("Access-Control-Request-Headers")
	if allowHeaders == "" {
		allowHeaders = "Authorization, Content-Type"
	}
	h.Set("Access-Control-Allow-Headers", allowHeaders)
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
	return true
}

// limitListener accepts at most n connections at once. A connection past the cap is
// answered 503 and closed, rather than left waiting unanswered in the backlog.
type limitListener struct {
	net.Listener
	sem chan struct{}
	log *slog.Logger
}

func newLimitListener(ln net.Listener, n int, log *slog.Logger) *limitListener {
	return &limitListener{Listener: ln, sem: make(chan struct{}, n), log: log}
}

// overCapacity is what a connection past the cap reads.
var overCapacity = func() string {
	body := `{"error":{"message":"the server has too many open connections; retry later","type":"service_unavailable","param":null,"code":"too_many_connections"}}` + "\n"
	return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
}()

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.sem <- struct{}{}:
			return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
		default:
		}
		l.log.Warn("connection refused: too many open connections", "remote", c.RemoteAddr().String(), "max", cap(l.sem))
		go func() {
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, _ = c.Write([]byte(overCapacity))
			_ = c.Close()
		}()
	}
}

// limitConn gives its slot back when it closes.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// readBody reads a request body of at most limit bytes, within Config.ReadTimeout. A body
// that says it is larger is refused before it is read; a known length is read into a
// buffer of that size (no growing copies).
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	limit := s.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		return nil, tooLarge(r.ContentLength, limit)
	}
	rc := http.NewResponseController(w)
	if s.cfg.ReadTimeout > 0 {
		_ = rc.SetReadDeadline(time.Now().Add(s.cfg.ReadTimeout))
	}
	body := http.MaxBytesReader(w, r.Body, limit)
	var (
		data []byte
		err  error
	)
	if r.ContentLength >= 0 {
		data = make([]byte, r.ContentLength)
		_, err = io.ReadFull(body, data)
	} else {
		data, err = io.ReadAll(body)
	}
	var maxErr *http.MaxBytesError
	var netErr net.Error
	switch {
	case errors.As(err, &maxErr):
		return nil, tooLarge(-1, limit)
	case errors.As(err, &netErr) && netErr.Timeout():
		w.Header().Set("Connection", "close")
		return nil, &APIError{Status: http.StatusRequestTimeout, Type: typeInvalidRequest, Code: "request_timeout",
			Message: fmt.Sprintf("the request body did not arrive within %v", s.cfg.ReadTimeout)}
	case err != nil:
		return nil, badParam("", "cannot read the request body: %v", err)
	}
	// Once read, the connection waits without a deadline: the request may stream for long,
	// and net/http reads on to see the client go. (A body that timed out keeps its expired
	// deadline, so that net/http does not wait for the rest of it.)
	_ = rc.SetReadDeadline(time.Time{})
	return data, nil
}

// tooLarge is the 413 of a body over limit bytes (n: its length when known, else -1).
func tooLarge(n, limit int64) *APIError {
	msg := fmt.Sprintf("request body is larger than %d bytes (--max-request-bytes)", limit)
	if n >= 0 {
		msg = fmt.Sprintf("request body is %d bytes, more than the %d allowed (--max-request-bytes)", n, limit)
	}
	return &APIError{Status: http.StatusRequestEntityTooLarge, Type: typeInvalidRequest, Code: "request_too_large", Message: msg}
}
