package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// sseWriter writes server-sent events: one "data: {json}" event per chunk, then "data: [DONE]".
type sseWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// startSSE sends the headers of an event stream.
func startSSE(w http.ResponseWriter) (*sseWriter, error) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s := &sseWriter{w: w, rc: http.NewResponseController(w)}
	if err := s.rc.Flush(); err != nil {
		return nil, fmt.Errorf("%w: flush: %v", errClientGone, err)
	}
	return s, nil
}

// send writes v as one event and flushes it to the client.
func (s *sseWriter) send(v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	return s.raw(data)
}

// done ends the stream.
func (s *sseWriter) done() error { return s.raw([]byte("[DONE]")) }

func (s *sseWriter) raw(data []byte) error {
	buf := make([]byte, 0, len(data)+8)
	buf = append(append(append(buf, "data: "...), data...), "\n\n"...)
	if _, err := s.w.Write(buf); err != nil {
		return fmt.Errorf("%w: %v", errClientGone, err)
	}
	if err := s.rc.Flush(); err != nil {
		return fmt.Errorf("%w: %v", errClientGone, err)
	}
	return nil
}

// fail ends a stream whose generation failed after it started: an error event (err's own
// when it is an *APIError, such as errShutdown), then [DONE].
func (s *sseWriter) fail(err error) {
	var apiErr *APIError
	if !errors.As(err, &apiErr) {
		apiErr = &APIError{Status: http.StatusInternalServerError, Type: typeServer, Message: err.Error()}
	}
	_ = s.send(errorBody{apiErr})
	_ = s.done()
}
