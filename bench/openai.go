package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// OpenAI is a Target that streams from an OpenAI-compatible server's /v1/completions (or,
// with Chat, /v1/chat/completions), asking for usage in the stream.
type OpenAI struct {
	// BaseURL is the API root, such as http://127.0.0.1:8000/v1.
	BaseURL string
	// Model is the model name sent with each request.
	Model string
	// Chat sends requests to /v1/chat/completions (text and token-id prompts become one
	// user message; token ids are not allowed there).
	Chat bool
	// IgnoreEOS asks the server to generate max_tokens whatever comes (vLLM's and Loom's
	// ignore_eos extension), so output lengths are as asked.
	IgnoreEOS bool
	// Temperature is sent with each request.
	Temperature float64
	// APIKey, when set, is sent as a bearer token.
	APIKey string
	// Client sends the requests; http.DefaultClient when nil.
	Client *http.Client
}

// Name implements Target.
func (o *OpenAI) Name() string {
	ep := "completions"
	if o.Chat {
		ep = "chat/completions"
	}
	return fmt.Sprintf("%s/%s (model %s)", strings.TrimRight(o.BaseURL, "/"), ep, o.Model)
}

// Models lists the models a server serves (GET /v1/models).
func Models(ctx context.Context, client *http.Client, baseURL string) ([]string, error) {
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(baseURL, "/")+"/models", nil)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("bench: list models: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("bench: list models: %s", statusError(resp))
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, fmt.Errorf("bench: list models: %w", err)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	return ids, nil
}

// streamChunk is the part of a completion or chat completion chunk that matters here.
type streamChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// Do implements Target.
func (o *OpenAI) Do(ctx context.Context, r Request) (s Sample) {
	body := map[string]any{
		"model":          o.Model,
		"max_tokens":     r.MaxTokens,
		"stream":         true,
		"stream_options": map[string]bool{"include_usage": true},
		"temperature":    o.Temperature,
	}
	if o.IgnoreEOS {
		body["ignore_eos"] = true
	}
	path := "/completions"
	switch {
	case o.Chat:
		path = "/chat/completions"
		msgs := r.Messages
		if msgs == nil {
			if r.PromptIDs != nil {
				s.Err = errors.New("token-id prompts cannot be sent to the chat endpoint")
				return s
			}
			msgs = []Message{{Role: "user", Content: r.Prompt}}
		}
		body["messages"] = msgs
	case r.Messages != nil:
		s.Err = errors.New("chat messages need the chat endpoint")
		return s
	case r.PromptIDs != nil:
		body["prompt"] = r.PromptIDs
	default:
		body["prompt"] = r.Prompt
	}
	data, err := json.Marshal(body)
	if err != nil {
		s.Err = err
		return s
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(o.BaseURL, "/")+path, bytes.NewReader(data))
	if err != nil {
		s.Err = err
		return s
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+o.APIKey)
	}
	client := o.Client
	if client == nil {
		client = http.DefaultClient
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		s.Err = err
		return s
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.Err = errors.New(statusError(resp))
		return s
	}
	pieces := 0
	rd := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := rd.ReadBytes('\n')
		if len(line) > 0 {
			payload, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:"))
			if ok {
				payload = bytes.TrimSpace(payload)
				if bytes.Equal(payload, []byte("[DONE]")) {
					break
				}
				var c streamChunk
				if err := json.Unmarshal(payload, &c); err != nil {
					s.Err = fmt.Errorf("bad event %q: %w", truncate(string(payload), 200), err)
					return s
				}
				if len(c.Error) > 0 && string(c.Error) != "null" {
					s.Err = fmt.Errorf("error event: %s", truncate(string(c.Error), 300))
					return s
				}
				if c.Usage != nil {
					s.PromptTokens, s.OutputTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
				}
				// A chunk with text, or an unfinished choice (a token whose text is held
				// back), is a token's arrival; a bare closing chunk or the chat stream's
				// opening chunk (the role alone) is not.
				if ch := c.Choices; len(ch) > 0 && (ch[0].Text+ch[0].Delta.Content != "" || ch[0].FinishReason == nil && ch[0].Delta.Role == "") {
					s.Arrived(start, time.Now())
					pieces++
				}
			}
		}
		if errors.Is(err, io.EOF) {
			s.Err = errors.New("the stream ended without [DONE]")
			return s
		}
		if err != nil {
			s.Err = fmt.Errorf("read stream: %w", err)
			return s
		}
	}
	s.Latency = time.Since(start)
	if s.OutputTokens == 0 {
		s.OutputTokens = pieces // no usage: count streamed pieces
	}
	if pieces == 0 {
		s.TTFT = s.Latency
	}
	return s
}

// statusError describes a failed HTTP response, with the start of its body.
func statusError(resp *http.Response) string {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
