package server

import (
	"encoding/json"
	"net/http"
)

// /tokenize and /detokenize, in vLLM's shapes.

// tokenizeRequest is the body of POST /tokenize: a prompt, or chat messages rendered with
// the chat template.
type tokenizeRequest struct {
	Model    string                       `json:"model"`
	Prompt   *string                      `json:"prompt"`
	Messages []map[string]json.RawMessage `json:"messages"`
	// AddSpecialTokens adds the tokenizer's special tokens (such as BOS): by default to a
	// prompt, not to messages (their template writes them).
	AddSpecialTokens    *bool          `json:"add_special_tokens"`
	AddGenerationPrompt *bool          `json:"add_generation_prompt"`
	ChatTemplateKwargs  map[string]any `json:"chat_template_kwargs"`
	ReturnTokenStrs     bool           `json:"return_token_strs"`
}

type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []int    `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

type detokenizeRequest struct {
	Model  string `json:"model"`
	Tokens []int  `json:"tokens"`
}

type detokenizeResponse struct {
	Prompt string `json:"prompt"`
}

// handleTokenize serves POST /tokenize: {"prompt": "..."} or {"messages": [...]} to
// {"count": N, "max_model_len": M, "tokens": [...]}. The count may pass the context (that is
// what a client asks it to find out); the text may not pass the bytes the context bounds.
func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) error {
	var req tokenizeRequest
	if err := s.decodeBody(w, r, &req); err != nil {
		return err
	}
	if err := s.checkModel(req.Model); err != nil {
		return err
	}
	var (
		text       string
		param      string
		addSpecial bool
	)
	switch {
	case req.Prompt != nil && req.Messages != nil:
		return badParam("messages", "give prompt or messages, not both")
	case req.Prompt != nil:
		text, param, addSpecial = *req.Prompt, "prompt", true
		if len(text) > s.maxPromptBytes() {
			return s.textTooLong("prompt", len(text), false)
		}
	case req.Messages != nil:
		var err error
		if text, err = s.renderChat(req.Messages, req.AddGenerationPrompt, req.ChatTemplateKwargs); err != nil {
			return err
		}
		param = "messages"
	default:
		return badParam("prompt", "give prompt (a string) or messages (a list of chat messages)")
	}
	if req.AddSpecialTokens != nil {
		addSpecial = *req.AddSpecialTokens
	}
	ids, err := s.cfg.Tokenizer.Encode(text, addSpecial)
	if err != nil {
		return badParam(param, "cannot tokenize the %s: %v", param, err)
	}
	out := tokenizeResponse{Count: len(ids), MaxModelLen: s.cfg.ContextLength, Tokens: ids}
	if req.ReturnTokenStrs {
		out.TokenStrs = make([]string, len(ids))
		for i, id := range ids {
			out.TokenStrs[i], _ = s.cfg.Tokenizer.IDToken(id)
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// handleDetokenize serves POST /detokenize: {"tokens": [...]} to {"prompt": "..."}, special
// tokens included.
func (s *Server) handleDetokenize(w http.ResponseWriter, r *http.Request) error {
	var req detokenizeRequest
	if err := s.decodeBody(w, r, &req); err != nil {
		return err
	}
	if err := s.checkModel(req.Model); err != nil {
		return err
	}
	if req.Tokens == nil {
		return badParam("tokens", "tokens (a list of token ids) is required")
	}
	for _, id := range req.Tokens {
		if id < 0 || id >= s.vocab {
			return badParam("tokens", "token id %d is outside the vocabulary (size %d)", id, s.vocab)
		}
	}
	text, err := s.cfg.Tokenizer.Decode(req.Tokens, false)
	if err != nil {
		return badParam("tokens", "cannot decode the tokens: %v", err)
	}
	writeJSON(w, http.StatusOK, detokenizeResponse{Prompt: text})
	return nil
}
