// Package all registers every architecture frontend Loom ships; import it for its side effect.
package all

import (
	_ "github.com/loom-ml/loom/model/llama" // Llama, Mistral, Qwen2, Qwen3, Mixtral, Qwen2-MoE, Qwen3-MoE
)
