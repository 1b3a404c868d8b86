# Builds tiny Hugging Face checkpoints (random weights, real HF format), real tokenizers and
# reference outputs computed by HF transformers (fp32 math on bf16-rounded weights).
#
# Run on a machine with torch + transformers + tokenizers:
#   python3 tools/make_fixtures.py OUTDIR [name ...]
# With no names it builds every fixture below. The first three (tiny-llama, tiny-qwen2,
# tiny-mixtral) came from an earlier copy of this script; the rest were added for Loom.
import sys, os, json, glob, math
import torch
from tokenizers import Tokenizer, models, trainers, pre_tokenizers, decoders, processors, normalizers, Regex
from transformers import PreTrainedTokenizerFast, AutoModelForCausalLM
from transformers import LlamaConfig, Qwen2Config, Qwen3Config, MixtralConfig, MistralConfig

OUT = sys.argv[1]
ONLY = set(sys.argv[2:])
os.makedirs(OUT, exist_ok=True)


def corpus():
    texts = []
    for f in sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(glob.glob("/opt/torch/.venv/lib/python3.12/site-packages/*/LICENSE*"))[:200]:
        try:
            texts.append(open(f, encoding="utf-8", errors="ignore").read())
        except Exception:
            pass
    texts.append("Once upon a time, in a land far away, there lived 3 dragons and 1024 cats. 你好，世界！ Ça va? naïve café 😀🚀 \n\n\tTabs\tand  double  spaces.")
    return texts


LLAMA3_PAT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2_PAT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3_CHAT = "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
CHATML = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
LLAMA2_CHAT = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}{{ '<<SYS>>\n' + message['content'] + '\n<</SYS>>\n\n' }}{% elif message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ ' ' + message['content'] + eos_token }}{% endif %}{% endfor %}"


def byte_level_tokenizer(style, vocab):
    tok = Tokenizer(models.BPE())
    if style == "llama3":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        pat = LLAMA3_PAT
    else:
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        pat = QWEN2_PAT
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    if style == "llama3":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                                           special_tokens=[("<|begin_of_text|>", bos)])
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
        fast.chat_template = LLAMA3_CHAT
    else:
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
        fast.chat_template = CHATML
    return fast


def sentencepiece_tokenizer(style, vocab):
    """SentencePiece-style BPE as in Llama 2 ("legacy": Prepend+Replace normalizer) or Mistral
    ("metaspace": Metaspace pre-tokenizer), with <0xNN> byte-fallback tokens at ids 3..258."""
    specials = ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False, limit_alphabet=120)
    tok.train_from_iterator(corpus(), trainer)
    spec = json.loads(tok.to_str())
    trained = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab_map = {s: i for i, s in enumerate(specials)}
    for b in range(256):
        vocab_map["<0x%02X>" % b] = len(vocab_map)
    for s, _ in trained:
        if s not in vocab_map:
            vocab_map[s] = len(vocab_map)
    spec["model"]["vocab"] = vocab_map
    for a in spec["added_tokens"]:
        a["id"] = vocab_map[a["content"]]
    if style == "legacy":
        spec["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
        spec["pre_tokenizer"] = None
    else:
        spec["normalizer"] = None
        spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = LLAMA2_CHAT
    return fast


def make_tokenizer(style, vocab):
    if style in ("llama3", "qwen2"):
        return byte_level_tokenizer(style, vocab)
    return sentencepiece_tokenizer(style, vocab)


TOKEN_CASES = ["Hello world", "The quick brown fox jumps over the lazy dog.", "  leading and trailing  ", "numbers 1234567 and 3.14159",
               "你好，世界！", "Ça va? naïve café", "emoji 😀🚀 done", "line one\nline two\n\n\ttabbed", "don't can't I'll we've", "",
               "a" * 50, "MiXeD CaSe WORDS", "<|im_start|>user\nhi<|im_end|>", "<|begin_of_text|>raw special", "<s>[INST] hi [/INST]",
               "\u00e9\u0301 combining and \u2126 ohm", "x\u0000y \U0001F9EA"]
PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away, there lived", "1, 2, 3, 4,"]


def build(name, cfg_cls, style, seed, **kw):
    if ONLY and name not in ONLY:
        return
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    tok = make_tokenizer(style, kw.pop("vocab_size", 512))
    torch.manual_seed(seed)
    cfg = cfg_cls(vocab_size=len(tok), **kw)
    cfg.bos_token_id = tok.bos_token_id
    cfg.eos_token_id = tok.eos_token_id
    torch.set_default_dtype(torch.float32)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 1.0 / math.sqrt(p.shape[-1]) * 1.5)
            elif "norm" in n:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0, 0.1)
    model = model.to(torch.bfloat16)
    model.save_pretrained(d, safe_serialization=True)
    tok.save_pretrained(d)
    model = model.to(torch.float32).eval()
    ref = {"model": name, "note": "logits computed by HF transformers in float32 from the bf16 weights in this folder", "tokenize": [], "prompts": []}
    for s in TOKEN_CASES:
        ids = tok.encode(s, add_special_tokens=True)
        ref["tokenize"].append({"text": s, "ids_with_special": ids, "ids_no_special": tok.encode(s, add_special_tokens=False),
                                "decoded": tok.decode(ids, skip_special_tokens=False)})
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}]
    chat_text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ref["chat"] = {"messages": msgs, "rendered": chat_text, "ids": tok.encode(chat_text, add_special_tokens=False)}
    with torch.no_grad():
        for p in PROMPTS:
            ids = tok.encode(p, add_special_tokens=True)
            x = torch.tensor([ids])
            out = model(x)
            logits = out.logits[0]
            gen = model.generate(x, max_new_tokens=24, min_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
            new = gen[0, len(ids):].tolist()
            seq = gen[0].tolist()
            full = model(torch.tensor([seq])).logits[0]
            margins = []
            for i in range(len(ids) - 1, len(seq) - 1):
                top = torch.topk(full[i], 2).values
                margins.append(float(top[0] - top[1]))
            ref["prompts"].append({"text": p, "ids": ids, "last_logits": logits[-1].tolist(),
                                   "all_logits": logits.tolist() if p == PROMPTS[0] else None,
                                   "greedy_new_ids": new, "greedy_text": tok.decode(new), "greedy_margins": margins})
    json.dump(ref, open(os.path.join(d, "reference.json"), "w"))
    print(name, "params", sum(p.numel() for p in model.parameters()), "vocab", len(tok), "files", sorted(os.listdir(d)), flush=True)


common = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, rms_norm_eps=1e-5)
build("tiny-llama", LlamaConfig, "llama3", 1, rope_theta=10000.0, tie_word_embeddings=False, **common)
build("tiny-qwen2", Qwen2Config, "qwen2", 2, rope_theta=1000000.0, tie_word_embeddings=True, **common)
build("tiny-mixtral", MixtralConfig, "llama3", 6, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=256, rms_norm_eps=1e-5,
      rope_theta=1000000.0, tie_word_embeddings=False)
# Qwen3: explicit head_dim (24, not hidden/heads), per-head q/k RMSNorm.
build("tiny-qwen3", Qwen3Config, "qwen2", 7, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, head_dim=24, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=1000000.0,
      tie_word_embeddings=False)
# Mistral: SentencePiece-style tokenizer with a Metaspace pre-tokenizer; a sliding window shorter than the prompts.
build("tiny-mistral", MistralConfig, "metaspace", 8, sliding_window=8, rope_theta=10000.0, tie_word_embeddings=False, vocab_size=300, **common)
# Llama 3.1-style rope scaling (rope_type llama3) with a small original context so every band is exercised.
build("tiny-llama31", LlamaConfig, "llama3", 9, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}, tie_word_embeddings=True, **common)
# Llama 2-style: legacy SentencePiece tokenizer, multi-head attention, linear rope scaling.
build("tiny-llama2", LlamaConfig, "legacy", 10, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=4, max_position_embeddings=256, rms_norm_eps=1e-6,
      rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}, tie_word_embeddings=False, vocab_size=300)
# 6 attention heads, 1 KV head: KV replication and non-divisible head counts under tensor parallelism.
build("tiny-gqa6", LlamaConfig, "llama3", 11, hidden_size=96, intermediate_size=192, num_hidden_layers=2, num_attention_heads=6,
      num_key_value_heads=1, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
