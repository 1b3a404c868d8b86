package synth

import (
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/loom-ml/loom/model"
)

// byteToRune is GPT-2's byte-level alphabet: printable bytes map to themselves, the others to
// code points from 256 up.
func byteToRune() [256]rune {
	var m [256]rune
	n := 0
	for b := range 256 {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE {
			m[b] = rune(b)
		} else {
			m[b] = rune(256 + n)
			n++
		}
	}
	return m
}

// writeTokenizer writes a byte-level BPE tokenizer with no merges: each byte of the text is
// one token (ids 0-255; 3-258 for Mistral's vocabulary, whose <unk>, <s> and </s> take ids 0-2),
// and the shape's special tokens sit at the config's BOS and EOS ids.
func writeTokenizer(dir string, shape Shape, cfg *model.Config) error {
	first := 0 // the id of byte 0
	if shape.Chat == "mistral" {
		first = 3
	}
	vocab := map[string]int{}
	for b, r := range byteToRune() {
		vocab[string(r)] = first + b
	}
	var bosTok, eosTok, template string
	added := []map[string]any{}
	switch shape.Chat {
	case "mistral":
		bosTok, eosTok = "<s>", "</s>"
		template = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% else %}{{ message['content'] + '\n\n' }}{% endif %}{% endfor %}"
		vocab["<unk>"] = 0
		added = append(added, map[string]any{"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
	case "chatml":
		bosTok, eosTok = "<|endoftext|>", "<|im_end|>"
		template = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
	default:
		bosTok, eosTok = "<|begin_of_text|>", "<|eot_id|>"
		template = "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
	}
	for _, s := range []struct {
		tok string
		id  int
	}{{bosTok, cfg.BOSTokenID}, {eosTok, firstOr(cfg.EOSTokenIDs, cfg.BOSTokenID+1)}} {
		if s.id < 0 {
			continue
		}
		vocab[s.tok] = s.id
		added = append(added, map[string]any{"id": s.id, "content": s.tok, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
	}
	// Llama 3 and Mistral put BOS in front of every encoding; ChatML models add nothing.
	post := map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true}
	if shape.Chat == "llama3" || shape.Chat == "mistral" {
		post = map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": bosTok, "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"pair":           []any{map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "B", "type_id": 1}}},
			"special_tokens": map[string]any{bosTok: map[string]any{"id": bosTok, "ids": []int{cfg.BOSTokenID}, "tokens": []string{bosTok}}},
		}
	}
	tok := map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": added, "normalizer": nil,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"post_processor": post,
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": []string{}},
	}
	data, err := json.Marshal(tok)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), data, 0o644); err != nil {
		return err
	}
	tc, _ := json.MarshalIndent(map[string]any{"bos_token": bosTok, "eos_token": eosTok, "chat_template": template,
		"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072}, "", "  ")
	return os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), tc, 0o644)
}

func firstOr(ids []int, def int) int {
	if len(ids) > 0 {
		return ids[0]
	}
	return def
}
