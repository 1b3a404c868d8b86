package server

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"
)

// sseData reads an event stream to its end and returns the data of each event.
func sseData(t *testing.T, body io.Reader) []string {
	t.Helper()
	raw, err := io.ReadAll(body)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range strings.Split(strings.TrimSpace(string(raw)), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("event %q is not one data line; stream:\n%s", ev, raw)
		}
		out = append(out, data)
	}
	return out
}

// streamChunk is what the tests read of a completion or chat chunk, or of an error event.
type streamChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Error *APIError `json:"error"`
}

// TestGenerationFailsMidStream: a generation that fails after its stream started (an engine
// step failing) ends the stream with an error event that names the cause, then [DONE], and
// no finish_reason; the OpenAI client reports the error. A request that does not stream gets
// a 500 with the same message. The failures are counted as such, and the server goes on
// serving.
func TestGenerationFailsMidStream(t *testing.T) {
	const after = 3 // tokens streamed before the failure
	env := newEnv(t, "tiny-llama", func(_ *Config, e *fakeEngine) {
		e.failErr, e.failAfter = errors.New("step: device on fire"), after
	})
	const wantMsg = "generate: step: device on fire"
	wantText := env.want(t, after)
	for _, tc := range []struct {
		name, path, body string
	}{
		{"completions", "/v1/completions", `{"model": "tiny", "prompt": "hi", "max_tokens": 10, "ignore_eos": true, "stream": true}`},
		{"chat", "/v1/chat/completions", `{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "ignore_eos": true, "stream": true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Post(env.base+tc.path, "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("status %d, content type %q: want a 200 event stream (the failure comes after it started)", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			events := sseData(t, resp.Body)
			if len(events) < 2 || events[len(events)-1] != "[DONE]" {
				t.Fatalf("events %q: want them to end with an error event and [DONE]", events)
			}
			var last streamChunk
			if err := json.Unmarshal([]byte(events[len(events)-2]), &last); err != nil {
				t.Fatalf("event before [DONE] %q: %v", events[len(events)-2], err)
			}
			if last.Error == nil || last.Error.Message != wantMsg || last.Error.Type != typeServer {
				t.Errorf("event before [DONE] %q: want an error of type %s with message %q", events[len(events)-2], typeServer, wantMsg)
			}
			text := ""
			for _, ev := range events[:len(events)-2] {
				var c streamChunk
				if err := json.Unmarshal([]byte(ev), &c); err != nil {
					t.Fatalf("event %q: %v", ev, err)
				}
				if c.Error != nil {
					t.Errorf("event %q: an error before the last event", ev)
				}
				for _, ch := range c.Choices {
					text += ch.Text + ch.Delta.Content
					if ch.FinishReason != nil {
						t.Errorf("event %q: a finish_reason in a stream that failed", ev)
					}
				}
			}
			if text != wantText {
				t.Errorf("streamed text %q before the failure, want the %d tokens' %q", text, after, wantText)
			}
		})
	}

	// The OpenAI client reports the error event as the stream's error.
	st := env.client.Chat.Completions.NewStreaming(ctxT(t), openai.ChatCompletionNewParams{
		Model: "tiny", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(10),
	})
	chunks := 0
	for st.Next() {
		chunks++
	}
	var se *ssestream.StreamError
	if err := st.Err(); !errors.As(err, &se) || !strings.Contains(err.Error(), wantMsg) {
		t.Errorf("client stream error %v (%T) after %d chunks, want a stream error with %q", err, err, chunks, wantMsg)
	}

	// Without streaming, the failure is a 500 with the same message.
	_, err := env.client.Completions.New(ctxT(t), openai.CompletionNewParams{
		Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(10),
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusInternalServerError || !strings.Contains(apiErr.Message, wantMsg) {
		t.Errorf("request without streaming: %v, want a 500 with %q", err, wantMsg)
	}

	if n := env.metric(t, `loom_request_finished_total{finish_reason="error"}`); n != 4 {
		t.Errorf("%g requests counted as failed, want 4", n)
	}
	eventually(t, "no request in flight", func() bool { return env.metric(t, "loom_requests_in_flight") == 0 })

	// The server goes on serving.
	env.eng.mu.Lock()
	env.eng.failErr = nil
	env.eng.mu.Unlock()
	c, err := env.client.Completions.New(ctxT(t), openai.CompletionNewParams{
		Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(5),
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := env.want(t, 5); c.Choices[0].Text != want {
		t.Errorf("after the failures: %q, want %q", c.Choices[0].Text, want)
	}
}
