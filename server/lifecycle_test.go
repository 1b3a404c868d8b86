package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

func TestGracefulShutdown(t *testing.T) {
	env := newEnv(t, "tiny-llama", func(_ *Config, e *fakeEngine) { e.delay = 10 * time.Millisecond })
	st := env.client.Completions.NewStreaming(ctxT(t), openai.CompletionNewParams{
		Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(30),
	})
	if !st.Next() {
		t.Fatalf("stream ended early: %v", st.Err())
	}
	text := st.Current().Choices[0].Text
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- env.srv.Shutdown(ctx)
	}()
	// New connections are refused once the listener closes.
	eventually(t, "the listener to close", func() bool {
		resp, err := http.Get(env.base + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err != nil
	})
	var finish string
	for st.Next() {
		c := st.Current()
		text += c.Choices[0].Text
		finish += string(c.Choices[0].FinishReason)
	}
	if err := st.Err(); err != nil {
		t.Fatalf("in-flight stream: %v", err)
	}
	if want := env.want(t, 30); text != want || finish != "length" {
		t.Errorf("in-flight request got %q (%s), want all of %q (length)", text, finish, want)
	}
	if err := <-shut; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if _, _, down := env.eng.snapshot(); !down {
		t.Error("the engine was not shut down")
	}
}

func TestShutdownTimeoutCancels(t *testing.T) {
	env := newEnv(t, "tiny-llama", func(_ *Config, e *fakeEngine) { e.delay = 50 * time.Millisecond })
	st := env.client.Completions.NewStreaming(ctxT(t), openai.CompletionNewParams{
		Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(200),
	})
	if !st.Next() {
		t.Fatalf("stream ended early: %v", st.Err())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := env.srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("shutdown = %v, want the deadline error", err)
	}
	for st.Next() {
	}
	if st.Err() == nil {
		t.Error("the stream cut by a forced shutdown ended without an error")
	}
	if _, cancelled, _ := env.eng.snapshot(); cancelled != 1 {
		t.Errorf("%d engine requests cancelled, want 1", cancelled)
	}
}

// gatedExe runs the model once gate is closed (or fails when the step's context ends).
type gatedExe struct {
	engine.Executable
	gate chan struct{}
}

func (g gatedExe) Run(ctx context.Context, in map[string]*tensor.Tensor) ([]*tensor.Tensor, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.Executable.Run(ctx, in)
}

// The engine admits requests (engine.Options.MaxConcurrent, QueueOnFull, MaxQueue) and the
// server answers its refusals with 429: past --max-concurrent at once, or with --overload
// queue past --max-queue waiting for a slot.
func TestOverload(t *testing.T) {
	for _, queue := range []bool{false, true} {
		t.Run(map[bool]string{false: "reject", true: "queue"}[queue], func(t *testing.T) {
			gate := make(chan struct{})
			env := newRealEnvWith(t, "tiny-llama", engine.Options{MaxConcurrent: 1, QueueOnFull: queue, MaxQueue: 1},
				func(exe engine.Executable) engine.Executable { return gatedExe{exe, gate} })
			params := openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(env.srv.cfg.Model), Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(3)}
			var wg sync.WaitGroup
			errs := make([]error, 2)
			wg.Go(func() { _, errs[0] = env.client.Completions.New(ctxT(t), params) })
			eventually(t, "the first request to run", func() bool { return env.metric(t, "loom_requests_running") == 1 })
			if queue {
				wg.Go(func() { _, errs[1] = env.client.Completions.New(ctxT(t), params) })
				eventually(t, "the second request to queue", func() bool { return env.metric(t, "loom_queue_depth") == 1 })
			}
			// Past the limit (and with queueing, past the queue): 429.
			_, err := env.client.Completions.New(ctxT(t), params)
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Type != "rate_limit_exceeded" {
				t.Errorf("over the limit: got %v, want 429 rate_limit_exceeded", err)
			}
			close(gate)
			wg.Wait()
			for i, err := range errs[:map[bool]int{false: 1, true: 2}[queue]] {
				if err != nil {
					t.Errorf("request %d: %v", i, err)
				}
			}
		})
	}
}

func TestModelsHealthMetrics(t *testing.T) {
	env := newEnv(t, "tiny-llama", nil)
	page, err := env.client.Models.List(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0].ID != "tiny" {
		t.Errorf("models = %+v", page.Data)
	}
	resp, err := http.Get(env.base + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("health = %d", resp.StatusCode)
	}
	if _, err := env.client.Completions.New(ctxT(t), openai.CompletionNewParams{
		Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{5, 6, 7, 8}}, MaxTokens: openai.Int(6),
	}); err != nil {
		t.Fatal(err)
	}
	// The gauges of the engine's state settle once the engine has collected the steps it
	// launched ahead of the request's last token, which may be after the response.
	eventually(t, "the KV blocks and the running request to be released", func() bool {
		return env.metric(t, "loom_kv_cache_blocks_used") == 0 && env.metric(t, "loom_requests_running") == 0
	})
	for name, want := range map[string]float64{
		"loom_prompt_tokens_total":                               4,
		"loom_generation_tokens_total":                           6,
		"loom_time_to_first_token_seconds_count":                 1,
		"loom_inter_token_latency_seconds_count":                 5,
		"loom_e2e_request_latency_seconds_count":                 1,
		`loom_requests_total{code="200",endpoint="completions"}`: 1,
		`loom_request_finished_total{finish_reason="length"}`:    1,
		"loom_kv_cache_blocks_used":                              0,
		"loom_kv_cache_blocks_total":                             1024,
		"loom_kv_cache_usage_ratio":                              0,
		"loom_queue_depth":                                       0,
		"loom_requests_running":                                  0,
	} {
		if got := env.metric(t, name); got != want {
			t.Errorf("%s = %g, want %g", name, got, want)
		}
	}
	resp, err = http.Get(env.base + "/v1/nothing")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown route: %d", resp.StatusCode)
	}
}

func TestSamplingParameters(t *testing.T) {
	env := newEnv(t, "tiny-llama", func(c *Config, _ *fakeEngine) { c.Defaults = sample.Params{Temperature: 1} })
	for _, tc := range []struct {
		name  string
		extra map[string]any
		want  sample.Params
		eos   bool
		stops []int
		max   int
	}{
		{"defaults", nil, sample.Params{Temperature: 1}, false, nil, 16},
		{"openai fields", map[string]any{"temperature": 0.5, "top_p": 0.9, "seed": 42, "presence_penalty": 0.5, "frequency_penalty": -0.5, "max_tokens": 9},
			sample.Params{Temperature: 0.5, TopP: 0.9, Seed: 42, HasSeed: true, PresencePenalty: 0.5, FrequencyPenalty: -0.5}, false, nil, 9},
		{"extensions", map[string]any{"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2, "ignore_eos": true, "stop_token_ids": []int{7}},
			sample.Params{Temperature: 1, TopK: 5, MinP: 0.1, RepetitionPenalty: 1.2}, true, []int{7}, 16},
		{"top_k -1 keeps all", map[string]any{"top_k": -1, "temperature": 0}, sample.Params{}, false, nil, 16},
		{"logprobs", map[string]any{"logprobs": 3}, sample.Params{Temperature: 1, Logprobs: true, TopLogprobs: 3}, false, nil, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []option.RequestOption{}
			for k, v := range tc.extra {
				opts = append(opts, option.WithJSONSet(k, v))
			}
			_, err := env.client.Completions.New(ctxT(t), openai.CompletionNewParams{
				Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")},
			}, opts...)
			if err != nil {
				t.Fatal(err)
			}
			reqs, _, _ := env.eng.snapshot()
			got := reqs[len(reqs)-1]
			if got.Sampling != tc.want || got.IgnoreEOS != tc.eos || len(got.StopTokenIDs) != len(tc.stops) || got.MaxTokens != tc.max {
				t.Errorf("engine request: sampling %+v ignore_eos %v stop ids %v max %d; want %+v %v %v %d",
					got.Sampling, got.IgnoreEOS, got.StopTokenIDs, got.MaxTokens, tc.want, tc.eos, tc.stops, tc.max)
			}
		})
	}
}

func TestLogprobs(t *testing.T) {
	env := newEnv(t, "tiny-llama", nil)
	cp := openai.CompletionNewParams{
		Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(4), Logprobs: openai.Int(1),
	}
	c0, err := env.client.Completions.New(ctxT(t), cp)
	if err != nil {
		t.Fatal(err)
	}
	lp := c0.Choices[0].Logprobs
	if len(lp.Tokens) != 4 || len(lp.TokenLogprobs) != 4 || len(lp.TopLogprobs) != 4 || strings.Join(lp.Tokens, "") != c0.Choices[0].Text {
		t.Errorf("completion logprobs %+v for text %q", lp, c0.Choices[0].Text)
	}
	cs := env.client.Completions.NewStreaming(ctxT(t), cp)
	var toks []string
	for cs.Next() {
		if ch := cs.Current(); len(ch.Choices) > 0 {
			toks = append(toks, ch.Choices[0].Logprobs.Tokens...)
		}
	}
	if err := cs.Err(); err != nil || strings.Join(toks, "") != c0.Choices[0].Text {
		t.Errorf("streamed logprob tokens %q (err %v), want the text %q", toks, err, c0.Choices[0].Text)
	}
	params := openai.ChatCompletionNewParams{
		Model: "tiny", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(5),
		Logprobs: openai.Bool(true), TopLogprobs: openai.Int(1),
	}
	c, err := env.client.Chat.Completions.New(ctxT(t), params)
	if err != nil {
		t.Fatal(err)
	}
	content := c.Choices[0].Logprobs.Content
	if len(content) != 5 || content[0].Logprob != -0.5 || len(content[0].TopLogprobs) != 1 {
		t.Errorf("chat logprobs = %+v", content)
	}
	st := env.client.Chat.Completions.NewStreaming(ctxT(t), params)
	n := 0
	for st.Next() {
		if ch := st.Current(); len(ch.Choices) > 0 {
			n += len(ch.Choices[0].Logprobs.Content)
		}
	}
	if err := st.Err(); err != nil || n != 5 {
		t.Errorf("streamed %d token logprobs (err %v), want 5", n, err)
	}
}

func TestEchoAndTokenPrompts(t *testing.T) {
	env := newEnv(t, "tiny-llama", nil)
	c, err := env.client.Completions.New(ctxT(t), openai.CompletionNewParams{
		Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfStrings: []string{"Once upon"}}, MaxTokens: openai.Int(3), Echo: openai.Bool(true),
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := "Once upon" + env.want(t, 3); c.Choices[0].Text != want {
		t.Errorf("echo: %q, want %q", c.Choices[0].Text, want)
	}
	c, err = env.client.Completions.New(ctxT(t), openai.CompletionNewParams{
		Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokenArrays: [][]int64{{9, 10, 11}}}, MaxTokens: openai.Int(2),
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Usage.PromptTokens != 3 {
		t.Errorf("token prompt: usage %+v", c.Usage)
	}
}

func TestErrorObjectShape(t *testing.T) {
	env := newEnv(t, "tiny-llama", nil)
	resp, err := http.Post(env.base+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "hi", "n": 0}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	e := body["error"]
	if resp.StatusCode != 400 || e["param"] != "n" || e["type"] != "invalid_request_error" || e["code"] != nil || e["message"] == "" {
		t.Errorf("%d %v", resp.StatusCode, body)
	}
	if _, ok := e["code"]; !ok {
		t.Error("code should be present (null)")
	}
}

// TestEngineRefusals maps the engine's Submit errors to HTTP answers.
func TestEngineRefusals(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		typ    string
	}{
		{fmt.Errorf("submit: %w: bad", engine.ErrInvalidRequest), 400, "invalid_request_error"},
		{fmt.Errorf("submit: %w: 300 blocks", engine.ErrRequestTooLarge), 400, "invalid_request_error"},
		{fmt.Errorf("submit: %w", engine.ErrKVCacheFull), 429, "rate_limit_exceeded"},
		{fmt.Errorf("submit: %w", engine.ErrQueueFull), 429, "rate_limit_exceeded"},
		{fmt.Errorf("submit: %w", engine.ErrAtCapacity), 429, "rate_limit_exceeded"},
		{fmt.Errorf("submit: %w", engine.ErrClosed), 503, "service_unavailable"},
		{errors.New("disk on fire"), 500, "server_error"},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			env := newEnv(t, "tiny-llama", func(_ *Config, e *fakeEngine) { e.submitErr = tc.err })
			_, err := env.client.Chat.Completions.New(ctxT(t), openai.ChatCompletionNewParams{
				Model: "tiny", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(2),
			})
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != tc.status || apiErr.Type != tc.typ {
				t.Errorf("%v: got %v, want %d %s", tc.err, err, tc.status, tc.typ)
			}
		})
	}
}
