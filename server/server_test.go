package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/loom-ml/loom/chattemplate"
	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/tokenizer"
)

// reply is what the fake engine generates by default, over and over.
const reply = "Hello world, this is Loom speaking. The end is near."

// testEnv is a server on a loopback port in front of a fake engine.
type testEnv struct {
	srv    *Server
	eng    *fakeEngine
	tok    *tokenizer.Tokenizer
	tmpl   *chattemplate.Template
	base   string
	client openai.Client
}

// newEnv starts a server for the fixture in testdata/dir; edit may change the engine and
// the configuration first.
func newEnv(t *testing.T, dir string, edit func(*Config, *fakeEngine)) *testEnv {
	t.Helper()
	path := filepath.Join("..", "testdata", dir)
	tok, err := tokenizer.LoadDir(path)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chattemplate.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok.Encode(reply, false)
	if err != nil {
		t.Fatal(err)
	}
	eos, _ := tok.EOS()
	eng := &fakeEngine{script: func(engine.Request) []int { return ids }, eos: eos, blockSize: 16, blocks: 1024, delay: time.Millisecond}
	cfg := Config{Model: "tiny", Tokenizer: tok, ChatTemplate: tmpl, ContextLength: 256, Logger: slog.New(slog.DiscardHandler)}
	if edit != nil {
		edit(&cfg, eng)
	}
	srv, err := New(eng, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	base := "http://" + ln.Addr().String()
	client := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	return &testEnv{srv: srv, eng: eng, tok: tok, tmpl: tmpl, base: base, client: client}
}

// want returns the text of the first n tokens of the fake engine's script.
func (e *testEnv) want(t *testing.T, n int) string {
	t.Helper()
	ids := e.eng.script(engine.Request{})
	var all []int
	for len(all) < n {
		all = append(all, ids...)
	}
	text, err := e.tok.Decode(all[:n], true)
	if err != nil {
		t.Fatal(err)
	}
	return text
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestCompletions(t *testing.T) {
	env := newEnv(t, "tiny-llama", nil)
	prompt := "The quick brown fox"
	promptIDs, err := env.tok.Encode(prompt, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		maxTokens int64
		stream    bool
	}{
		{"plain", 5, false},
		{"plain long", 40, false},
		{"stream", 5, true},
		{"stream long", 40, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			params := openai.CompletionNewParams{
				Model:       "tiny",
				Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
				MaxTokens:   openai.Int(tc.maxTokens),
				Temperature: openai.Float(0),
			}
			var text, finish string
			var u openai.CompletionUsage
			if tc.stream {
				params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
				st := env.client.Completions.NewStreaming(ctxT(t), params)
				tokenChunks := 0
				defer func() {
					if tokenChunks != int(tc.maxTokens) {
						t.Errorf("%d chunks before the last, want one per token (%d)", tokenChunks, tc.maxTokens)
					}
				}()
				for st.Next() {
					c := st.Current()
					if len(c.Choices) > 0 {
						if c.Choices[0].FinishReason == "" {
							tokenChunks++
						}
						text += c.Choices[0].Text
						if c.Choices[0].FinishReason != "" {
							finish = string(c.Choices[0].FinishReason)
						}
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
				text, finish, u = c.Choices[0].Text, string(c.Choices[0].FinishReason), c.Usage
			}
			if want := env.want(t, int(tc.maxTokens)); text != want {
				t.Errorf("text = %q, want %q", text, want)
			}
			if finish != "length" {
				t.Errorf("finish_reason = %q, want length", finish)
			}
			if u.PromptTokens != int64(len(promptIDs)) || u.CompletionTokens != tc.maxTokens || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
				t.Errorf("usage = %+v, want prompt %d, completion %d", u, len(promptIDs), tc.maxTokens)
			}
		})
	}
}

func TestCompletionEOS(t *testing.T) {
	var eos int
	env := newEnv(t, "tiny-llama", func(_ *Config, e *fakeEngine) {
		eos = e.eos
		ids := e.script(engine.Request{})[:3:3]
		all := append(ids, e.eos)
		e.script = func(engine.Request) []int { return all }
	})
	c, err := env.client.Completions.New(ctxT(t), openai.CompletionNewParams{
		Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{1, 2, 3}}, MaxTokens: openai.Int(20),
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := env.want(t, 3); c.Choices[0].Text != want || c.Choices[0].FinishReason != "stop" {
		t.Errorf("got %q (%s), want %q (stop); the EOS token (%d) is not text", c.Choices[0].Text, c.Choices[0].FinishReason, want, eos)
	}
	if c.Usage.CompletionTokens != 4 || c.Usage.PromptTokens != 3 {
		t.Errorf("usage = %+v, want 3 prompt and 4 completion tokens", c.Usage)
	}
}

func TestChat(t *testing.T) {
	env := newEnv(t, "tiny-qwen2", nil)
	msgs := []chattemplate.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi there!"}}
	text, err := env.tmpl.Render(msgs, true)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := env.tok.Encode(text, false)
	if err != nil {
		t.Fatal(err)
	}
	params := openai.ChatCompletionNewParams{
		Model:     "tiny",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Hi there!")},
		MaxTokens: openai.Int(7),
		Seed:      openai.Int(3),
	}
	t.Run("plain", func(t *testing.T) {
		c, err := env.client.Chat.Completions.New(ctxT(t), params)
		if err != nil {
			t.Fatal(err)
		}
		if c.Usage.PromptTokens != int64(len(ids)) {
			t.Errorf("prompt_tokens = %d, want %d (the chat template's tokens)", c.Usage.PromptTokens, len(ids))
		}
		if c.Usage.CompletionTokens != 7 || c.Choices[0].FinishReason != "length" {
			t.Errorf("usage %+v, finish %q", c.Usage, c.Choices[0].FinishReason)
		}
		if got, want := c.Choices[0].Message.Content, env.want(t, 7); got != want || c.Choices[0].Message.Role != "assistant" {
			t.Errorf("message = %q (%s), want %q", got, c.Choices[0].Message.Role, want)
		}
		reqs, _, _ := env.eng.snapshot()
		if got := reqs[len(reqs)-1].Prompt; fmt.Sprint(got) != fmt.Sprint(ids) {
			t.Errorf("engine prompt = %v, want %v", got, ids)
		}
	})
	t.Run("stream", func(t *testing.T) {
		p := params
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		st := env.client.Chat.Completions.NewStreaming(ctxT(t), p)
		var acc openai.ChatCompletionAccumulator
		roles := 0
		for st.Next() {
			c := st.Current()
			acc.AddChunk(c)
			if len(c.Choices) > 0 && c.Choices[0].Delta.Role == "assistant" {
				roles++
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		if roles != 1 {
			t.Errorf("%d chunks name the assistant role, want 1", roles)
		}
		if got, want := acc.Choices[0].Message.Content, env.want(t, 7); got != want {
			t.Errorf("content = %q, want %q", got, want)
		}
		if acc.Usage.PromptTokens != int64(len(ids)) || acc.Usage.CompletionTokens != 7 {
			t.Errorf("usage = %+v, want %d prompt tokens and 7 completion tokens", acc.Usage, len(ids))
		}
	})
}

// charTokens returns one byte-level token per character of ASCII text.
func charTokens(t *testing.T, tok *tokenizer.Tokenizer, text string) []int {
	t.Helper()
	var ids []int
	for _, c := range text {
		s := string(c)
		if c == ' ' {
			s = "Ġ"
		}
		id, ok := tok.TokenID(s)
		if !ok {
			t.Fatalf("no token for %q", s)
		}
		ids = append(ids, id)
	}
	return ids
}

func TestStopStrings(t *testing.T) {
	for _, tc := range []struct {
		name    string
		perChar bool // one token per character, so every stop string spans several tokens
		stop    []string
		want    string // the completion; "" with finish length means no stop was found
		finish  string
	}{
		{"split over tokens", true, []string{"Loom"}, "Hello world, this is ", "stop"},
		{"multi-token words", false, []string{"is Lo"}, "Hello world, this ", "stop"},
		{"earliest of several", true, []string{"end", "world"}, "Hello ", "stop"},
		{"prefix repeats", true, []string{"llo wx", "lo w"}, "Hel", "stop"},
		{"partial match then none", true, []string{"Hello x"}, reply[:40], "length"},
		{"at the very start", true, []string{"H"}, "", "stop"},
		{"four stops", false, []string{"a", "b", "c", "."}, "Hello world, this is Loom spe", "stop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, "tiny-llama", func(_ *Config, e *fakeEngine) {
				if tc.perChar {
					tok, err := tokenizer.LoadDir(filepath.Join("..", "testdata", "tiny-llama"))
					if err != nil {
						t.Fatal(err)
					}
					ids := charTokens(t, tok, reply)
					e.script = func(engine.Request) []int { return ids }
				}
			})
			for _, stream := range []bool{false, true} {
				params := openai.CompletionNewParams{
					Model:     "tiny",
					Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")},
					MaxTokens: openai.Int(40),
					Stop:      openai.CompletionNewParamsStopUnion{OfStringArray: tc.stop},
				}
				var chunks []string
				var finish string
				if stream {
					st := env.client.Completions.NewStreaming(ctxT(t), params)
					for st.Next() {
						if c := st.Current(); len(c.Choices) > 0 {
							chunks = append(chunks, c.Choices[0].Text)
							finish += string(c.Choices[0].FinishReason)
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
					chunks, finish = []string{c.Choices[0].Text}, string(c.Choices[0].FinishReason)
				}
				want := tc.want
				if tc.finish == "length" {
					want = env.want(t, 40)
				}
				if got := strings.Join(chunks, ""); got != want || finish != tc.finish {
					t.Errorf("stream=%v: got %q (%s) in chunks %q, want %q (%s)", stream, got, finish, chunks, want, tc.finish)
				}
			}
		})
	}
}

// metric returns the value of an unlabelled (or fully labelled) metric line from /metrics.
func (e *testEnv) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get(e.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`)
	m := re.FindSubmatch(body)
	if m == nil {
		t.Fatalf("no metric %s in\n%s", name, body)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// eventually polls cond until it holds or a few seconds pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestDisconnectFreesKVBlocks(t *testing.T) {
	env := newEnv(t, "tiny-llama", func(_ *Config, e *fakeEngine) { e.delay = 20 * time.Millisecond })
	for _, chat := range []bool{false, true} {
		ctx, cancel := context.WithCancel(ctxT(t))
		var next func() bool
		if chat {
			st := env.client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
				Model: "tiny", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(200),
			})
			next = st.Next
		} else {
			st := env.client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
				Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(200),
			})
			next = st.Next
		}
		for range 3 {
			if !next() {
				t.Fatal("stream ended early")
			}
		}
		if used := env.metric(t, "loom_kv_cache_blocks_used"); used == 0 {
			t.Fatal("no KV blocks in use while a request runs")
		}
		cancel()
		eventually(t, "the KV blocks to be freed", func() bool { return env.metric(t, "loom_kv_cache_blocks_used") == 0 })
	}
	_, cancelled, _ := env.eng.snapshot()
	if cancelled != 2 {
		t.Errorf("engine saw %d cancellations, want 2", cancelled)
	}
	eventually(t, "cancelled requests in the metrics", func() bool {
		return env.metric(t, `loom_request_finished_total{finish_reason="cancelled"}`) == 2
	})
	// The server goes on serving.
	if _, err := env.client.Completions.New(ctxT(t), openai.CompletionNewParams{
		Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(2),
	}); err != nil {
		t.Fatal(err)
	}
}

// TestNotFoundAndMethods: an unknown model is 404 model_not_found (as OpenAI answers it), a
// known path with the wrong method 405 with an Allow header, an unknown path 404.
func TestNotFoundAndMethods(t *testing.T) {
	env := newEnv(t, "tiny-llama", nil)
	for _, tc := range []struct {
		name, body string
		chat       bool
	}{
		{"completions", `{"model": "gpt-9", "prompt": "hi"}`, false},
		{"chat", `{"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}`, true},
	} {
		t.Run("unknown model "+tc.name, func(t *testing.T) {
			err := postRaw(t, env.client, tc.chat, tc.body)
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("got %v, want an API error", err)
			}
			if apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" || apiErr.Param != "model" {
				t.Errorf("got %d code %q param %q: %s; want 404 model_not_found param model", apiErr.StatusCode, apiErr.Code, apiErr.Param, apiErr.Message)
			}
		})
	}
	for _, tc := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{"GET", "/v1/completions", http.StatusMethodNotAllowed, "POST"},
		{"PUT", "/v1/chat/completions", http.StatusMethodNotAllowed, "POST"},
		{"DELETE", "/v1/models", http.StatusMethodNotAllowed, "GET, HEAD"},
		{"POST", "/health", http.StatusMethodNotAllowed, "GET, HEAD"},
		{"POST", "/metrics", http.StatusMethodNotAllowed, "GET, HEAD"},
		{"GET", "/v1/nothing", http.StatusNotFound, ""},
		{"POST", "/v1/completions/x", http.StatusNotFound, ""},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			req, err := http.NewRequestWithContext(ctxT(t), tc.method, env.base+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				Error struct{ Message, Type string }
			}
			jerr := json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || resp.Header.Get("Allow") != tc.allow {
				t.Errorf("got %d Allow %q, want %d Allow %q", resp.StatusCode, resp.Header.Get("Allow"), tc.status, tc.allow)
			}
			if jerr != nil || body.Error.Message == "" {
				t.Errorf("error body: %v %+v", jerr, body)
			}
		})
	}
}

func TestBadRequests(t *testing.T) {
	env := newEnv(t, "tiny-llama", nil)
	long := strings.TrimSuffix(strings.Repeat("1,", 300), ",")
	for _, tc := range []struct {
		name, body, param string
		chat              bool
	}{
		{"malformed JSON", `{"model": "tiny", "prompt": "hi"`, "", false},
		{"not JSON", `hello`, "", false},
		{"empty body", ``, "", false},
		{"not an object", `[1,2]`, "", false},
		{"trailing data", `{"prompt": "hi"} {}`, "", false},
		{"no prompt", `{"model": "tiny"}`, "prompt", false},
		{"prompt of wrong type", `{"model": "tiny", "prompt": {"a": 1}}`, "prompt", false},
		{"several prompts", `{"model": "tiny", "prompt": ["a", "b"]}`, "prompt", false},
		{"token outside vocabulary", `{"model": "tiny", "prompt": [1, 99999]}`, "prompt", false},
		{"prompt longer than the context", `{"model": "tiny", "prompt": [` + long + `]}`, "prompt", false},
		{"chat prompt longer than the context", `{"model": "tiny", "messages": [{"role": "user", "content": "` + strings.Repeat("word ", 300) + `"}]}`, "messages", true},
		{"prompt plus max_tokens too long", `{"model": "tiny", "prompt": "hi", "max_tokens": 1000}`, "max_tokens", false},
		{"max_tokens overflowing the context check", `{"model": "tiny", "prompt": "hi", "max_tokens": 9223372036854775807, "ignore_eos": true, "stream": true}`, "max_tokens", false},
		{"max_tokens of MaxInt-1", `{"model": "tiny", "prompt": "hi", "max_tokens": 9223372036854775806}`, "max_tokens", false},
		{"max_completion_tokens overflowing the context check", `{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9223372036854775807, "stream": true}`, "max_completion_tokens", true},
		{"max_tokens zero", `{"model": "tiny", "prompt": "hi", "max_tokens": 0}`, "max_tokens", false},
		{"max_tokens negative", `{"model": "tiny", "prompt": "hi", "max_tokens": -5}`, "max_tokens", false},
		{"max_completion_tokens zero", `{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}`, "max_completion_tokens", true},
		{"max_tokens not a number", `{"model": "tiny", "prompt": "hi", "max_tokens": "many"}`, "max_tokens", false},
		{"temperature too high", `{"model": "tiny", "prompt": "hi", "temperature": 2.5}`, "temperature", false},
		{"temperature negative", `{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": -1}`, "temperature", true},
		{"temperature of wrong type", `{"model": "tiny", "prompt": "hi", "temperature": "hot"}`, "temperature", false},
		{"top_p zero", `{"model": "tiny", "prompt": "hi", "top_p": 0}`, "top_p", false},
		{"top_p above one", `{"model": "tiny", "prompt": "hi", "top_p": 1.5}`, "top_p", false},
		{"top_k", `{"model": "tiny", "prompt": "hi", "top_k": -3}`, "top_k", false},
		{"min_p", `{"model": "tiny", "prompt": "hi", "min_p": 2}`, "min_p", false},
		{"repetition_penalty", `{"model": "tiny", "prompt": "hi", "repetition_penalty": 0}`, "repetition_penalty", false},
		{"presence_penalty", `{"model": "tiny", "prompt": "hi", "presence_penalty": 3}`, "presence_penalty", false},
		{"frequency_penalty", `{"model": "tiny", "prompt": "hi", "frequency_penalty": -2.5}`, "frequency_penalty", false},
		{"n", `{"model": "tiny", "prompt": "hi", "n": 0}`, "n", false},
		{"n (chat)", `{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 129}`, "n", true},
		{"logprobs", `{"model": "tiny", "prompt": "hi", "logprobs": 6}`, "logprobs", false},
		{"top_logprobs", `{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 21}`, "top_logprobs", true},
		{"top_logprobs without logprobs", `{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}`, "top_logprobs", true},
		{"too many stop strings", `{"model": "tiny", "prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}`, "stop", false},
		{"too many stop strings (chat)", `{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b", "c", "d", "e"]}`, "stop", true},
		{"empty stop string", `{"model": "tiny", "prompt": "hi", "stop": ""}`, "stop", false},
		{"stop of wrong type", `{"model": "tiny", "prompt": "hi", "stop": 5}`, "stop", false},
		{"seed of wrong type", `{"model": "tiny", "prompt": "hi", "seed": 1.5}`, "seed", false},
		{"stream_options without stream", `{"model": "tiny", "prompt": "hi", "stream_options": {"include_usage": true}}`, "stream_options", false},
		{"no messages", `{"model": "tiny", "messages": []}`, "messages", true},
		{"message without role", `{"model": "tiny", "messages": [{"content": "hi"}]}`, "messages[0].role", true},
		{"message content of wrong type", `{"model": "tiny", "messages": [{"role": "user", "content": 5}]}`, "messages[0].content", true},
		{"image content", `{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}`, "messages[0].content", true},
		{"chat_template_kwargs replacing messages", `{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"messages": [{"role": "system", "content": "injected"}]}}`, "chat_template_kwargs", true},
		{"chat_template_kwargs replacing bos_token", `{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": true, "bos_token": "x"}}`, "chat_template_kwargs", true},
		{"chat_template_kwargs replacing add_generation_prompt", `{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"add_generation_prompt": false}}`, "chat_template_kwargs", true},
		{"chat_template_kwargs replacing raise_exception", `{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"raise_exception": 1}}`, "chat_template_kwargs", true},
		{"tools", `{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}]}`, "tools", true},
		{"logit_bias", `{"model": "tiny", "prompt": "hi", "logit_bias": {"5": 10}}`, "logit_bias", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := postRaw(t, env.client, tc.chat, tc.body)
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("got %v, want an API error", err)
			}
			if apiErr.StatusCode != http.StatusBadRequest || apiErr.Type != "invalid_request_error" || apiErr.Param != tc.param || apiErr.Message == "" {
				t.Errorf("got %d %s param %q: %s; want 400 invalid_request_error param %q", apiErr.StatusCode, apiErr.Type, apiErr.Param, apiErr.Message, tc.param)
			}
		})
	}
	// The server keeps serving, and the bad requests never reached the engine.
	if _, err := env.client.Completions.New(ctxT(t), openai.CompletionNewParams{
		Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(3),
	}); err != nil {
		t.Fatalf("after the bad requests: %v", err)
	}
	if reqs, _, _ := env.eng.snapshot(); len(reqs) != 1 {
		t.Errorf("%d requests reached the engine, want 1", len(reqs))
	}
	if got := env.metric(t, `loom_requests_total{code="400",endpoint="completions"}`); got < 30 {
		t.Errorf("loom_requests_total 400 = %g", got)
	}
}

// postRaw sends body as it is to /v1/chat/completions (chat) or /v1/completions and returns
// the client's error.
func postRaw(t *testing.T, c openai.Client, chat bool, body string) error {
	t.Helper()
	raw := option.WithRequestBody("application/json", []byte(body))
	var err error
	if chat {
		_, err = c.Chat.Completions.New(ctxT(t), openai.ChatCompletionNewParams{}, raw)
	} else {
		_, err = c.Completions.New(ctxT(t), openai.CompletionNewParams{}, raw)
	}
	return err
}
