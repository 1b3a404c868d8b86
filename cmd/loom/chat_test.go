package main

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/loom-ml/loom/chattemplate"
	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/tokenizer"
)

// failingExe runs the model until its run number failAt, which fails, as a device that
// breaks in the middle of a generation.
type failingExe struct {
	engine.Executable
	failAt int32
	calls  atomic.Int32
}

func (f *failingExe) Run(ctx context.Context, in map[string]*tensor.Tensor) ([]*tensor.Tensor, error) {
	if f.calls.Add(1) == f.failAt {
		return nil, errors.New("device on fire")
	}
	return f.Executable.Run(ctx, in)
}

// TestChatFailsMidReply: when the engine fails in the middle of a reply, chat has printed
// the tokens that came before, and ends with an error that says generation failed and why
// (loom prints it and exits with status 1), leaving the failed turn out of the history.
func TestChatFailsMidReply(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-qwen2")
	ctx := context.Background()
	m, err := engine.Load(ctx, dir, engine.LoadOptions{Optimize: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// Run 1 is the prompt's prefill (its token is the reply's first), run 2 the first
	// decode step: the reply fails after two tokens.
	exe := &failingExe{Executable: m.Program, failAt: 3}
	eng, err := engine.NewRanks(ctx, []engine.Rank{{Graph: m.Graph, Exe: exe}},
		engine.ModelInfo{MaxPositions: m.Config.MaxPositionEmbeddings, EOSTokenIDs: m.EOSTokenIDs()}, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chattemplate.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	c := &chatSession{eng: eng, tok: tok, tmpl: tmpl, maxTokens: 6, ctxLen: m.Config.MaxPositionEmbeddings, system: "Be brief.", out: &out}
	err = c.run(ctx, strings.NewReader("Hello!\nnever answered\n"))
	if err == nil || err.Error() != "generate: step: device on fire" {
		t.Fatalf("chat ended with %v, want the error %q", err, "generate: step: device on fire")
	}
	if n := exe.calls.Load(); n != 3 {
		t.Errorf("the model ran %d times, want 3: chat went on after the failure", n)
	}
	if want := greedyReply(t, dir, "Be brief.", "Hello!", 2); out.String() != want {
		t.Errorf("chat printed %q before the failure, want the first two tokens' text %q", out.String(), want)
	}
	if len(c.history) != 1 || c.history[0].Role != "system" {
		t.Errorf("history %+v after the failed turn, want the system message only", c.history)
	}
}
