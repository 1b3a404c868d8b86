package tokenizer

import (
	"path/filepath"
	"strings"
	"testing"
)

// benchText is about 4 KB of mixed text: prose, numbers, code, and a little non-English.
var benchText = strings.Repeat(`Loom compiles a language model once, as a plain graph of tensor operations, and then
rewrites it: it recognises normalisation layers, rotary embeddings and attention, splits the
weights across devices, and plugs in a paged key-value cache. The runtime schedules requests
in continuous batches; each request streams its tokens back as soon as they are sampled.
In 2024 the team measured 1,234 tokens/s on 8 GPUs (p50 latency 37.5 ms, p99 112 ms).

    func (e *Engine) Step(ctx context.Context) error {
        batch := e.sched.Next()          // up to 256 sequences
        if len(batch) == 0 { return nil }
        logits, err := e.exec.Run(ctx, batch.IDs(), batch.Positions())
        return errors.Join(err, e.sample(logits))
    }

Don't panic: it's "just" a tokenizer test — naïve café, Ærøskøbing, 東京は晴れ、気温は23度です。
Привет, мир! ¿Qué tal? 😀 👍🏽 `, 5)

func benchTokenizer(b *testing.B, name string) *Tokenizer {
	b.Helper()
	tok, err := LoadDir(filepath.Join("..", "testdata", name))
	if err != nil {
		b.Fatal(err)
	}
	return tok
}

var benchFixtures = []struct{ name, dir string }{
	{"llama3-bytelevel", "tiny-llama"},
	{"qwen2-bytelevel-nfc", "tiny-qwen2"},
	{"llama2-sentencepiece", "tiny-llama2"},
	{"mistral-metaspace", "tiny-mistral"},
}

// BenchmarkEncode encodes benchText with a warm word cache (the steady state of a server).
func BenchmarkEncode(b *testing.B) {
	for _, f := range benchFixtures {
		b.Run(f.name, func(b *testing.B) {
			tok := benchTokenizer(b, f.dir)
			b.SetBytes(int64(len(benchText)))
			for b.Loop() {
				if _, err := tok.Encode(benchText, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEncodeUncached encodes with the word cache turned off: every word is merged.
func BenchmarkEncodeUncached(b *testing.B) {
	for _, f := range benchFixtures {
		b.Run(f.name, func(b *testing.B) {
			tok := benchTokenizer(b, f.dir)
			tok.model.cache, tok.model.rawCache = newWordCache(0), newWordCache(0)
			b.SetBytes(int64(len(benchText)))
			for b.Loop() {
				if _, err := tok.Encode(benchText, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, f := range benchFixtures {
		b.Run(f.name, func(b *testing.B) {
			tok := benchTokenizer(b, f.dir)
			ids, _ := tok.Encode(benchText, false)
			b.SetBytes(int64(len(benchText)))
			for b.Loop() {
				if _, err := tok.Decode(ids, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkStream(b *testing.B) {
	for _, f := range benchFixtures {
		b.Run(f.name, func(b *testing.B) {
			tok := benchTokenizer(b, f.dir)
			ids, _ := tok.Encode(benchText, false)
			b.SetBytes(int64(len(benchText)))
			for b.Loop() {
				st := tok.NewStream()
				for _, id := range ids {
					if _, err := st.Next(id); err != nil {
						b.Fatal(err)
					}
				}
				st.Flush()
			}
		})
	}
}

func BenchmarkLoad(b *testing.B) {
	for b.Loop() {
		benchTokenizer(b, "tiny-llama")
	}
}
