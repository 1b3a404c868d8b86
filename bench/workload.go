package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
)

// Synthetic returns n requests, each with a prompt of inputLen token ids drawn at random
// from [0, vocab) (skipping ids for which skip returns true, such as special tokens) and
// maxTokens outputLen. Sent as token ids, prompts have exactly inputLen tokens.
func Synthetic(n, inputLen, outputLen, vocab int, skip func(id int) bool, seed uint64) ([]Request, error) {
	if n < 1 || inputLen < 1 || outputLen < 1 {
		return nil, fmt.Errorf("bench: requests (%d), input length (%d) and output length (%d) must be positive", n, inputLen, outputLen)
	}
	var ok []int
	for id := range vocab {
		if skip == nil || !skip(id) {
			ok = append(ok, id)
		}
	}
	if len(ok) == 0 {
		return nil, errors.New("bench: no token ids to draw prompts from")
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	reqs := make([]Request, n)
	for i := range reqs {
		ids := make([]int, inputLen)
		for j := range ids {
			ids[j] = ok[rng.IntN(len(ok))]
		}
		reqs[i] = Request{PromptIDs: ids, MaxTokens: outputLen}
	}
	return reqs, nil
}

// words make synthetic text prompts; each is one token for most tokenizers.
var words = strings.Fields(`the of and to in is was for on that with as by at from his it an were are which
this be or has had first one their its new after who they have two her she been other when there all
during into school time may years more most only over city some world would where later up such used many
can state about national out known university united then made`)

// SyntheticText returns n requests with text prompts of inputLen common words (about
// inputLen tokens with most tokenizers, for servers whose tokenizer is unknown) and maxTokens
// outputLen.
func SyntheticText(n, inputLen, outputLen int, seed uint64) ([]Request, error) {
	if n < 1 || inputLen < 1 || outputLen < 1 {
		return nil, fmt.Errorf("bench: requests (%d), input length (%d) and output length (%d) must be positive", n, inputLen, outputLen)
	}
	rng := rand.New(rand.NewPCG(seed, 2))
	reqs := make([]Request, n)
	for i := range reqs {
		ws := make([]string, inputLen)
		for j := range ws {
			ws[j] = words[rng.IntN(len(words))]
		}
		reqs[i] = Request{Prompt: strings.Join(ws, " "), MaxTokens: outputLen}
	}
	return reqs, nil
}

// datasetLine is one line of a JSONL dataset.
type datasetLine struct {
	Prompt    *string   `json:"prompt"`
	PromptIDs []int     `json:"prompt_ids"`
	Messages  []Message `json:"messages"`
	MaxTokens int       `json:"max_tokens"`
	OutputLen int       `json:"output_len"`
}

// LoadJSONL reads a dataset: one JSON object per line with "prompt" (text), "prompt_ids"
// (token ids) or "messages" (chat, a list of {role, content}), and optionally "max_tokens"
// (or "output_len"); lines without one get outputLen. Blank lines are skipped. With n > 0
// the first n requests are returned, cycling through the file when it has fewer.
func LoadJSONL(path string, n, outputLen int) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer f.Close()
	var reqs []Request
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		var d datasetLine
		if err := json.Unmarshal([]byte(text), &d); err != nil {
			return nil, fmt.Errorf("bench: %s:%d: %w", path, line, err)
		}
		r := Request{PromptIDs: d.PromptIDs, Messages: d.Messages, MaxTokens: outputLen}
		if d.Prompt != nil {
			r.Prompt = *d.Prompt
		}
		kinds := 0
		for _, has := range []bool{d.Prompt != nil, d.PromptIDs != nil, d.Messages != nil} {
			if has {
				kinds++
			}
		}
		if kinds != 1 {
			return nil, fmt.Errorf("bench: %s:%d: give exactly one of prompt, prompt_ids and messages", path, line)
		}
		if d.MaxTokens > 0 {
			r.MaxTokens = d.MaxTokens
		} else if d.OutputLen > 0 {
			r.MaxTokens = d.OutputLen
		}
		if r.MaxTokens < 1 {
			return nil, fmt.Errorf("bench: %s:%d: no max_tokens and no default output length", path, line)
		}
		reqs = append(reqs, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("bench: %s: %w", path, err)
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("bench: %s holds no requests", path)
	}
	if n > 0 {
		out := make([]Request, n)
		for i := range out {
			out[i] = reqs[i%len(reqs)]
		}
		reqs = out
	}
	return reqs, nil
}
