package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
)

// Error types, as the OpenAI API spells them.
const (
	typeInvalidRequest = "invalid_request_error"
	typeNotFound       = "not_found_error"
	typeRateLimit      = "rate_limit_exceeded"
	typeServer         = "server_error"
	typeUnavailable    = "service_unavailable"
)

// APIError is an error answered as an OpenAI-style error object:
//
//	{"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}
type APIError struct {
	// Status is the HTTP status code.
	Status int `json:"-"`
	// Message says what is wrong, for people.
	Message string `json:"message"`
	// Type is the error's class (invalid_request_error, rate_limit_exceeded, server_error ...).
	Type string `json:"type"`
	// Param names the request parameter at fault, as the API spells it; empty when none.
	Param string `json:"param"`
	// Code is a machine-readable code (such as context_length_exceeded); empty when none.
	Code string `json:"code"`
}

// Error implements error.
func (e *APIError) Error() string {
	if e.Param != "" {
		return fmt.Sprintf("%d %s (param %s): %s", e.Status, e.Type, e.Param, e.Message)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message)
}

// MarshalJSON writes param and code as null when they are empty, as OpenAI does.
func (e *APIError) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}{e.Message, e.Type, nullable(e.Param), nullable(e.Code)})
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// badParam returns a 400 invalid_request_error about param.
func badParam(param, format string, args ...any) *APIError {
	return &APIError{Status: http.StatusBadRequest, Type: typeInvalidRequest, Param: param, Message: fmt.Sprintf(format, args...)}
}

// errorBody is the JSON body of an error response.
type errorBody struct {
	Error *APIError `json:"error"`
}

// writeError answers err as an OpenAI error object; errors that are not an *APIError are
// internal server errors, logged with their request.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var apiErr *APIError
	if !errors.As(err, &apiErr) {
		s.log.Error("request failed", "path", r.URL.Path, "err", err)
		apiErr = &APIError{Status: http.StatusInternalServerError, Type: typeServer, Message: err.Error()}
	}
	if apiErr.Status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, apiErr.Status, errorBody{apiErr})
}

// writeJSON answers v as JSON with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		slog.Error("encode response", "err", err)
		http.Error(w, `{"error":{"message":"internal error encoding the response","type":"server_error","param":null,"code":null}}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}
