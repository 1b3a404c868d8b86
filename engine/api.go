package engine

import "github.com/loom-ml/loom/sample"

// Request is one generation request, in tokens. Text-level concerns (chat templates, stop
// strings, detokenization) belong to the caller; the engine works on token ids.
type Request struct {
	// ID names the request in logs and metrics; the engine assigns one when empty.
	ID string
	// Prompt is the prompt's token ids (at least one).
	Prompt []int
	// MaxTokens is the most tokens to generate (>= 1). The prompt plus MaxTokens must fit the
	// model's context (max_position_embeddings) or Submit fails.
	MaxTokens int
	// Sampling chooses each token; the zero value is greedy.
	Sampling sample.Params
	// StopTokenIDs end generation when produced (the token is reported, with FinishStop).
	// When IgnoreEOS is false the model's EOS ids are added to them.
	StopTokenIDs []int
	IgnoreEOS    bool
}

// FinishReason says why a request ended.
type FinishReason string

// Finish reasons, as the OpenAI API spells them where it has them.
const (
	FinishNone      FinishReason = ""          // not finished
	FinishStop      FinishReason = "stop"      // a stop token was produced
	FinishLength    FinishReason = "length"    // MaxTokens reached
	FinishCancelled FinishReason = "cancelled" // the request's context ended
	FinishError     FinishReason = "error"     // the engine failed; Event.Err says why
)

// Event is one step of a request's stream: a generated token, or the end.
type Event struct {
	// Token is the generated token id (valid when Finish is FinishNone, FinishStop or FinishLength).
	Token int
	// Logprob is the chosen token's log-probability under the sampling distribution's
	// logits (after penalties and temperature), when the request asked for log-probabilities.
	Logprob float32
	// TopLogprobs holds the most likely tokens at this step (Request.Sampling.TopLogprobs of them).
	TopLogprobs []sample.TokenLogprob
	// Finish is set on the last event of the stream.
	Finish FinishReason
	// Err is set with FinishError.
	Err error
	// PromptTokens and GeneratedTokens count tokens so far (for usage).
	PromptTokens, GeneratedTokens int
}

// Stats is a snapshot of the engine's state, for metrics and admission decisions.
type Stats struct {
	// Running and Waiting count the requests in the running batch and those waiting to
	// start: in the queue, and held for a slot (Options.MaxConcurrent).
	Running, Waiting       int
	KVBlocksUsed, KVBlocks int // paged KV cache blocks in use and in total
	BlockSize              int // tokens per KV block
	StepsTotal             int64
	PromptTokensTotal      int64
	GeneratedTokensTotal   int64
	PreemptionsTotal       int64
	// AheadStepsTotal counts the steps launched before the previous step's tokens were
	// known (see Options.SyncSteps).
	AheadStepsTotal int64
	// StepSeconds is the time spent in steps; ModelSeconds the part of it running the model
	// (inputs, executables, logits), SampleSeconds the part choosing tokens.
	StepSeconds, ModelSeconds, SampleSeconds float64
	// DeviceSeconds is the GPU time of rank 0's model runs (inputs copied in, kernels) in
	// those steps; 0 on the CPU. ModelSeconds minus it is what the host adds.
	DeviceSeconds float64
	// TimedSteps counts the steps those times cover: all, or those since ResetStats.
	TimedSteps int64

	// Prefix caching (Options.DisablePrefixCaching). KVBlocksCached counts the blocks no
	// sequence holds that keep a cached prefix (not in KVBlocksUsed: evicted when needed);
	// KVBlocksPeak is the most blocks ever in use at once.
	KVBlocksCached, KVBlocksPeak int
	// CachedTokensTotal counts the tokens that sequences took from the prefix cache when
	// they started (or restarted after a preemption) instead of computing them;
	// PrefixCacheHitBlocks the blocks. ComputedTokensTotal counts the tokens the model ran:
	// prompts beyond their cached prefix, recomputations and decodes.
	CachedTokensTotal, ComputedTokensTotal, PrefixCacheHitBlocks int64
}
