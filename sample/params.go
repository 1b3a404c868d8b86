// Package sample chooses the next token from logits: greedy, temperature, top-k, top-p,
// min-p, seeded randomness, repetition/presence/frequency penalties and log-probabilities.
package sample

import (
	"fmt"
	"math"
)

// Params configure sampling for one request. The zero value is greedy decoding.
type Params struct {
	// Temperature divides the logits; 0 means greedy (argmax, ties to the lowest id).
	Temperature float64
	// TopK keeps the K most likely tokens; 0 keeps all.
	TopK int
	// TopP keeps the smallest set of most likely tokens whose probability reaches P; 0 or 1 keeps all.
	TopP float64
	// MinP drops tokens whose probability is below MinP times the top token's; 0 keeps all.
	MinP float64
	// Seed makes sampling reproducible when HasSeed is set: the same seed, prompt and
	// parameters give the same tokens.
	Seed    int64
	HasSeed bool
	// RepetitionPenalty (> 0, 1 = none) divides positive logits and multiplies negative ones
	// of tokens seen in the prompt or output (Hugging Face / vLLM semantics).
	RepetitionPenalty float64
	// PresencePenalty subtracts a constant from the logits of tokens already generated;
	// FrequencyPenalty subtracts it times their count (OpenAI semantics, -2..2).
	PresencePenalty, FrequencyPenalty float64
	// Logprobs asks for the chosen token's log-probability; TopLogprobs (0-20) for that many
	// most likely alternatives as well.
	Logprobs    bool
	TopLogprobs int
}

// TokenLogprob is a token and its log-probability.
type TokenLogprob struct {
	Token   int
	Logprob float32
}

// Validate checks every parameter's range; the error names the parameter as the OpenAI API
// spells it.
func (p Params) Validate() error {
	switch {
	case math.IsNaN(p.Temperature) || p.Temperature < 0 || p.Temperature > 2:
		return fmt.Errorf("temperature must be between 0 and 2, got %g", p.Temperature)
	case p.TopK < 0:
		return fmt.Errorf("top_k must be >= 0, got %d", p.TopK)
	case math.IsNaN(p.TopP) || p.TopP < 0 || p.TopP > 1:
		return fmt.Errorf("top_p must be between 0 and 1, got %g", p.TopP)
	case math.IsNaN(p.MinP) || p.MinP < 0 || p.MinP > 1:
		return fmt.Errorf("min_p must be between 0 and 1, got %g", p.MinP)
	case math.IsNaN(p.RepetitionPenalty) || p.RepetitionPenalty < 0 || p.RepetitionPenalty > 10:
		return fmt.Errorf("repetition_penalty must be between 0 (unset) and 10, got %g", p.RepetitionPenalty)
	case math.IsNaN(p.PresencePenalty) || p.PresencePenalty < -2 || p.PresencePenalty > 2:
		return fmt.Errorf("presence_penalty must be between -2 and 2, got %g", p.PresencePenalty)
	case math.IsNaN(p.FrequencyPenalty) || p.FrequencyPenalty < -2 || p.FrequencyPenalty > 2:
		return fmt.Errorf("frequency_penalty must be between -2 and 2, got %g", p.FrequencyPenalty)
	case p.TopLogprobs < 0 || p.TopLogprobs > 20:
		return fmt.Errorf("top_logprobs must be between 0 and 20, got %d", p.TopLogprobs)
	}
	return nil
}

// Greedy reports whether the parameters pick the argmax.
func (p Params) Greedy() bool { return p.Temperature == 0 }
