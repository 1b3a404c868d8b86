// Package tokenizer encodes text to token ids and back as a Hugging Face tokenizer does,
// reading the same tokenizer.json file (and tokenizer_config.json for the names of the
// special tokens). Its output is checked id for id against transformers on Llama 2, Llama 3,
// Mistral and Qwen2 style tokenizers (testdata/tiny-*).
//
// Encoding follows the Hugging Face pipeline: added tokens are split out of the raw text
// (leftmost-longest, with their lstrip, rstrip, single_word and normalized flags), the rest
// is normalized, added tokens with normalized set are split out of the normalized text,
// the pre-tokenizer cuts it into words, the BPE model turns each word into ids, and the
// post-processor adds special tokens when asked to. Decoding runs the tokens through the
// decoders. A Stream decodes one id at a time and never returns part of a character.
//
// Supported in tokenizer.json:
//
//   - model: BPE with vocab, merges as "a b" strings or [a, b] lists, unk_token, fuse_unk,
//     byte_fallback, ignore_merges, continuing_subword_prefix, end_of_word_suffix.
//   - normalizer: NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, Prepend, Replace (String
//     or Regex pattern), Strip, BertNormalizer, ByteLevel, Sequence.
//   - pre_tokenizer: Split (String or Regex pattern; Removed, Isolated, MergedWithPrevious,
//     MergedWithNext, Contiguous; invert), ByteLevel (add_prefix_space, use_regex with the
//     GPT-2 regex), Metaspace (replacement, prepend_scheme always/first/never or the older
//     add_prefix_space, split), Digits, Whitespace, WhitespaceSplit, Punctuation,
//     BertPreTokenizer, CharDelimiterSplit, Sequence.
//   - post_processor: TemplateProcessing (the single-sequence template, in list or string
//     form), ByteLevel, BertProcessing, RobertaProcessing, Sequence.
//   - decoder: ByteLevel, ByteFallback, Fuse, Replace, Strip, Metaspace, Sequence; no
//     decoder joins tokens with spaces, as Hugging Face does.
//   - added_tokens with special, lstrip, rstrip, single_word and normalized.
//   - tokenizer_config.json: bos_token, eos_token, unk_token, pad_token, sep_token,
//     cls_token, mask_token (strings or objects with "content"), added_tokens_decoder
//     entries missing from tokenizer.json, and clean_up_tokenization_spaces.
//
// Not supported: the WordPiece, WordLevel and Unigram models; the Precompiled normalizer;
// the UnicodeScripts pre-tokenizer; the WordPiece, BPEDecoder and CTC decoders; pair templates ($B); truncation and
// padding (ignored); BPE dropout (ignored: encoding is deterministic); tokenizer_config.json's
// add_bos_token and add_eos_token (the post-processor of tokenizer.json decides). Loading a
// file that uses an unsupported type fails with an error naming the type and where it is.
//
// Regexes: Hugging Face runs Split patterns on Oniguruma. The GPT-2, Llama 3 and Qwen2
// patterns (which need the lookahead \s+(?!\S)) are recognised and run by hand-written
// scanners that are tested against the regex engine; any other pattern runs on regexp2,
// whose syntax and Unicode classes match Oniguruma's for the patterns tokenizers use.
//
// Input text that is not valid UTF-8 is read with each invalid byte as U+FFFD. Decoded text
// is always valid UTF-8: ill-formed byte sequences from byte-level or byte-fallback tokens
// become U+FFFD as in Hugging Face. Decoding an id outside the vocabulary is an error.
//
// Loading reads tokenizer.json with a strict JSON scanner of its own and builds the BPE model
// straight from the file's bytes (fastload.go: a Qwen2.5-sized file loads about 9 times
// faster than through encoding/json); a file it cannot read exactly as encoding/json does,
// every invalid file among them, goes through encoding/json as before.
//
// A Tokenizer is safe for concurrent use; BPE results for words up to 256 bytes are cached.
package tokenizer
