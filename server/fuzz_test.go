package server

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loom-ml/loom/chattemplate"
	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/tokenizer"
)

// Fuzz targets of the request bodies of the OpenAI-compatible endpoints. Each POSTs an
// arbitrary body to the server's handler (through httptest, no network) in front of the fake
// engine, with tiny-llama's tokenizer and chat template, and checks the answer: a bad body is
// a 4xx with an OpenAI error object that says what is wrong, never a 5xx or a panic; a good
// one is a 200 whose body is a well-formed completion, or a well-formed event stream.

// fuzzServer is a server for the fuzz targets: the fake engine answers at once, and the
// context is short so that no request generates for long. The returned function serves one
// body.
func fuzzServer(f *testing.F) func(path string, body []byte) *httptest.ResponseRecorder {
	path := filepath.Join("..", "testdata", "tiny-llama")
	tok, err := tokenizer.LoadDir(path)
	if err != nil {
		f.Fatal(err)
	}
	tmpl, err := chattemplate.Load(path)
	if err != nil {
		f.Fatal(err)
	}
	ids, err := tok.Encode(reply, false)
	if err != nil {
		f.Fatal(err)
	}
	eos, _ := tok.EOS()
	eng := &fakeEngine{script: func(engine.Request) []int { return ids }, eos: eos, blockSize: 16, blocks: 1 << 20}
	srv, err := New(eng, Config{Model: "tiny", Tokenizer: tok, ChatTemplate: tmpl, ContextLength: 128,
		MaxBodyBytes: 1 << 16, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	h := srv.Handler()
	return func(path string, body []byte) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
		eng.mu.Lock()
		eng.requests = nil // the fake engine's record of requests would grow without end
		eng.mu.Unlock()
		return rec
	}
}

// checkAnswer asserts the properties of the answer to one request body: an OpenAI error
// object with a 4xx; or a 200 with a completion of the given object type, its usage adding
// up within the context and max_tokens; or a 200 event stream of chunks of chunkObject, one
// with a finish_reason, ended by [DONE].
func checkAnswer(t *testing.T, body []byte, rec *httptest.ResponseRecorder, object, chunkObject string) {
	t.Helper()
	res := rec.Result()
	out := rec.Body.Bytes()
	ctype := res.Header.Get("Content-Type")
	switch {
	case res.StatusCode >= 400 && res.StatusCode < 500:
		var e struct {
			Error *APIError `json:"error"`
		}
		if !strings.HasPrefix(ctype, "application/json") || json.Unmarshal(out, &e) != nil || e.Error == nil ||
			e.Error.Message == "" || e.Error.Type == "" {
			t.Fatalf("body %q: %d answer %q (%s) is not an OpenAI error object", body, res.StatusCode, out, ctype)
		}
	case res.StatusCode != http.StatusOK:
		t.Fatalf("body %q: status %d: %s", body, res.StatusCode, out)
	case strings.HasPrefix(ctype, "text/event-stream"):
		events := strings.Split(string(out), "\n\n")
		if len(events) < 3 || events[len(events)-1] != "" || events[len(events)-2] != "data: [DONE]" {
			t.Fatalf("body %q: stream %q does not end with [DONE]", body, out)
		}
		finished := false
		for _, ev := range events[:len(events)-2] {
			data, ok := strings.CutPrefix(ev, "data: ")
			var chunk struct {
				Object  string            `json:"object"`
				Choices []json.RawMessage `json:"choices"`
				Error   *APIError         `json:"error"`
				Usage   *usage            `json:"usage"`
			}
			if !ok || json.Unmarshal([]byte(data), &chunk) != nil || chunk.Error != nil || chunk.Object != chunkObject {
				t.Fatalf("body %q: bad event %q in stream", body, ev)
			}
			if bytes.Contains([]byte(data), []byte(`"finish_reason":"`)) {
				finished = true
			}
		}
		if !finished {
			t.Fatalf("body %q: stream %q has no finish_reason", body, out)
		}
	default:
		var c struct {
			Object  string `json:"object"`
			Choices []struct {
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *usage `json:"usage"`
		}
		// n choices (1 unless the body says otherwise), each within the context and
		// max_tokens; usage counts the prompt once.
		var req struct {
			MaxTokens *int `json:"max_tokens"`
			N         *int `json:"n"`
		}
		n := 1
		if json.Unmarshal(body, &req) == nil && req.N != nil {
			n = *req.N
		}
		if !strings.HasPrefix(ctype, "application/json") || json.Unmarshal(out, &c) != nil || c.Object != object ||
			len(c.Choices) != n || c.Usage == nil {
			t.Fatalf("body %q: 200 answer %q (%s) is not a %s with %d choices", body, out, ctype, object, n)
		}
		for _, ch := range c.Choices {
			if ch.FinishReason == nil || *ch.FinishReason != "stop" && *ch.FinishReason != "length" {
				t.Fatalf("body %q: finish_reason %v", body, ch.FinishReason)
			}
		}
		u := c.Usage
		if u.PromptTokens <= 0 || u.CompletionTokens < 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens ||
			u.PromptTokens+u.CompletionTokens/n > 128 {
			t.Fatalf("body %q: usage %+v (context 128, %d choices)", body, *u, n)
		}
		if req.MaxTokens != nil && u.CompletionTokens > n**req.MaxTokens {
			t.Fatalf("body %q: %d tokens generated, max_tokens %d", body, u.CompletionTokens, *req.MaxTokens)
		}
	}
}

// commonBodies are sampling parameters both endpoints take, in and out of range, each to be
// completed with the endpoint's prompt.
var commonBodies = []string{
	`"max_tokens": 5`, `"max_tokens": 0`, `"max_tokens": -1`, `"max_tokens": 1e9`, `"max_tokens": 2.5`, `"max_tokens": "5"`,
	`"max_completion_tokens": 3, "max_tokens": 4`, `"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7`,
	`"temperature": -1`, `"temperature": 1e400`, `"top_p": 0`, `"top_k": -2`, `"n": 2`, `"n": 1`,
	`"stream": true, "max_tokens": 4`, `"stream": true, "stream_options": {"include_usage": true}, "max_tokens": 3`,
	`"stream": "yes"`, `"stop": ["world", ""], "max_tokens": 9`, `"stop": "Loom"`, `"stop": [1, 2]`, `"stop": null`,
	`"stop_token_ids": [0, 511, 100000], "ignore_eos": true, "max_tokens": 3`, `"logit_bias": {"5": 100, "x": 1}`,
	`"presence_penalty": 3, "frequency_penalty": -3, "repetition_penalty": 0`, `"skip_special_tokens": false, "max_tokens": 2`,
	`"model": "other"`, `"user": {"id": 1}`, `"unknown": [1, {"x": null}]`,
}

// FuzzCompletionsBody POSTs arbitrary bodies to /v1/completions (see checkAnswer).
func FuzzCompletionsBody(f *testing.F) {
	for _, s := range []string{``, `null`, `[]`, `{`, `{"prompt": "Hi"} {}`, `{"prompt": "Hi"}x`, `"prompt"`,
		`{"prompt": "Hi", "echo": true, "max_tokens": 2}`, `{"prompt": [1, 2, 3], "logprobs": 2, "max_tokens": 2}`,
		`{"prompt": [[1, 2], [3]]}`, `{"prompt": ["a", "b"]}`, `{"prompt": [-1]}`, `{"prompt": [512000]}`, `{"prompt": []}`,
		`{"prompt": ""}`, `{"prompt": null}`, `{"prompt": 5}`, `{"prompt": "Hi", "logprobs": 6}`, `{"prompt": "Hi", "echo": true, "logprobs": 1}`,
		`{"prompt": "Hi", "suffix": "x"}`, `{"prompt": "Hi", "best_of": 2}`, `{"prompt": "` + strings.Repeat("word ", 200) + `"}`,
		`{"prompt": "\u0000\ud800 <|begin_of_text|>\xff"}`, `{"PROMPT": "case"}`,
	} {
		f.Add([]byte(s))
	}
	for _, s := range commonBodies {
		f.Add([]byte(`{"prompt": "The quick brown fox", ` + s + `}`))
	}
	serve := fuzzServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := serve("/v1/completions", body)
		checkAnswer(t, body, rec, "text_completion", "text_completion")
	})
}

// FuzzChatBody POSTs arbitrary bodies to /v1/chat/completions (see checkAnswer).
func FuzzChatBody(f *testing.F) {
	for _, s := range []string{``, `null`, `{}`, `{"messages": []}`, `{"messages": {}}`, `{"messages": [null]}`,
		`{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}`,
		`{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}]}`,
		`{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}`,
		`{"messages": [{"role": "user"}]}`, `{"messages": [{"content": "no role"}]}`, `{"messages": [{"role": 1, "content": "x"}]}`,
		`{"messages": [{"role": "user", "content": null, "name": "n", "tool_calls": []}]}`,
		`{"messages": [{"role": "user", "content": "Hi"}], "logprobs": true, "top_logprobs": 3, "max_tokens": 2}`,
		`{"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 3}`, `{"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 21, "logprobs": true}`,
		`{"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function"}]}`, `{"messages": [{"role": "user", "content": "Hi"}], "tool_choice": "none"}`,
		`{"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": "json_object"}}`,
		`{"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"messages": 5, "bos_token": null}}`,
		`{"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"add_generation_prompt": "x"}, "add_generation_prompt": false}`,
		`{"messages": [{"role": "user", "content": "{{ raise_exception('boom') }}"}]}`,
		`{"messages": [{"role": "user", "content": "` + strings.Repeat("many words ", 100) + `"}]}`,
	} {
		f.Add([]byte(s))
	}
	for _, s := range commonBodies {
		f.Add([]byte(`{"messages": [{"role": "user", "content": "Hi"}], ` + s + `}`))
	}
	serve := fuzzServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := serve("/v1/chat/completions", body)
		checkAnswer(t, body, rec, "chat.completion", "chat.completion.chunk")
	})
}
