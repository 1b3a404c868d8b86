# Builds tiny Hugging Face checkpoints (random weights, real HF format), real tokenizers and
# reference outputs computed by HF transformers (fp32 math on bf16-rounded weights).
#
# Run on a machine with torch + transformers + tokenizers:
#   python3 tools/make_fixtures.py OUTDIR [name ...]
# With no names it builds every fixture below. The first three (tiny-llama, tiny-qwen2,
# tiny-mixtral) came from an earlier copy of this script; the rest were added for Loom.
# A rebuild into a folder that already holds a fixture says whether model.safetensors kept its bytes.
#
# Recompute reference.json for existing fixture folders (no tokenizer training, so the `tokenizers`
# package is only needed to encode the prompts):
#   python3 tools/make_fixtures.py --references-only [--loom-tokenize] DIR [DIR ...]
# The mixture-of-experts fixtures (tiny-qwen2moe, tiny-qwen3moe) train no tokenizer either: they copy
# tiny-qwen2's files (from OUTDIR, else testdata) and its reference.json's "tokenize" and "chat" sections,
# so they build without the `tokenizers` package, given --loom-tokenize:
#   python3 tools/make_fixtures.py [--loom-tokenize] OUTDIR tiny-qwen2moe tiny-qwen3moe
# and --references-only works on them as on the others once they exist.
# This sets config.json's max_position_embeddings to the value below, checks that the seeded weights
# rebuilt from the table below equal model.safetensors bit for bit, keeps the file's "tokenize" and
# "chat" sections and rewrites "prompts". A prompt already in the old reference.json must tokenize to
# the same ids. --loom-tokenize encodes the prompts with Loom's tokenizer (`loom tokenize`, from $LOOM
# or `go run ./cmd/loom`) instead of HF's, and decodes greedy_text from tokenizer.json here.
#
# References come from a fresh from_pretrained(dtype=float32) of the saved folder, as a user's
# transformers run sees it (that keeps the rotary inv_freq buffer in f32; converting the live bf16
# model back to f32 would round it through bf16), with eager attention. Greedy = argmax at every step,
# recomputing the whole sequence, BOS visible (generate() with pad_token_id=0 took a leading id 0,
# the BOS of the llama3-style tokenizers, for left padding). Mixture-of-experts models run transformers'
# eager experts loop (experts_implementation="eager": each token's chosen experts summed in expert order;
# the default grouped implementation sums them in top-k order, the same sum for top-2).
import sys, os, json, glob, math, re, subprocess
import torch
from transformers import PreTrainedTokenizerFast, AutoModelForCausalLM, AutoTokenizer
from transformers import LlamaConfig, Qwen2Config, Qwen3Config, MixtralConfig, MistralConfig, Qwen2MoeConfig, Qwen3MoeConfig

REFS_ONLY = "--references-only" in sys.argv
LOOM_TOKENIZE = "--loom-tokenize" in sys.argv
ARGS = [a for a in sys.argv[1:] if a not in ("--references-only", "--loom-tokenize")]
if not REFS_ONLY:
    OUT = ARGS[0]
    ONLY = set(ARGS[1:])
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
    from tokenizers import Tokenizer, models, trainers, pre_tokenizers, decoders, processors, normalizers, Regex
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
    from tokenizers import Tokenizer, models, trainers, pre_tokenizers, decoders, processors
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
# Natural English prose that every fixture's tokenizer turns into 300+ tokens (about 450 here): long
# enough for long-context paths (several KV blocks, chunked prefill, positions past llama3's
# original_max_position_embeddings of 32, Mistral's sliding window of 8).
LONG_PROMPT = (
    "The lighthouse keeper had lived on the island for almost thirty years, and in all that time he had never once let "
    "the lamp go dark. Every evening, just before the sun slipped beneath the grey line of the sea, he climbed the narrow "
    "stairs with a can of oil in one hand and a cloth in the other, and he polished the great glass lens until it shone "
    "like a second moon. The fishermen in the village across the bay said that you could set your watch by the moment "
    "the beam first swept across the water. In the winter the storms came in from the north, and the wind howled around "
    "the tower so loudly that he could not hear himself think. On those nights he sat by the small iron stove in the "
    "kitchen, drinking strong tea and reading old books about sailors who had crossed the oceans long before there were "
    "any lights to guide them home.")
LONG_MIN_TOKENS = 300
PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away, there lived", "1, 2, 3, 4,", LONG_PROMPT]
GREEDY_STEPS = 24
MAX_POSITIONS = 1024  # every fixture; the long prompt and its continuation must fit
NOTE = "logits by HF transformers in float32 from a fresh from_pretrained of the bf16 weights in this folder"
GREEDY_NOTE = "argmax at each step, full recompute, float32, BOS visible"


def seeded_model(cfg_cls, seed, vocab_size, bos, eos, kw):
    """The fixture's weights: HF's own init under the seed, then the distribution below, rounded to bf16."""
    torch.manual_seed(seed)
    cfg = cfg_cls(vocab_size=vocab_size, **kw)
    cfg.bos_token_id = bos
    cfg.eos_token_id = eos
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
    return model.to(torch.bfloat16)


def is_moe(d):
    cfg = json.load(open(os.path.join(d, "config.json"), encoding="utf-8"))
    return bool(cfg.get("num_local_experts") or cfg.get("num_experts"))


def references(d, encode, decode):
    """Reference outputs of the checkpoint in folder d, loaded as a user's transformers run loads it."""
    extra = {"experts_implementation": "eager"} if is_moe(d) else {}
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager", **extra).eval()
    assert model.config._attn_implementation == "eager"
    out = []
    with torch.no_grad():
        for p in PROMPTS:
            ids = encode(p)
            if p == LONG_PROMPT:
                assert len(ids) >= LONG_MIN_TOKENS, (d, len(ids))
            assert len(ids) + GREEDY_STEPS <= model.config.max_position_embeddings, (d, len(ids))
            logits = model(torch.tensor([ids])).logits[0]
            seq, new, margins = list(ids), [], []
            for _ in range(GREEDY_STEPS):
                top = torch.topk(model(torch.tensor([seq])).logits[0, -1], 2)
                new.append(int(top.indices[0]))
                margins.append(float(top.values[0] - top.values[1]))
                seq.append(new[-1])
            out.append({"text": p, "ids": ids, "last_logits": logits[-1].tolist(),
                        "all_logits": logits.tolist() if p == PROMPTS[0] else None,
                        "greedy_new_ids": new, "greedy_text": decode(new), "greedy_margins": margins,
                        "greedy_note": GREEDY_NOTE})
            print(os.path.basename(d), "prompt", len(out) - 1, "tokens", len(ids), "greedy", new[:8], "...", flush=True)
    return out


COPIED_TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]


def fixture_source(name):
    """The folder of an already built fixture: OUTDIR's, else the repository's testdata."""
    for root in (OUT, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "testdata")):
        if os.path.exists(os.path.join(root, name, "reference.json")):
            return os.path.join(root, name)
    raise SystemExit("fixture %s (whose tokenizer is copied) is neither in %s nor in testdata" % (name, OUT))


def build_copied_tokenizer(name, cfg_cls, src_name, seed, kw):
    """A fixture with the tokenizer of the fixture src_name: its files, vocabulary size, BOS/EOS, and the
    "tokenize" and "chat" sections of its reference.json. Prompts are encoded by HF's tokenizer when the
    `tokenizers` package is there (else, or with --loom-tokenize, by Loom's) and must give src's ids."""
    import shutil
    src = fixture_source(src_name)
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    weights = os.path.join(d, "model.safetensors")
    old = open(weights, "rb").read() if os.path.exists(weights) else None
    src_cfg = json.load(open(os.path.join(src, "config.json"), encoding="utf-8"))
    src_ref = json.load(open(os.path.join(src, "reference.json"), encoding="utf-8"))
    kw = {k: v for k, v in kw.items() if k != "vocab_size"}
    model = seeded_model(cfg_cls, seed, src_cfg["vocab_size"], src_cfg["bos_token_id"], src_cfg["eos_token_id"], kw)
    model.save_pretrained(d, safe_serialization=True)
    for f in COPIED_TOKENIZER_FILES:
        shutil.copyfile(os.path.join(src, f), os.path.join(d, f))
    if old is not None:
        print(name, "model.safetensors", "unchanged" if open(weights, "rb").read() == old else "CHANGED", flush=True)
    try:
        import tokenizers  # noqa: F401
        hf_tok = not LOOM_TOKENIZE
    except ImportError:
        hf_tok = False
    if hf_tok:
        tok = AutoTokenizer.from_pretrained(d)
        encode, decode = (lambda p: tok.encode(p, add_special_tokens=True)), tok.decode
    else:
        encode, decode = loom_encode(d), tokenizer_json_decode(d)
    src_ids = {p["text"]: p["ids"] for p in src_ref["prompts"]}

    def checked_encode(p):
        ids = encode(p)
        assert src_ids.get(p) == ids, (name, "tokenizes differently from", src_name, p, ids, src_ids.get(p))
        return ids
    ref = {"model": name, "note": NOTE, "tokenize": src_ref["tokenize"],
           "prompts": references(d, checked_encode, decode), "chat": src_ref["chat"]}
    json.dump(ref, open(os.path.join(d, "reference.json"), "w"))
    print(name, "params", sum(p.numel() for p in model.parameters()), "vocab", src_cfg["vocab_size"],
          "tokenizer of", src_name, "files", sorted(os.listdir(d)), flush=True)


def build(name, cfg_cls, style, seed, kw):
    if ONLY and name not in ONLY:
        return
    if style.startswith("copy:"):
        return build_copied_tokenizer(name, cfg_cls, style[len("copy:"):], seed, kw)
    kw = dict(kw)
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    weights = os.path.join(d, "model.safetensors")
    old = open(weights, "rb").read() if os.path.exists(weights) else None
    tok = make_tokenizer(style, kw.pop("vocab_size", 512))
    model = seeded_model(cfg_cls, seed, len(tok), tok.bos_token_id, tok.eos_token_id, kw)
    model.save_pretrained(d, safe_serialization=True)
    tok.save_pretrained(d)
    if old is not None:
        print(name, "model.safetensors", "unchanged" if open(weights, "rb").read() == old else "CHANGED", flush=True)
    ref = {"model": name, "note": NOTE, "tokenize": [], "prompts": []}
    for s in TOKEN_CASES:
        ids = tok.encode(s, add_special_tokens=True)
        ref["tokenize"].append({"text": s, "ids_with_special": ids, "ids_no_special": tok.encode(s, add_special_tokens=False),
                                "decoded": tok.decode(ids, skip_special_tokens=False)})
    ref["prompts"] = references(d, lambda p: tok.encode(p, add_special_tokens=True), tok.decode)
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}]
    chat_text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ref["chat"] = {"messages": msgs, "rendered": chat_text, "ids": tok.encode(chat_text, add_special_tokens=False)}
    json.dump(ref, open(os.path.join(d, "reference.json"), "w"))
    print(name, "params", sum(p.numel() for p in model.parameters()), "vocab", len(tok), "files", sorted(os.listdir(d)), flush=True)


def loom_encode(d):
    loom = os.environ.get("LOOM")
    cmd = [loom] if loom else ["go", "run", "./cmd/loom"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return lambda p: json.loads(subprocess.run(cmd + ["tokenize", "--model", os.path.abspath(d), "--text", p], cwd=root,
                                               check=True, capture_output=True, text=True).stdout)


def tokenizer_json_decode(d):
    """decode(ids) with the two decoders these fixtures use (byte-level; SentencePiece-style with byte fallback)."""
    spec = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
    vocab = {i: s for s, i in spec["model"]["vocab"].items()}
    vocab.update({a["id"]: a["content"] for a in spec["added_tokens"]})
    specials = {a["id"] for a in spec["added_tokens"] if a.get("special")}
    if spec["decoder"]["type"] == "ByteLevel":
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
        cs, n = bs[:], 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        byte_of = {chr(c): b for b, c in zip(bs, cs)}

        def decode(ids):
            out, buf = [], []
            for i in ids:
                if i in specials:
                    out.append(bytes(buf).decode("utf-8", errors="replace"))
                    buf = []
                    out.append(vocab[i])
                else:
                    buf += [byte_of[c] for c in vocab[i]]
            return "".join(out) + bytes(buf).decode("utf-8", errors="replace")
        return decode

    def decode(ids):  # Replace(U+2581 -> " "), ByteFallback, Fuse, Strip(1 leading space)
        parts, buf = [], []
        for i in ids:
            s = vocab[i]
            m = re.fullmatch(r"<0x([0-9A-F]{2})>", s)
            if m:
                buf.append(int(m.group(1), 16))
                continue
            if buf:
                try:
                    parts.append(bytes(buf).decode("utf-8"))
                except UnicodeDecodeError:
                    parts.append("\ufffd" * len(buf))
                buf = []
            parts.append(s.replace("\u2581", " "))
        if buf:
            try:
                parts.append(bytes(buf).decode("utf-8"))
            except UnicodeDecodeError:
                parts.append("\ufffd" * len(buf))
        text = "".join(parts)
        return text[1:] if text.startswith(" ") else text
    return decode


def refresh(d):
    """--references-only: recompute d/reference.json for an existing fixture folder."""
    d = d.rstrip("/")
    name = os.path.basename(d)
    fx = {f[0]: f for f in FIXTURES}[name]
    _, cfg_cls, style, seed, kw = fx
    kw = {k: v for k, v in kw.items() if k != "vocab_size"}
    cfg_path = os.path.join(d, "config.json")
    text = open(cfg_path, encoding="utf-8").read()
    new_text = re.sub(r'("max_position_embeddings": )\d+', lambda m: m.group(1) + str(kw["max_position_embeddings"]), text)
    if new_text != text:
        open(cfg_path, "w", encoding="utf-8").write(new_text)
    cfg = json.loads(new_text)
    # the seeded weights, rebuilt, must equal the checkpoint bit for bit
    model = seeded_model(cfg_cls, seed, cfg["vocab_size"], cfg["bos_token_id"], cfg["eos_token_id"], kw)
    from safetensors import safe_open
    import tempfile

    def tensors(path):
        with safe_open(path, "pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    with tempfile.TemporaryDirectory() as tmp:  # saved as a rebuild saves it (e.g. Mixtral's fused experts unfused)
        model.save_pretrained(tmp, safe_serialization=True)
        mine = tensors(os.path.join(tmp, "model.safetensors"))
    saved = tensors(os.path.join(d, "model.safetensors"))
    bad = sorted(set(saved) ^ set(mine)) + [k for k in saved if k in mine and not torch.equal(saved[k], mine[k])]
    assert not bad, (name, "seeded weights differ from model.safetensors", bad)
    print(name, "seeded weights == model.safetensors (%d tensors)" % len(saved), flush=True)
    old = json.load(open(os.path.join(d, "reference.json"), encoding="utf-8"))
    old_ids = {p["text"]: p["ids"] for p in old["prompts"]}
    if LOOM_TOKENIZE:
        encode, decode = loom_encode(d), tokenizer_json_decode(d)
    else:
        tok = AutoTokenizer.from_pretrained(d)
        encode, decode = (lambda p: tok.encode(p, add_special_tokens=True)), tok.decode

    def checked_encode(p):
        ids = encode(p)
        assert p not in old_ids or old_ids[p] == ids, (name, p, ids, old_ids[p])
        return ids
    ref = {"model": name, "note": NOTE, "tokenize": old["tokenize"],
           "prompts": references(d, checked_encode, decode), "chat": old["chat"]}
    json.dump(ref, open(os.path.join(d, "reference.json"), "w"))


common = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5)
FIXTURES = [
    ("tiny-llama", LlamaConfig, "llama3", 1, dict(rope_theta=10000.0, tie_word_embeddings=False, **common)),
    ("tiny-qwen2", Qwen2Config, "qwen2", 2, dict(rope_theta=1000000.0, tie_word_embeddings=True, **common)),
    ("tiny-mixtral", MixtralConfig, "llama3", 6, dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5,
        rope_theta=1000000.0, tie_word_embeddings=False)),
    # Qwen3: explicit head_dim (24, not hidden/heads), per-head q/k RMSNorm.
    ("tiny-qwen3", Qwen3Config, "qwen2", 7, dict(
        hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=24, max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=False)),
    # Mistral: SentencePiece-style tokenizer with a Metaspace pre-tokenizer; a sliding window shorter than the prompts.
    ("tiny-mistral", MistralConfig, "metaspace", 8, dict(
        sliding_window=8, rope_theta=10000.0, tie_word_embeddings=False, vocab_size=300, **common)),
    # Llama 3.1-style rope scaling (rope_type llama3) with a small original context so every band is exercised
    # (original_max_position_embeddings stays 32 whatever max_position_embeddings is).
    ("tiny-llama31", LlamaConfig, "llama3", 9, dict(
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
        tie_word_embeddings=True, **common)),
    # Llama 2-style: legacy SentencePiece tokenizer, multi-head attention, linear rope scaling.
    ("tiny-llama2", LlamaConfig, "legacy", 10, dict(
        hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}, tie_word_embeddings=False,
        vocab_size=300)),
    # 6 attention heads, 1 KV head: KV replication and non-divisible head counts under tensor parallelism.
    ("tiny-gqa6", LlamaConfig, "llama3", 11, dict(
        hidden_size=96, intermediate_size=192, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=1,
        head_dim=16, max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False)),
    # Qwen2-MoE (tiny-qwen2's tokenizer): q/k/v bias, 4 experts, top-2 not renormalised (norm_topk_prob false),
    # a shared expert scaled by sigmoid(shared_expert_gate) in every layer.
    ("tiny-qwen2moe", Qwen2MoeConfig, "copy:tiny-qwen2", 12, dict(
        hidden_size=64, intermediate_size=160, moe_intermediate_size=48, shared_expert_intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=False, decoder_sparse_step=1, max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=False)),
    # Qwen3-MoE (tiny-qwen2's tokenizer): per-head q/k RMSNorm, head_dim 24, 4 experts, top-2 renormalised
    # (norm_topk_prob), decoder_sparse_step 2: layer 0 keeps a dense MLP (intermediate_size), layer 1 is sparse.
    ("tiny-qwen3moe", Qwen3MoeConfig, "copy:tiny-qwen2", 13, dict(
        hidden_size=64, intermediate_size=160, moe_intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=24, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
        decoder_sparse_step=2, max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=False)),
]

if REFS_ONLY:
    for d in ARGS:
        refresh(d)
else:
    for fx in FIXTURES:
        build(*fx)
