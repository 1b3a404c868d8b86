package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/loom-ml/loom/bench"
	"github.com/loom-ml/loom/chattemplate"
	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/tokenizer"
)

// syncBuffer is a bytes.Buffer safe for a command writing while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startServe runs `loom serve` in the background on a free port and returns its API URL
// once the model is ready, a function that stops it as SIGTERM would, one that waits for
// the command's result, and its stderr.
func startServe(t *testing.T, args ...string) (url string, stop context.CancelFunc, wait func() error, stderr *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := newRootCmd()
	stderr = &syncBuffer{}
	cmd.SetOut(io.Discard)
	cmd.SetErr(stderr)
	cmd.SetArgs(append([]string{"serve", "--port", "0"}, args...))
	fin := make(chan struct{})
	var result error
	go func() {
		result = cmd.ExecuteContext(ctx)
		close(fin)
	}()
	re := regexp.MustCompile(`ready url=(\S+)`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := re.FindStringSubmatch(stderr.String()); m != nil {
			url = m[1]
			break
		}
		select {
		case <-fin:
			t.Fatalf("serve exited: %v\n%s", result, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("serve did not start:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	wait = func() error {
		<-fin
		return result
	}
	t.Cleanup(func() {
		cancel()
		_ = wait()
	})
	return url, cancel, wait, stderr
}

// TestServeGracefulShutdown serves tiny-llama, then "sends SIGTERM" (ends the command's
// context) while a streaming request runs: the request completes and serve exits cleanly.
func TestServeGracefulShutdown(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-llama")
	url, stop, wait, stderr := startServe(t, "--model", dir, "--served-model-name", "tiny")
	client := openai.NewClient(option.WithBaseURL(url+"/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Completions.New(ctx, openai.CompletionNewParams{
		Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Hello")}, MaxTokens: openai.Int(4), Temperature: openai.Float(0),
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Usage.CompletionTokens < 1 || c.Model != "tiny" {
		t.Errorf("completion %+v", c)
	}
	st := client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Hello")}, MaxTokens: openai.Int(200),
		Temperature: openai.Float(0), StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}, option.WithJSONSet("ignore_eos", true))
	if !st.Next() {
		t.Fatalf("stream: %v", st.Err())
	}
	stop() // SIGTERM
	var usage openai.CompletionUsage
	for st.Next() {
		if u := st.Current().Usage; u.TotalTokens > 0 {
			usage = u
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("the request in flight failed: %v", err)
	}
	if usage.CompletionTokens != 200 {
		t.Errorf("the request in flight got %d tokens, want 200", usage.CompletionTokens)
	}
	if err := wait(); err != nil {
		t.Fatalf("serve: %v\n%s", err, stderr.String())
	}
	t.Logf("serve's log:\n%s", stderr.String())
	if !strings.Contains(stderr.String(), "server stopped") {
		t.Errorf("no shutdown message in\n%s", stderr.String())
	}
}

func TestServeFlags(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-llama")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--model", dir, "--world-size", "-1"}, "world-size"},
		{[]string{"serve", "--model", dir, "--mesh", "tp=x"}, "mesh"},
		{[]string{"serve", "--model", dir, "--overload", "drop"}, "--overload"},
		{[]string{"serve", "--model", dir, "--port", "70000"}, "--port"},
		{[]string{"serve"}, "model"},
	} {
		_, _, err := run(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestServeOnRanks serves tiny-llama on two tensor-parallel ranks (goroutines) and checks
// that greedy text equals the single-rank server's.
func TestServeOnRanks(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-llama")
	var texts []string
	for _, ws := range []string{"1", "2"} {
		url, stop, wait, stderr := startServe(t, "--model", dir, "--world-size", ws)
		if !strings.Contains(stderr.String(), "ranks="+ws) {
			t.Errorf("world size %s: the engine did not start on %s ranks:\n%s", ws, ws, stderr.String())
		}
		client := openai.NewClient(option.WithBaseURL(url+"/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model: "tiny-llama", Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{0, 56, 76, 73}}, MaxTokens: openai.Int(6),
			Temperature: openai.Float(0),
		}, option.WithJSONSet("ignore_eos", true))
		cancel()
		if err != nil {
			t.Fatalf("world size %s: %v", ws, err)
		}
		texts = append(texts, c.Choices[0].Text)
		stop()
		if err := wait(); err != nil {
			t.Fatal(err)
		}
	}
	if texts[0] != texts[1] {
		t.Errorf("one rank: %q, two ranks: %q", texts[0], texts[1])
	}
}

// TestBenchAgainstServe runs loom bench against loom serve, writes the JSON result and
// compares a second run with it.
func TestBenchAgainstServe(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-llama")
	url, _, _, _ := startServe(t, "--model", dir)
	out := filepath.Join(t.TempDir(), "run.json")
	args := []string{"bench", "--url", strings.TrimSuffix(url, "/v1"), "--tokenizer", dir, "--num-requests", "6", "--concurrency", "3",
		"--input-len", "10", "--output-len", "5"}
	stdout, stderr, err := run(t, append(args, "--json", "--output", out)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	var res bench.Result
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if res.Requests != 6 || res.Failed != 0 || res.OutputTokens != 30 || res.InputTokens != 60 || res.TTFT.P50 <= 0 || res.Latency.P99 < res.TTFT.P99 {
		t.Errorf("result %+v", res)
	}
	if _, err := os.Stat(out); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err = run(t, append(args, "--rate", "50", "--endpoint", "chat", "--baseline", out)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for _, want := range []string{"requests/s", "time to first token", "compared with", "ratio", "ttft p99 (ms)"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
}

func TestBenchInProcess(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-llama")
	data := filepath.Join(t.TempDir(), "data.jsonl")
	if err := os.WriteFile(data, []byte(`{"prompt": "Hello there", "max_tokens": 3}
{"prompt_ids": [0, 56, 76], "max_tokens": 4}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err := run(t, "bench", "--model", dir, "--dataset", data, "--num-requests", "4", "--concurrency", "2", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	var res bench.Result
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if res.Requests != 4 || res.OutputTokens != 14 || !strings.Contains(res.Target, "in-process") {
		t.Errorf("result %+v", res)
	}
	if _, _, err := run(t, "bench"); err == nil {
		t.Error("bench without --url or --model should fail")
	}
}

// TestChat pipes a conversation into loom chat and checks the greedy replies against the
// engine's tokens for the same rendered prompts.
func TestChat(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-qwen2")
	cmd := newRootCmd()
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetIn(strings.NewReader("Hello!\n\n/reset\nName a colour.\n/exit\nnever read\n"))
	cmd.SetArgs([]string{"chat", "--model", dir, "--temperature", "0", "--max-tokens", "6", "--system", "Be brief."})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	want := greedyReply(t, dir, "Be brief.", "Hello!", 6)
	want2 := greedyReply(t, dir, "Be brief.", "Name a colour.", 6)
	got := stdout.String()
	if !strings.Contains(got, want) || !strings.Contains(got, want2) || !strings.Contains(got, "(conversation cleared)") {
		t.Errorf("chat output %q, want the replies %q and %q", got, want, want2)
	}
}

// greedyReply is the text the engine generates greedily for a system and a user message.
func greedyReply(t *testing.T, dir, system, user string, n int) string {
	t.Helper()
	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chattemplate.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	text, err := tmpl.Render([]chattemplate.Message{{Role: "system", Content: system}, {Role: "user", Content: user}}, true)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok.Encode(text, false)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m, err := engine.Load(ctx, dir, engine.LoadOptions{Optimize: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	eng, err := engine.New(ctx, m, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	st, err := eng.Submit(ctx, engine.Request{Prompt: ids, MaxTokens: n})
	if err != nil {
		t.Fatal(err)
	}
	toks, last, err := st.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if last.Finish == engine.FinishStop {
		toks = toks[:len(toks)-1]
	}
	reply, err := tok.Decode(toks, true)
	if err != nil {
		t.Fatal(err)
	}
	return reply
}

// TestServeChecksBeforeLoading: the port is bound, and the tokenizer read, before the
// weights load; a busy port or a missing tokenizer fails without loading anything.
func TestServeChecksBeforeLoading(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-llama")
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	_, port, _ := net.SplitHostPort(busy.Addr().String())
	noTokenizer := t.TempDir()
	for _, f := range []string{"config.json", "model.safetensors"} {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(noTokenizer, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"busy port", []string{"serve", "--model", dir, "--port", port}, "listen"},
		{"no tokenizer", []string{"serve", "--model", noTokenizer, "--port", "0"}, "tokenizer"},
	} {
		_, stderr, err := run(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one about %q", tc.name, err, tc.want)
		}
		if strings.Contains(stderr, "model loaded") {
			t.Errorf("%s: the model was loaded before the error:\n%s", tc.name, stderr)
		}
	}
	// Served: the listening line comes before the model loads.
	_, _, _, stderr := startServe(t, "--model", dir)
	log := stderr.String()
	if l, m := strings.Index(log, "listening url="), strings.Index(log, "model loaded"); l < 0 || m < 0 || l > m {
		t.Errorf("the port was not bound before the model loaded:\n%s", log)
	}
}

// TestServeVLLMFlags: vLLM's flag names set Loom's settings; --gpu-memory-utilization,
// which Loom has not, is refused with the setting it has.
func TestServeVLLMFlags(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-llama")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--gpu-memory-utilization", "0.9"}, "--kv-cache-bytes"},
		{[]string{"-t"}, "-tp N"},
		{[]string{"-tp", "2", "--world-size", "3"}, "disagree"},
		{[]string{"--max-model-len", "5000"}, "--max-model-len 5000 is more than the model's context, 1024"},
		{[]string{"--chat-template", "no-such-template"}, "--chat-template"},
		{[]string{"--tensor-parallel-size", "-1"}, "world-size"},
	} {
		_, _, err := run(t, append([]string{"serve", "--model", dir, "--port", "0"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
	}

	tmpl := filepath.Join(t.TempDir(), "template.jinja")
	if err := os.WriteFile(tmpl, []byte(`{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		logs []string
	}{
		{[]string{"-tp", "2"}, []string{"ranks=2"}},
		{[]string{"--tensor-parallel-size", "2", "--max-num-seqs", "3", "--max-num-batched-tokens", "64", "--max-model-len", "512",
			"--chat-template", tmpl, "--served-model-name", "tiny"}, []string{"ranks=2", "max_batch=3", "max_tokens_per_step=64"}},
	} {
		url, stop, wait, stderr := startServe(t, append([]string{"--model", dir}, tc.args...)...)
		for _, want := range tc.logs {
			if !strings.Contains(stderr.String(), want) {
				t.Errorf("%v: the log lacks %q:\n%s", tc.args, want, stderr.String())
			}
		}
		if len(tc.args) > 2 {
			client := openai.NewClient(option.WithBaseURL(url+"/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
			var m struct {
				ID          string `json:"id"`
				MaxModelLen int    `json:"max_model_len"`
			}
			if err := client.Get(context.Background(), "models/tiny", nil, &m); err != nil || m.MaxModelLen != 512 {
				t.Errorf("model %+v %v, want max_model_len 512", m, err)
			}
			_, err := client.Completions.New(context.Background(), openai.CompletionNewParams{
				Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(600),
			})
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "max_tokens" {
				t.Errorf("max_tokens past --max-model-len: %v", err)
			}
			root := openai.NewClient(option.WithBaseURL(strings.TrimSuffix(url, "v1")), option.WithAPIKey("x"), option.WithMaxRetries(0))
			var tk struct {
				Tokens []int `json:"tokens"`
			}
			msgs := []map[string]string{{"role": "user", "content": "hi"}}
			if err := root.Post(context.Background(), "tokenize", map[string]any{"messages": msgs}, &tk); err != nil {
				t.Fatal(err)
			}
			tok, err := tokenizer.LoadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := tok.Encode("<user>hi<assistant>", false)
			if !slices.Equal(tk.Tokens, want) {
				t.Errorf("--chat-template: tokens %v, want %v", tk.Tokens, want)
			}
		}
		stop()
		if err := wait(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestServeAPIKeyFromEnv: LOOM_API_KEY guards every route but /health.
func TestServeAPIKeyFromEnv(t *testing.T) {
	t.Setenv("LOOM_API_KEY", "sk-env")
	dir := filepath.Join("..", "..", "testdata", "tiny-llama")
	url, _, _, _ := startServe(t, "--model", dir, "--served-model-name", "tiny")
	resp, err := http.Get(strings.TrimSuffix(url, "/v1") + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("health without a key: %d", resp.StatusCode)
	}
	for key, wantErr := range map[string]bool{"sk-env": false, "sk-other": true} {
		client := openai.NewClient(option.WithBaseURL(url+"/"), option.WithAPIKey(key), option.WithMaxRetries(0))
		_, err := client.Models.List(context.Background())
		var apiErr *openai.Error
		if wantErr != (err != nil) || wantErr && (!errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized) {
			t.Errorf("key %s: %v", key, err)
		}
	}
}

// TestServeSecondSignal: after the first signal the server drains; a second SIGTERM ends
// the open stream at once with an error event and [DONE].
func TestServeSecondSignal(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-llama")
	url, stop, wait, stderr := startServe(t, "--model", dir, "--served-model-name", "tiny", "--shutdown-timeout", "10m")
	resp, err := http.Post(url+"/completions", "application/json",
		strings.NewReader(`{"prompt": "Hello", "max_tokens": 1000, "ignore_eos": true, "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	stop() // the first signal
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(stderr.String(), "signal received") {
		if time.Now().After(deadline) {
			t.Fatalf("no drain:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(r)
	events := strings.Split(strings.TrimSpace(string(rest)), "\n\n")
	if n := len(events); n < 2 || events[n-1] != "data: [DONE]" || !strings.Contains(events[n-2], `"code":"server_shutdown"`) {
		t.Errorf("the stream ends with %q, want the shutdown error and [DONE]", events[max(0, len(events)-2):])
	}
	if err := wait(); err == nil {
		t.Error("serve ended without the forced shutdown's error")
	}
	if !strings.Contains(stderr.String(), "second signal") {
		t.Errorf("no second-signal message:\n%s", stderr.String())
	}
}
