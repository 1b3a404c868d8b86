package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct{ p, want float64 }{{0, 1}, {50, 5.5}, {90, 9.1}, {99, 9.91}, {100, 10}} {
		if got := Percentile(xs, tc.p); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("p%g = %g, want %g", tc.p, got, tc.want)
		}
	}
	if Percentile(nil, 50) != 0 || Percentile([]float64{7}, 99) != 7 {
		t.Error("empty or single-element percentiles")
	}
}

func TestSummarize(t *testing.T) {
	samples := []Sample{
		{TTFT: 10 * time.Millisecond, ITL: []time.Duration{2 * time.Millisecond, 4 * time.Millisecond}, Latency: 16 * time.Millisecond, PromptTokens: 5, OutputTokens: 4},
		{TTFT: 20 * time.Millisecond, ITL: []time.Duration{6 * time.Millisecond}, Latency: 26 * time.Millisecond, PromptTokens: 5, OutputTokens: 2},
		{Err: errors.New("HTTP 500")},
		{Err: errors.New("HTTP 500")},
	}
	r := Summarize(samples, 2*time.Second)
	want := &Result{Requests: 2, Failed: 2, Errors: []string{"HTTP 500"}, Duration: 2, RequestsPerSec: 1, InputTokensPerSec: 5, OutputTokensPerSec: 3,
		InputTokens: 10, OutputTokens: 6,
		TTFT: Dist{15, 15, 19, 19.9}, ITL: Dist{4, 4, 5.6, 5.96}, TPOT: Dist{4, 4, 5.6, 5.96}, Latency: Dist{21, 21, 25, 25.9}}
	if !sameResult(r, want) {
		t.Errorf("got  %+v\nwant %+v", r, want)
	}
}

// sameResult compares results, figures to 1e-9.
func sameResult(a, b *Result) bool {
	fa, fb := Figures(a, a), Figures(b, b)
	for i := range fa {
		if math.Abs(fa[i].Current-fb[i].Current) > 1e-9 {
			return false
		}
	}
	return a.Requests == b.Requests && a.Failed == b.Failed && fmt.Sprint(a.Errors) == fmt.Sprint(b.Errors) && a.InputTokens == b.InputTokens && a.OutputTokens == b.OutputTokens
}

// sleepTarget takes d per request and counts how many run at once.
type sleepTarget struct {
	d         time.Duration
	now, most atomic.Int64
	mu        sync.Mutex
	started   []time.Time
}

func (s *sleepTarget) Name() string { return "sleep" }

func (s *sleepTarget) Do(ctx context.Context, r Request) Sample {
	n := s.now.Add(1)
	defer s.now.Add(-1)
	for {
		m := s.most.Load()
		if n <= m || s.most.CompareAndSwap(m, n) {
			break
		}
	}
	s.mu.Lock()
	s.started = append(s.started, time.Now())
	s.mu.Unlock()
	select {
	case <-time.After(s.d):
	case <-ctx.Done():
		return Sample{Err: ctx.Err()}
	}
	return Sample{TTFT: s.d / 2, Latency: s.d, OutputTokens: r.MaxTokens, PromptTokens: len(r.PromptIDs)}
}

func TestRun(t *testing.T) {
	reqs, err := Synthetic(12, 4, 3, 100, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		cfg      Config
		wantMost int64
	}{
		{"serial", Config{}, 1},
		{"concurrency 4", Config{Concurrency: 4}, 4},
		{"rate", Config{Rate: 400, Concurrency: 2}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tgt := &sleepTarget{d: 10 * time.Millisecond}
			res, err := Run(context.Background(), tgt, reqs, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if res.Requests != 12 || res.OutputTokens != 36 || res.InputTokens != 48 || res.Failed != 0 {
				t.Errorf("result %+v", res)
			}
			if got := tgt.most.Load(); got != tc.wantMost {
				t.Errorf("at most %d requests in flight, want %d", got, tc.wantMost)
			}
		})
	}
	// A cancelled run stops early and says so.
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Millisecond)
	defer cancel()
	res, err := Run(ctx, &sleepTarget{d: 10 * time.Millisecond}, reqs, Config{})
	if !errors.Is(err, context.DeadlineExceeded) || res == nil || res.Requests >= 12 {
		t.Errorf("cancelled run: %v, %+v", err, res)
	}
}

// sseServer answers completions with n text pieces and usage, like an OpenAI server.
func sseServer(t *testing.T, pieces int, status int) (*httptest.Server, *[]map[string]any) {
	var mu sync.Mutex
	var bodies []map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m1","object":"model"}]}`)
			return
		}
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Error(err)
		}
		mu.Lock()
		bodies = append(bodies, body)
		mu.Unlock()
		if status != http.StatusOK {
			http.Error(w, `{"error":{"message":"nope"}}`, status)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		chat := strings.HasSuffix(r.URL.Path, "/chat/completions")
		if chat {
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n")
		}
		for i := range pieces {
			if chat {
				fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"w%d \"}}]}\n\n", i)
			} else {
				fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"w%d \"}]}\n\n", i)
			}
			w.(http.Flusher).Flush()
			time.Sleep(time.Millisecond)
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"\",\"delta\":{},\"finish_reason\":\"length\"}]}\n\n")
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", pieces)
	}))
	t.Cleanup(srv.Close)
	return srv, &bodies
}

func TestOpenAITarget(t *testing.T) {
	srv, bodies := sseServer(t, 5, http.StatusOK)
	models, err := Models(context.Background(), nil, srv.URL+"/v1")
	if err != nil || len(models) != 1 || models[0] != "m1" {
		t.Fatalf("models %v, %v", models, err)
	}
	for _, tc := range []struct {
		name   string
		chat   bool
		req    Request
		prompt any
	}{
		{"text", false, Request{Prompt: "hi", MaxTokens: 5}, "hi"},
		{"ids", false, Request{PromptIDs: []int{1, 2}, MaxTokens: 5}, []any{1.0, 2.0}},
		{"chat", true, Request{Messages: []Message{{"user", "hi"}}, MaxTokens: 5}, nil},
		{"text to chat", true, Request{Prompt: "yo", MaxTokens: 5}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &OpenAI{BaseURL: srv.URL + "/v1", Model: "m1", Chat: tc.chat, IgnoreEOS: true}
			s := o.Do(context.Background(), tc.req)
			if s.Err != nil {
				t.Fatal(s.Err)
			}
			if s.OutputTokens != 5 || s.PromptTokens != 7 || len(s.ITL) != 4 || s.TTFT <= 0 || s.Latency < s.TTFT {
				t.Errorf("sample %+v", s)
			}
			body := (*bodies)[len(*bodies)-1]
			if body["model"] != "m1" || body["max_tokens"] != 5.0 || body["stream"] != true || body["ignore_eos"] != true {
				t.Errorf("request body %v", body)
			}
			if tc.prompt != nil && fmt.Sprint(body["prompt"]) != fmt.Sprint(tc.prompt) {
				t.Errorf("prompt %v, want %v", body["prompt"], tc.prompt)
			}
			if tc.chat && body["messages"] == nil {
				t.Errorf("no messages in %v", body)
			}
		})
	}
	bad, _ := sseServer(t, 0, http.StatusTooManyRequests)
	s := (&OpenAI{BaseURL: bad.URL + "/v1", Model: "m1"}).Do(context.Background(), Request{Prompt: "x", MaxTokens: 1})
	if s.Err == nil || !strings.Contains(s.Err.Error(), "429") {
		t.Errorf("error = %v, want one naming HTTP 429", s.Err)
	}
	s = (&OpenAI{BaseURL: srv.URL + "/v1", Model: "m1"}).Do(context.Background(), Request{Messages: []Message{{"user", "x"}}, MaxTokens: 1})
	if s.Err == nil {
		t.Error("chat messages to the completions endpoint should fail")
	}
}

func TestOpenAITargetStreamErrors(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"error event", "data: {\"error\":{\"message\":\"boom\"}}\n\n", "boom"},
		{"no DONE", "data: {\"choices\":[{\"text\":\"a\"}]}\n\n", "without [DONE]"},
		{"bad JSON", "data: {oops\n\n", "bad event"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, tc.body) }))
			defer srv.Close()
			s := (&OpenAI{BaseURL: srv.URL, Model: "m"}).Do(context.Background(), Request{Prompt: "x", MaxTokens: 1})
			if s.Err == nil || !strings.Contains(s.Err.Error(), tc.want) {
				t.Errorf("error = %v, want %q", s.Err, tc.want)
			}
		})
	}
}

func TestLoadJSONL(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.jsonl", `{"prompt": "a b", "max_tokens": 3}

{"prompt_ids": [1, 2, 3]}
{"messages": [{"role": "user", "content": "hi"}], "output_len": 9}
`)
	reqs, err := LoadJSONL(good, 0, 16)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 3 || reqs[0].Prompt != "a b" || reqs[0].MaxTokens != 3 || len(reqs[1].PromptIDs) != 3 || reqs[1].MaxTokens != 16 ||
		reqs[2].Messages[0].Content != "hi" || reqs[2].MaxTokens != 9 {
		t.Errorf("requests %+v", reqs)
	}
	if reqs, err := LoadJSONL(good, 7, 16); err != nil || len(reqs) != 7 || reqs[6].Prompt != "a b" {
		t.Errorf("cycled: %+v, %v", reqs, err)
	}
	for _, tc := range []struct{ name, text, want string }{
		{"bad JSON", "{\"prompt\": \n", "bad.jsonl:1"},
		{"two kinds", `{"prompt": "a", "prompt_ids": [1]}`, "exactly one"},
		{"none", `{"max_tokens": 3}`, "exactly one"},
		{"empty", "\n\n", "no requests"},
	} {
		_, err := LoadJSONL(write("bad.jsonl", tc.text), 0, 16)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestSynthetic(t *testing.T) {
	reqs, err := Synthetic(3, 50, 7, 10, func(id int) bool { return id >= 5 }, 42)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reqs {
		if len(r.PromptIDs) != 50 || r.MaxTokens != 7 {
			t.Fatalf("request %+v", r)
		}
		for _, id := range r.PromptIDs {
			if id >= 5 {
				t.Fatalf("skipped id %d drawn", id)
			}
		}
	}
	again, _ := Synthetic(3, 50, 7, 10, func(id int) bool { return id >= 5 }, 42)
	if fmt.Sprint(again) != fmt.Sprint(reqs) {
		t.Error("the same seed gave other prompts")
	}
	text, err := SyntheticText(2, 30, 4, 1)
	if err != nil || len(strings.Fields(text[0].Prompt)) != 30 {
		t.Errorf("text prompts %+v, %v", text, err)
	}
	if _, err := Synthetic(1, 0, 1, 10, nil, 0); err == nil {
		t.Error("zero input length accepted")
	}
}

func TestReports(t *testing.T) {
	cur := &Result{Target: "t", Requests: 10, RequestsPerSec: 2, OutputTokensPerSec: 100, TTFT: Dist{10, 10, 20, 30}, Latency: Dist{100, 90, 150, 200}, ITL: Dist{1, 1, 1, 1}}
	base := &Result{Target: "t", Requests: 10, RequestsPerSec: 1, OutputTokensPerSec: 100, TTFT: Dist{20, 20, 20, 30}, Latency: Dist{100, 90, 150, 100}}
	var buf bytes.Buffer
	if err := cur.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"requests/s", "output tokens/s", "time to first token", "inter-token latency", "end-to-end latency", "p99"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
	path := filepath.Join(t.TempDir(), "base.json")
	buf.Reset()
	if err := base.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadResult(path)
	if err != nil || !sameResult(loaded, base) {
		t.Fatalf("round trip: %+v, %v", loaded, err)
	}
	buf.Reset()
	if err := WriteComparison(&buf, cur, loaded); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"requests/s", "2.000x", "better", "ttft mean (ms)", "0.500x", "e2e latency p99 (ms)", "worse", "1.000x"} {
		if !strings.Contains(out, want) {
			t.Errorf("comparison lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "NaN") || !regexp.MustCompile(`itl mean \(ms\) +1\.00 +0\.00 +- `).MatchString(out) {
		t.Errorf("a figure missing from the baseline should show -:\n%s", out)
	}
}
