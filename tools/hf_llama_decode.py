# Peer anchor: HF transformers (PyTorch) decode speed for a Llama-3.1-8B-shaped model, random weights, bf16, 1 GPU.
# Run on the GPU machine: python3 tools/hf_llama_decode.py [eager|compile] [batch sizes...] (default 1 8 64)
import sys, time, torch, json
from transformers import LlamaConfig, LlamaForCausalLM
mode = sys.argv[1] if len(sys.argv) > 1 else "eager"
cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                  rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
torch.manual_seed(0)
t0 = time.time()
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).eval()
print(f"init {time.time()-t0:.1f}s params={sum(p.numel() for p in model.parameters())/1e9:.2f}B", flush=True)
res = {}
for bs in [int(a) for a in (sys.argv[2:] or ["1", "8", "64"])]:
    ids = torch.randint(0, cfg.vocab_size, (bs, 128), device="cuda")
    kw = dict(max_new_tokens=128, min_new_tokens=128, do_sample=False)
    if mode == "compile":
        kw["cache_implementation"] = "static"
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True) if bs == 1 and not hasattr(model, "_c") else model.forward
        model._c = True
    with torch.no_grad():
        model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, **({"cache_implementation": "static"} if mode=="compile" else {}))
        model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, **({"cache_implementation": "static"} if mode=="compile" else {}))
        torch.cuda.synchronize(); t = time.time()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False, **({"cache_implementation": "static"} if mode=="compile" else {}))
        torch.cuda.synchronize(); prefill = time.time() - t
        t = time.time()
        out = model.generate(ids, **kw)
        torch.cuda.synchronize(); total = time.time() - t
    dec = (total - prefill) / 127
    res[bs] = dict(prefill_ms=prefill*1e3, decode_ms_per_step=dec*1e3, decode_tok_s=bs/dec)
    print(mode, bs, json.dumps(res[bs]), flush=True)
