package server

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/loom-ml/loom/chattemplate"
	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/internal/parity"
)

// realEnv is a server in front of a real engine on a fixture checkpoint.
type realEnv struct {
	testEnv
	engine *engine.Engine
	ref    []parity.Prompt // the fixture's reference prompts, validated by parity.Load
}

var (
	loadMu sync.Mutex
	loaded = map[string]*engine.Model{}
)

// loadModel loads a fixture once per test binary.
func loadModel(t *testing.T, dir string) *engine.Model {
	t.Helper()
	loadMu.Lock()
	defer loadMu.Unlock()
	if m, ok := loaded[dir]; ok {
		return m
	}
	m, err := engine.Load(context.Background(), filepath.Join("..", "testdata", dir), engine.LoadOptions{Optimize: true})
	if err != nil {
		t.Fatal(err)
	}
	loaded[dir] = m
	return m
}

func newRealEnv(t *testing.T, dir string, opts engine.Options) *realEnv {
	t.Helper()
	return newRealEnvWith(t, dir, opts, nil)
}

// newRealEnvWith is newRealEnv with the model's executable wrapped by wrap (nil: as it is).
func newRealEnvWith(t *testing.T, dir string, opts engine.Options, wrap func(engine.Executable) engine.Executable) *realEnv {
	t.Helper()
	return newRealEnvConfig(t, dir, opts, wrap, nil)
}

// newRealEnvConfig is newRealEnvWith with the server's configuration changed by edit (nil:
// as ModelConfig makes it); the client sends the configured API key.
func newRealEnvConfig(t *testing.T, dir string, opts engine.Options, wrap func(engine.Executable) engine.Executable, edit func(*Config)) *realEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("loads and runs a model")
	}
	m := loadModel(t, dir)
	opts.Logger = slog.New(slog.DiscardHandler)
	var eng *engine.Engine
	var err error
	if wrap == nil {
		eng, err = engine.New(context.Background(), m, opts)
	} else {
		info := engine.ModelInfo{Name: dir, MaxPositions: m.Config.MaxPositionEmbeddings, EOSTokenIDs: m.EOSTokenIDs()}
		eng, err = engine.NewRanks(context.Background(), []engine.Rank{{Graph: m.Graph, Exe: wrap(m.Program)}}, info, opts)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	cfg, err := ModelConfig(m.Model, "")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	if edit != nil {
		edit(&cfg)
	}
	srv, err := New(FromEngine(eng), cfg)
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
	ref, err := parity.Load(filepath.Join("..", "testdata", dir))
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	env := &realEnv{
		testEnv: testEnv{srv: srv, tok: cfg.Tokenizer, tmpl: cfg.ChatTemplate, base: base,
			client: openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey(cmp.Or(cfg.APIKey, "unused")), option.WithMaxRetries(0))},
		engine: eng, ref: ref.Prompts,
	}
	return env
}

func ids64(ids []int) []int64 {
	out := make([]int64, len(ids))
	for i, id := range ids {
		out[i] = int64(id)
	}
	return out
}

// TestEngineGreedy serves tiny-llama and checks that greedy completions, streamed or not,
// are the text of the tokens the engine generates for the same request.
func TestEngineGreedy(t *testing.T) {
	env := newRealEnv(t, "tiny-llama", engine.Options{MaxBatch: 4, KVBlocks: 64})
	for i, p := range env.ref {
		n := min(len(p.GreedyNewIDs), 12)
		es, err := env.engine.Submit(ctxT(t), engine.Request{Prompt: p.IDs, MaxTokens: n, IgnoreEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		toks, _, err := es.Collect(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		want, err := env.tok.Decode(toks, true)
		if err != nil {
			t.Fatal(err)
		}
		params := openai.CompletionNewParams{
			Model: "tiny-llama", Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: ids64(p.IDs)},
			MaxTokens: openai.Int(int64(n)), Temperature: openai.Float(0),
		}
		ignoreEOS := option.WithJSONSet("ignore_eos", true)
		c, err := env.client.Completions.New(ctxT(t), params, ignoreEOS)
		if err != nil {
			t.Fatal(err)
		}
		if c.Choices[0].Text != want || c.Usage.CompletionTokens != int64(n) || c.Usage.PromptTokens != int64(len(p.IDs)) {
			t.Errorf("prompt %d: %q usage %+v, want %q (%d tokens)", i, c.Choices[0].Text, c.Usage, want, n)
		}
		params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		st := env.client.Completions.NewStreaming(ctxT(t), params, ignoreEOS)
		text := ""
		var u openai.CompletionUsage
		for st.Next() {
			ch := st.Current()
			if len(ch.Choices) > 0 {
				text += ch.Choices[0].Text
			}
			if ch.Usage.TotalTokens > 0 {
				u = ch.Usage
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		if text != want || u.CompletionTokens != int64(n) {
			t.Errorf("prompt %d streamed: %q usage %+v, want %q", i, text, u, want)
		}
	}
}

// TestEngineChatUsage serves tiny-qwen2: prompt_tokens is the chat template's token count.
func TestEngineChatUsage(t *testing.T) {
	env := newRealEnv(t, "tiny-qwen2", engine.Options{MaxBatch: 4, KVBlocks: 64})
	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("You are terse."), openai.UserMessage("Name a colour.")}
	rendered, err := env.tmpl.Render([]chattemplate.Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Name a colour."}}, true)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := env.tok.Encode(rendered, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, stream := range []bool{false, true} {
		params := openai.ChatCompletionNewParams{Model: "tiny-qwen2", Messages: msgs, MaxTokens: openai.Int(6), Temperature: openai.Float(0)}
		var u openai.CompletionUsage
		if stream {
			params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
			st := env.client.Chat.Completions.NewStreaming(ctxT(t), params)
			var acc openai.ChatCompletionAccumulator
			for st.Next() {
				acc.AddChunk(st.Current())
			}
			if err := st.Err(); err != nil {
				t.Fatal(err)
			}
			u = acc.Usage
		} else {
			c, err := env.client.Chat.Completions.New(ctxT(t), params)
			if err != nil {
				t.Fatal(err)
			}
			u = c.Usage
		}
		if u.PromptTokens != int64(len(ids)) || u.CompletionTokens < 1 || u.CompletionTokens > 6 {
			t.Errorf("stream=%v: usage %+v, want %d prompt tokens", stream, u, len(ids))
		}
	}
}

// TestEngineDisconnectFreesKVBlocks cuts a streaming request and watches the engine's KV
// blocks come back, through /metrics, before the request could have finished; the server
// goes on serving.
func TestEngineDisconnectFreesKVBlocks(t *testing.T) {
	env := newRealEnv(t, "tiny-llama", engine.Options{MaxBatch: 4, KVBlocks: 64})
	const maxTokens = 240
	ctx, cancel := context.WithCancel(ctxT(t))
	st := env.client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model: "tiny-llama", Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{0, 56, 76}},
		MaxTokens: openai.Int(maxTokens), Temperature: openai.Float(0),
	}, option.WithJSONSet("ignore_eos", true))
	if !st.Next() {
		t.Fatalf("stream ended early: %v", st.Err())
	}
	inUse := env.metric(t, "loom_kv_cache_blocks_used")
	cancel()
	eventually(t, "the KV blocks to be freed", func() bool { return env.metric(t, "loom_kv_cache_blocks_used") == 0 })
	eventually(t, "the engine to drop the request", func() bool { return env.engine.Stats().Running == 0 })
	gen := env.engine.Stats().GeneratedTokensTotal
	t.Logf("blocks in use while streaming: %g; tokens generated before the cancel took effect: %d of %d", inUse, gen, maxTokens)
	// The server goes on serving.
	if _, err := env.client.Completions.New(ctxT(t), openai.CompletionNewParams{
		Model: "tiny-llama", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(2),
	}); err != nil {
		t.Fatal(err)
	}
	if inUse == 0 && gen >= maxTokens {
		t.Skip("the request finished before the client disconnected; whether the disconnect cancelled it is left unchecked")
	}
	if gen >= maxTokens {
		t.Errorf("the engine generated all %d tokens: the disconnect did not cancel the request", gen)
	}
}

// TestEngineKVCacheLimits serves a KV cache of 2 blocks: a request larger than the whole
// cache is refused up front, and a chat request without max_tokens generates what the cache
// can hold.
func TestEngineKVCacheLimits(t *testing.T) {
	small := newRealEnv(t, "tiny-llama", engine.Options{MaxBatch: 2, KVBlocks: 2})
	_, err := small.client.Completions.New(ctxT(t), openai.CompletionNewParams{
		Model: "tiny-llama", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(200),
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != "max_tokens" {
		t.Errorf("request larger than the KV cache: got %v, want 400 naming max_tokens", err)
	}
	c, err := small.client.Chat.Completions.New(ctxT(t), openai.ChatCompletionNewParams{
		Model: "tiny-llama", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	}, option.WithJSONSet("ignore_eos", true))
	if err != nil {
		t.Fatal(err)
	}
	if total := c.Usage.PromptTokens + c.Usage.CompletionTokens; total != 2*16+1 || c.Choices[0].FinishReason != "length" {
		t.Errorf("usage %+v (%s), want prompt and completion filling the 2 blocks of 16 tokens, plus the last token", c.Usage, c.Choices[0].FinishReason)
	}
}

// TestEngineBadRequests checks the 400s (and the unknown model's 404) that depend on the real model and that the server
// keeps serving after them.
func TestEngineBadRequests(t *testing.T) {
	env := newRealEnv(t, "tiny-llama", engine.Options{MaxBatch: 4, KVBlocks: 64})
	for _, tc := range []struct {
		name, body, param string
		status            int
	}{
		{"context", `{"model": "tiny-llama", "prompt": "hi", "max_tokens": 1100}`, "max_tokens", http.StatusBadRequest},
		{"max_tokens overflow", `{"model": "tiny-llama", "prompt": "hi", "max_tokens": 9223372036854775807, "ignore_eos": true}`, "max_tokens", http.StatusBadRequest},
		{"vocabulary", `{"model": "tiny-llama", "prompt": [1, 512]}`, "prompt", http.StatusBadRequest},
		{"model", `{"model": "tiny-qwen2", "prompt": "hi"}`, "model", http.StatusNotFound},
	} {
		_, err := env.client.Completions.New(ctxT(t), openai.CompletionNewParams{}, option.WithRequestBody("application/json", []byte(tc.body)))
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != tc.status || apiErr.Param != tc.param {
			t.Errorf("%s: got %v, want %d naming %s", tc.name, err, tc.status, tc.param)
		}
	}
	if _, err := env.client.Completions.New(ctxT(t), openai.CompletionNewParams{
		Model: "tiny-llama", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(2),
	}); err != nil {
		t.Fatal(err)
	}
}

// TestEngineNewRoutes serves tiny-llama behind an API key through openai-go: n greedy
// choices are each the engine's greedy text and count the prompt once; /v1/models/{id},
// /tokenize and /detokenize answer for the real tokenizer; a wrong key gets 401.
func TestEngineNewRoutes(t *testing.T) {
	env := newRealEnvConfig(t, "tiny-llama", engine.Options{MaxBatch: 4, KVBlocks: 64}, nil, func(c *Config) { c.APIKey = "sk-loom" })
	p := env.ref[0]
	es, err := env.engine.Submit(ctxT(t), engine.Request{Prompt: p.IDs, MaxTokens: 8, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	toks, _, err := es.Collect(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	want, err := env.tok.Decode(toks, true)
	if err != nil {
		t.Fatal(err)
	}
	c, err := env.client.Completions.New(ctxT(t), openai.CompletionNewParams{
		Model: "tiny-llama", Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: ids64(p.IDs)},
		MaxTokens: openai.Int(8), Temperature: openai.Float(0), N: openai.Int(3),
	}, option.WithJSONSet("ignore_eos", true))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Choices) != 3 || c.Usage.PromptTokens != int64(len(p.IDs)) || c.Usage.CompletionTokens != 24 {
		t.Fatalf("n=3: %d choices, usage %+v", len(c.Choices), c.Usage)
	}
	for i, ch := range c.Choices {
		if ch.Index != int64(i) || ch.Text != want {
			t.Errorf("choice %d (index %d): %q, want %q", i, ch.Index, ch.Text, want)
		}
	}

	m, err := env.client.Models.Get(ctxT(t), "tiny-llama")
	if err != nil || m.ID != "tiny-llama" {
		t.Errorf("model: %+v %v", m, err)
	}
	root := openai.NewClient(option.WithBaseURL(env.base+"/"), option.WithAPIKey("sk-loom"), option.WithMaxRetries(0))
	var tk struct {
		Count       int   `json:"count"`
		MaxModelLen int   `json:"max_model_len"`
		Tokens      []int `json:"tokens"`
	}
	text, err := env.tok.Decode(p.IDs, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := root.Post(ctxT(t), "tokenize", map[string]any{"prompt": text}, &tk); err != nil {
		t.Fatal(err)
	}
	ids, _ := env.tok.Encode(text, true)
	if tk.Count != len(ids) || tk.MaxModelLen != 1024 || len(tk.Tokens) != len(ids) {
		t.Errorf("tokenize: %+v, want %d tokens", tk, len(ids))
	}
	var dt struct {
		Prompt string `json:"prompt"`
	}
	if err := root.Post(ctxT(t), "detokenize", map[string]any{"tokens": toks}, &dt); err != nil {
		t.Fatal(err)
	}
	if dt.Prompt != want {
		t.Errorf("detokenize: %q, want %q", dt.Prompt, want)
	}

	wrong := openai.NewClient(option.WithBaseURL(env.base+"/v1/"), option.WithAPIKey("sk-other"), option.WithMaxRetries(0))
	_, err = wrong.Models.List(ctxT(t))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized || apiErr.Code != "invalid_api_key" {
		t.Errorf("wrong key: %v", err)
	}
}
