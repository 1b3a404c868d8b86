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
	if err := decodeBody(w, r, s.cfg.MaxBodyBytes, &req); err != nil {
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
	gen, err := s.begin(r.Context(), id, start, g)
	if err != nil {
		return err
	}
	created := time.Now().Unix()
	lps := &logprobWriter{s: s}
	logprobsOf := func(p piece) *chatLogprobs {
		if !g.sampling.Logprobs {
			return nil
		}
		return lps.chat(p)
	}

	if !g.stream {
		var sb strings.Builder
		var all *chatLogprobs
		res, err := gen.run(func(p piece) error {
			sb.WriteString(p.text)
			if lp := logprobsOf(p); lp != nil {
				if all == nil {
					all = &chatLogprobs{Content: []chatTokenLogprob{}}
				}
				all.Content = append(all.Content, lp.Content...)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if g.sampling.Logprobs && all == nil {
			all = &chatLogprobs{Content: []chatTokenLogprob{}}
		}
		text := sb.String()
		writeJSON(w, http.StatusOK, chatCompletion{ID: id, Object: "chat.completion", Created: created, Model: s.cfg.Model,
			Choices: []chatChoice{{Message: &chatMessage{Role: "assistant", Content: &text}, Logprobs: all, FinishReason: &res.finish}},
			Usage:   res.usage()})
		return nil
	}

	chunk := func(delta *chatMessage, lp *chatLogprobs, finish *string) chatCompletion {
		return chatCompletion{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.cfg.Model,
			Choices: []chatChoice{{Delta: delta, Logprobs: lp, FinishReason: finish}}}
	}
	sse, err := startSSE(w)
	if err != nil {
		gen.abort()
		return err
	}
	empty := ""
	if err := sse.send(chunk(&chatMessage{Role: "assistant", Content: &empty}, nil, nil)); err != nil {
		gen.abort()
		return err
	}
	res, err := gen.run(func(p piece) error {
		text := p.text
		return sse.send(chunk(&chatMessage{Content: &text}, logprobsOf(p), nil))
	})
	if err != nil {
		if !errors.Is(err, errClientGone) {
			sse.fail(err)
		}
		return err
	}
	if err := sse.send(chunk(&chatMessage{}, nil, &res.finish)); err != nil {
		return err
	}
	if g.includeUsage {
		last := chatCompletion{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.cfg.Model, Choices: []chatChoice{}, Usage: res.usage()}
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
// without adding special tokens again (the template writes them), as transformers does.
func (s *Server) chatPrompt(req *chatRequest) ([]int, error) {
	msgs, err := parseMessages(req.Messages)
	if err != nil {
		return nil, err
	}
	addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	text, err := s.cfg.ChatTemplate.RenderWith(msgs, chattemplate.Options{AddGenerationPrompt: addGen, Vars: req.ChatTemplateKwargs})
	if err != nil {
		var raise *chattemplate.RaiseError
		var reserved *chattemplate.ReservedVarError
		if errors.As(err, &reserved) {
			return nil, badParam("chat_template_kwargs", "chat_template_kwargs may not set %q: the server sets it", reserved.Name)
		}
		if errors.As(err, &raise) {
			return nil, badParam("messages", "%s", raise.Message)
		}
		return nil, badParam("messages", "cannot render the chat template: %v", err)
	}
	ids, err := s.cfg.Tokenizer.Encode(text, false)
	if err != nil {
		return nil, badParam("messages", "cannot tokenize the rendered conversation: %v", err)
	}
	return ids, nil
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
