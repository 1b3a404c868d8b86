package synth

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

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

// writeTokenizer writes a byte-level BPE tokenizer whose ids cover the whole vocabulary, so
// that every id the model can produce decodes to text. Each byte of the text is a token (ids
// 0-255; 3-258 for Mistral's vocabulary, whose <unk>, <s> and </s> take ids 0-2); the
// shape's special tokens sit at the config's BOS and EOS ids and the ids its chat template
// names, and the rest of the ids from the first special token up (Llama 3's 256, Qwen's
// padded tail) are reserved special tokens, as in the released tokenizers. The ids left
// between are BPE merges of lowercase letters (with and without a leading space), each
// reachable: encoding its text gives that one id (see fillMerges).
func writeTokenizer(dir string, shape Shape, cfg *model.Config) error {
	first := 0 // the id of byte 0
	if shape.Chat == "mistral" {
		first = 3
	}
	var bosTok, eosTok, template string
	special := map[int]string{} // id: content
	switch shape.Chat {
	case "mistral":
		bosTok, eosTok = "<s>", "</s>"
		template = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% else %}{{ message['content'] + '\n\n' }}{% endif %}{% endfor %}"
		special[0] = "<unk>"
	case "chatml":
		bosTok, eosTok = "<|endoftext|>", "<|im_end|>"
		template = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
	default:
		bosTok, eosTok = "<|begin_of_text|>", "<|eot_id|>"
		template = "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
	}
	bos, eos := cfg.BOSTokenID, firstOr(cfg.EOSTokenIDs, cfg.BOSTokenID+1)
	if bos >= 0 {
		special[bos] = bosTok
	}
	if eos >= 0 {
		special[eos] = eosTok
	}
	// The template's own markers, at the released tokenizers' offsets from BOS where free.
	var markers map[string]int
	switch shape.Chat {
	case "chatml":
		markers = map[string]int{"<|im_start|>": 1}
	case "llama3":
		markers = map[string]int{"<|end_of_text|>": 1, "<|start_header_id|>": 6, "<|end_header_id|>": 7}
	}
	for _, m := range slices.Sorted(maps.Keys(markers)) {
		if bos < 0 {
			break
		}
		id := bos + markers[m]
		for special[id] != "" {
			id++
		}
		special[id] = m
	}
	vocabSize := cfg.VocabSize
	if shape.Chat != "mistral" && bos >= first+256 && bos < vocabSize {
		for id, n := bos, 0; id < vocabSize; id++ {
			if special[id] == "" {
				special[id] = fmt.Sprintf("<|reserved_special_token_%d|>", n)
				n++
			}
		}
	}
	// The regular ids: every id below the vocabulary size that no special token takes.
	var regular []int
	for id := 0; id < vocabSize; id++ {
		if special[id] == "" {
			regular = append(regular, id)
		}
	}
	if len(regular) < 256 {
		return fmt.Errorf("tokenizer: vocab_size %d leaves %d ids for the 256 bytes", vocabSize, len(regular))
	}
	if first > 0 && regular[0] != first {
		return fmt.Errorf("tokenizer: byte 0 should take id %d, but %d is the first free id", first, regular[0])
	}
	vocab := map[string]int{}
	for b, r := range byteToRune() {
		vocab[string(r)] = regular[b]
	}
	merges := fillMerges(vocab, regular[256:])
	added := []map[string]any{}
	for _, id := range slices.Sorted(maps.Keys(special)) {
		added = append(added, map[string]any{"id": id, "content": special[id], "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
	}
	if shape.Chat == "mistral" {
		vocab["<unk>"] = 0 // the BPE model's unk_token
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
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges},
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

// fillMerges gives each of ids a BPE token and returns the merges that make them, in rank
// order. The tokens are strings of lowercase letters, alone or after a space (one word to the
// byte-level pre-tokenizer), shortest first. A string becomes the next token only when the
// merges so far encode it as exactly two tokens, which the new merge joins: BPE applies merges
// lowest rank first, so later merges never change that encoding, and every token stays
// reachable (encoding its text gives its id).
func fillMerges(vocab map[string]int, ids []int) []string {
	ranks := map[[2]string]int{}
	var merges []string
	space := string(byteToRune()[' '])
	letters := make([]string, 26)
	for i := range letters {
		letters[i] = string(rune('a' + i))
	}
	next := 0
	// candidates of n letters: all strings over a-z, each alone and after a space.
	words := []string{""}
	for n := 1; next < len(ids); n++ {
		var longer []string
		for _, w := range words {
			for _, l := range letters {
				longer = append(longer, w+l)
			}
		}
		words = longer
		for _, prefix := range []string{"", space} {
			for _, w := range words {
				if next == len(ids) {
					return merges
				}
				s := prefix + w
				if len([]rune(s)) < 2 {
					continue
				}
				parts := bpe(s, ranks)
				if len(parts) != 2 {
					continue
				}
				ranks[[2]string{parts[0], parts[1]}] = len(merges)
				merges = append(merges, parts[0]+" "+parts[1])
				vocab[s] = ids[next]
				next++
			}
		}
	}
	return merges
}

// bpe splits word into its symbols and applies the merges of ranks, lowest rank first.
func bpe(word string, ranks map[[2]string]int) []string {
	var parts []string
	for _, r := range word {
		parts = append(parts, string(r))
	}
	for len(parts) > 1 {
		best, at := -1, -1
		for i := 0; i+1 < len(parts); i++ {
			if r, ok := ranks[[2]string{parts[i], parts[i+1]}]; ok && (best < 0 || r < best) {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		parts[at] += parts[at+1]
		parts = append(parts[:at+1], parts[at+2:]...)
	}
	return parts
}

func firstOr(ids []int, def int) int {
	if len(ids) > 0 {
		return ids[0]
	}
	return def
}
