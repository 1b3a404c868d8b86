package engine_test

import (
	"context"
	"fmt"

	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/sample"
)

// Two requests share the running batch: one greedy, one sampled with a seed.
func ExampleEngine() {
	ctx := context.Background()
	m, err := engine.Load(ctx, "../testdata/tiny-llama", engine.LoadOptions{Optimize: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	e, err := engine.New(ctx, m, engine.Options{MaxBatch: 4, KVBlocks: 32})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	greedy, err := e.Submit(ctx, engine.Request{Prompt: []int{0, 56, 76}, MaxTokens: 5, IgnoreEOS: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	seeded, err := e.Submit(ctx, engine.Request{Prompt: []int{0, 56, 76}, MaxTokens: 5, IgnoreEOS: true,
		Sampling: sample.Params{Temperature: 0.8, TopP: 0.9, Seed: 7, HasSeed: true}})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, st := range []*engine.Stream{greedy, seeded} {
		toks, last, err := st.Collect(ctx)
		fmt.Println(len(toks), last.Finish, err)
	}
	// Output:
	// 5 length <nil>
	// 5 length <nil>
}
