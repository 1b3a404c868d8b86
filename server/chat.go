package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/loom-ml/loom/chattemplate"
)

// handleChat serves POST /v1/chat/completions.
func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) error {
	start := time.Now()
	var req chatRequest
	if err := s.decodeBody(w, r, &req); err != nil {
		return err
	}
	g := &genRequest{}
	if err := s.sampling(&req.samplingRequest, g); err != nil {
		return err
	}
	if s.cfg.ChatTemplate == nil {
		return badParam("messages", "the model %q has no chat template; use /v1/completions", s.cfg.Model)
	}
	if present(req.Tools) {
		return badParam("tools", "tools are not supported")
	}
	if present(req.ToolChoice) && !bytes.Equal(bytes.TrimSpace(req.ToolChoice), []byte(`"none"`)) {
		return badParam("tool_choice", "tool_choice is not supported")
	}
	if req.ResponseFormat != nil && req.ResponseFormat.Type != "" && req.ResponseFormat.Type != "text" {
		return badParam("response_format", "response_format %q is not supported; only text", req.ResponseFormat.Type)
	}
	if req.TopLogprobs != nil {
		if n := *req.TopLogprobs; n < 0 || n > 20 {
			return badParam("top_logprobs", "top_logprobs must be between 0 and 20, got %d", n)
		}
		if !req.Logprobs {
			return badParam("top_logprobs", "top_logprobs needs logprobs=true")
		}
		g.sampling.TopLogprobs = *req.TopLogprobs
	}
	g.sampling.Logprobs = req.Logprobs
	ids, err := s.chatPrompt(&req)
	if err != nil {
		return err
	}
	g.prompt = ids
	if err := s.fitContext(g, "messages", 0); err != nil {
		return err
	}

	id := newID("chatcmpl-")
	gens, err := s.begin(r.Context(), id, start, g)
	if err != nil {
		return err
	}
	created := time.Now().Unix()
	lps := make([]*logprobWriter, len(gens))
	for i := range lps {
		lps[i] = &logprobWriter{s: s}
	}
	logprobsOf := func(i int, p piece) *chatLogprobs {
		if !g.sampling.Logprobs {
			return nil
		}
		return lps[i].chat(p)
	}

	if !g.stream {
		texts := make([]strings.Builder, len(gens))
		all := make([]*chatLogprobs, len(gens))
		results, err := runAll(gens, func(i int, p piece) error {
			texts[i].WriteString(p.text)
			if lp := logprobsOf(i, p); lp != nil {
				if all[i] == nil {
					all[i] = &chatLogprobs{Content: []chatTokenLogprob{}}
				}
				all[i].Content = append(all[i].Content, lp.Content...)
			}
			return nil
		}, nil)
		if err != nil {
			return err
		}
		out := chatCompletion{ID: id, Object: "chat.completion", Created: created, Model: s.cfg.Model, Usage: usageOf(results)}
		for i, res := range results {
			if g.sampling.Logprobs && all[i] == nil {
				all[i] = &chatLogprobs{Content: []chatTokenLogprob{}}
			}
			text := texts[i].String()
			out.Choices = append(out.Choices, chatChoice{Index: i, Message: &chatMessage{Role: "assistant", Content: &text}, Logprobs: all[i], FinishReason: &res.finish})
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}

	chunk := func(i int, delta *chatMessage, lp *chatLogprobs, finish *string) chatCompletion {
		return chatCompletion{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.cfg.Model,
			Choices: []chatChoice{{Index: i, Delta: delta, Logprobs: lp, FinishReason: finish}}}
	}
	abort := func() {
		for _, gen := range gens {
			gen.abort()
		}
	}
	sse, err := startSSE(w)
	if err != nil {
		abort()
		return err
	}
	empty := ""
	for i := range gens {
		if err := sse.send(chunk(i, &chatMessage{Role: "assistant", Content: &empty}, nil, nil)); err != nil {
			abort()
			return err
		}
	}
	results, err := runAll(gens,
		func(i int, p piece) error {
			text := p.text
			return sse.send(chunk(i, &chatMessage{Content: &text}, logprobsOf(i, p), nil))
		},
		func(i int, res result) error { return sse.send(chunk(i, &chatMessage{}, nil, &res.finish)) })
	if err != nil {
		if !errors.Is(err, errClientGone) {
			sse.fail(err)
		}
		return err
	}
	if g.includeUsage {
		last := chatCompletion{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.cfg.Model, Choices: []chatChoice{}, Usage: usageOf(results)}
		if err := sse.send(last); err != nil {
			return err
		}
	}
	return sse.done()
}

// present reports whether a raw JSON field is given and not null.
func present(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
}

// chatPrompt renders the request's messages with the chat template and encodes the text
// without adding special tokens again (the template writes them), as transformers does. A
// conversation that cannot fit the context is refused before it is tokenized in full.
func (s *Server) chatPrompt(req *chatRequest) ([]int, error) {
	text, err := s.renderChat(req.Messages, req.AddGenerationPrompt, req.ChatTemplateKwargs)
	if err != nil {
		return nil, err
	}
	ids, over, err := encodeWithin(s.cfg.Tokenizer.Encode, text, false, s.cfg.ContextLength)
	if err != nil {
		return nil, badParam("messages", "cannot tokenize the rendered conversation: %v", err)
	}
	if over {
		return nil, s.tooManyTokens("messages", len(ids), true)
	}
	return ids, nil
}

// renderChat renders messages with the chat template (an assistant turn opened unless
// addGenerationPrompt is false). Text longer than the context can hold is refused, before
// rendering and after.
func (s *Server) renderChat(raw []map[string]json.RawMessage, addGenerationPrompt *bool, kwargs map[string]any) (string, error) {
	if s.cfg.ChatTemplate == nil {
		return "", badParam("messages", "the model %q has no chat template; use /v1/completions", s.cfg.Model)
	}
	msgs, err := parseMessages(raw)
	if err != nil {
		return "", err
	}
	// The messages' text is refused by its length before the template copies it.
	total := 0
	for _, m := range msgs {
		total += len(m.Content)
	}
	if total > s.maxPromptBytes() {
		return "", s.textTooLong("messages", total, false)
	}
	addGen := addGenerationPrompt == nil || *addGenerationPrompt
	text, err := s.cfg.ChatTemplate.RenderWith(msgs, chattemplate.Options{AddGenerationPrompt: addGen, Vars: kwargs})
	if err != nil {
		var raise *chattemplate.RaiseError
		var reserved *chattemplate.ReservedVarError
		if errors.As(err, &reserved) {
			return "", badParam("chat_template_kwargs", "chat_template_kwargs may not set %q: the server sets it", reserved.Name)
		}
		if errors.As(err, &raise) {
			return "", badParam("messages", "%s", raise.Message)
		}
		return "", badParam("messages", "cannot render the chat template: %v", err)
	}
	if len(text) > s.maxPromptBytes() {
		return "", s.textTooLong("messages", len(text), false)
	}
	return text, nil
}

// parseMessages reads OpenAI chat messages. Content may be a string, null, or a list of
// text parts (joined with newlines); other keys (name, tool_calls, ...) go to the template
// as they are.
func parseMessages(raw []map[string]json.RawMessage) ([]chattemplate.Message, error) {
	if len(raw) == 0 {
		return nil, badParam("messages", "messages must be a non-empty list")
	}
	out := make([]chattemplate.Message, len(raw))
	for i, m := range raw {
		where := fmt.Sprintf("messages[%d]", i)
		var role string
		if err := json.Unmarshal(m["role"], &role); err != nil || role == "" {
			return nil, badParam(where+".role", "%s.role must be a non-empty string", where)
		}
		msg := chattemplate.Message{Role: role}
		for k, v := range m {
			switch k {
			case "role":
			case "content":
				if err := setContent(&msg, v); err != nil {
					return nil, badParam(where+".content", "%s.content: %v", where, err)
				}
			default:
				if msg.Fields == nil {
					msg.Fields = map[string]any{}
				}
				msg.Fields[k] = v
			}
		}
		if _, ok := m["content"]; !ok {
			if msg.Fields == nil {
				msg.Fields = map[string]any{}
			}
			msg.Fields["content"] = nil
		}
		out[i] = msg
	}
	return out, nil
}

// setContent sets a message's content from its JSON value.
func setContent(msg *chattemplate.Message, raw json.RawMessage) error {
	if !present(raw) {
		if msg.Fields == nil {
			msg.Fields = map[string]any{}
		}
		msg.Fields["content"] = nil
		return nil
	}
	if err := json.Unmarshal(raw, &msg.Content); err == nil {
		return nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return errors.New("must be a string or a list of content parts")
	}
	texts := make([]string, 0, len(parts))
	for j, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return fmt.Errorf("part %d: only text parts are supported, got type %q", j, p.Type)
		}
		texts = append(texts, *p.Text)
	}
	msg.Content = strings.Join(texts, "\n")
	return nil
}
