package server

import (
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/loom-ml/loom/engine"
)

// TestEngineNSharesPrompt: the n choices of a completion share the prompt's KV blocks (the
// engine's prefix cache): the prompt's full blocks are computed once, the other choices take
// them from the cache, and each choice is the completion of one request with its seed.
func TestEngineNSharesPrompt(t *testing.T) {
	env := newRealEnv(t, "tiny-llama", engine.Options{MaxBatch: 8, KVBlocks: 64})
	prompt := make([]int, 100) // six full blocks of 16 and 4 tokens
	for i := range prompt {
		prompt[i] = 20 + 7*i%400
	}
	const n = 4
	params := openai.CompletionNewParams{
		Model: "tiny-llama", Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: ids64(prompt)},
		MaxTokens: openai.Int(6), Temperature: openai.Float(1), Seed: openai.Int(41), N: openai.Int(n),
	}
	ignoreEOS := option.WithJSONSet("ignore_eos", true)
	c, err := env.client.Completions.New(ctxT(t), params, ignoreEOS)
	if err != nil {
		t.Fatal(err)
	}
	st := env.engine.Stats()
	if len(c.Choices) != n || st.CachedTokensTotal != (n-1)*96 || st.ComputedTokensTotal != 100+(n-1)*4+n*5 {
		t.Fatalf("%d choices; engine took %d tokens from the cache and computed %d, want %d and %d",
			len(c.Choices), st.CachedTokensTotal, st.ComputedTokensTotal, (n-1)*96, 100+(n-1)*4+n*5)
	}
	if got := env.metric(t, "loom_prefix_cache_hit_tokens_total"); got != (n-1)*96 {
		t.Errorf("loom_prefix_cache_hit_tokens_total %v, want %d", got, (n-1)*96)
	}
	if got := env.metric(t, "loom_kv_cache_blocks_cached"); got != 6 {
		t.Errorf("loom_kv_cache_blocks_cached %v, want the prompt's 6 full blocks", got)
	}
	for _, ch := range c.Choices {
		one := params
		one.N, one.Seed = openai.Int(1), openai.Int(41+ch.Index)
		alone, err := env.client.Completions.New(ctxT(t), one, ignoreEOS)
		if err != nil {
			t.Fatal(err)
		}
		if alone.Choices[0].Text != ch.Text {
			t.Errorf("choice %d: %q, alone with seed %d: %q", ch.Index, ch.Text, 41+ch.Index, alone.Choices[0].Text)
		}
	}
}
