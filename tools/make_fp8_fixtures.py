# Builds tiny FP8 checkpoints from the bf16 fixtures in testdata, one per format Loom reads, and their
# reference.json computed by transformers in float32 on the DEQUANTIZED weights (transformers' own FP8
# kernels need packages this machine lacks, and torch 1.13 has no float8 dtype: the e4m3 encoding and
# decoding are written out below in numpy).
#
#   /usr/bin/python3 /work/hf/run_fixtures.py tools/make_fp8_fixtures.py [--no-references] OUTDIR [name ...]
#
# Formats (see model/quant.go):
#   hf-fp8  quant_method "fp8": float8_e4m3fn weights, <module>.weight_scale_inv f32 per block
#           [ceil(N/bn), ceil(K/bk)], activation_scheme dynamic; the LM head stays bf16 (as transformers keeps it).
#   ct      quant_method "compressed-tensors", format float-quantized: weights 8-bit float, strategy channel
#           (weight_scale [N,1]) or tensor (weight_scale [1]); input activations dynamic per token or static
#           with an input_scale [1]; ignore lists the LM head.
# Blocks are smaller than the 128x128 of real checkpoints so that the tiny weights hold several blocks and tp=2
# cuts them on block boundaries.
#
# Quantization: scale = amax / 448 over the block, row or tensor (rounded to the scale's stored dtype), then
# q = e4m3(w / scale), round to nearest even with saturation at +-448. The reference runs on q * scale computed
# in float32, exactly the values Loom's dequantization gives.
import sys, os, json, shutil, struct, tempfile
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NO_REFS = "--no-references" in sys.argv
ARGS = [a for a in sys.argv[1:] if a != "--no-references"]
OUT = ARGS[0]
ONLY = set(ARGS[1:])

FIXTURES = [
    # name, source fixture, format options
    ("tiny-llama-fp8", "tiny-llama", dict(method="fp8", block=[16, 16])),
    ("tiny-llama-fp8-ct", "tiny-llama", dict(method="ct", strategy="channel", scale_dtype="BF16", acts="dynamic")),
    ("tiny-qwen3-fp8", "tiny-qwen3", dict(method="fp8", block=[8, 8])),
    ("tiny-qwen3-fp8-ct", "tiny-qwen3", dict(method="ct", strategy="tensor", scale_dtype="F32", acts="static")),
]
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
E4M3_MAX = 448.0


# --- float8_e4m3fn, explicitly ---------------------------------------------------------------------
def e4m3_decode_table():
    t = np.zeros(256, dtype=np.float64)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 0x7
        if e == 0xF and m == 0x7:
            t[b] = np.nan
        elif e == 0:
            t[b] = s * m * 2.0 ** -9          # subnormal: m/8 * 2^-6
        else:
            t[b] = s * (8 + m) * 2.0 ** (e - 10)  # (1 + m/8) * 2^(e-7)
    return t.astype(np.float32)


E4M3 = e4m3_decode_table()


def e4m3_encode(x):
    """float32 array -> uint8 float8_e4m3fn patterns: round to nearest even, saturate at +-448, NaN -> 0x7f."""
    x = np.asarray(x, dtype=np.float64)
    sign = np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    a = np.minimum(np.abs(x), E4M3_MAX)
    out = np.zeros(x.shape, dtype=np.uint8)
    sub = a < 2.0 ** -6
    # subnormals (and zero): units of 2^-9; 8 units is exactly the smallest normal's pattern 0x08
    out[sub] = np.rint(a[sub] * 2.0 ** 9).astype(np.uint8)
    n = ~sub
    _, exp = np.frexp(a[n])        # a = f * 2^exp, f in [0.5, 1)
    e = exp - 1                    # a in [2^e, 2^(e+1))
    q = np.rint(np.ldexp(a[n], 3 - e))  # in [8, 16]; np.rint rounds half to even
    up = q == 16
    q[up], e[up] = 8, e[up] + 1
    out[n] = ((e + 7) << 3 | (q.astype(np.int64) - 8)).astype(np.uint8)
    out = out | sign
    out[np.isnan(x)] = 0x7F
    return out


def self_check():
    # every finite pattern encodes back to itself; midpoints go to the even neighbour; saturation
    finite = [b for b in range(256) if b & 0x7F != 0x7F]
    assert (e4m3_encode(E4M3[finite]) == np.array(finite, dtype=np.uint8)).all()
    pos = sorted(set(float(E4M3[b]) for b in range(0x7F)))
    for lo, hi in zip(pos, pos[1:]):
        got = e4m3_encode(np.array([(lo + hi) / 2]))[0]
        want = [b for b in range(0x7F) if E4M3[b] in (lo, hi) and b % 2 == 0][0]
        assert got == want, (lo, hi, got, want)
    assert E4M3[e4m3_encode(np.array([1e6, -500.0]))].tolist() == [448.0, -448.0]


# --- safetensors, explicitly ------------------------------------------------------------------------
def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        buf = data[b:e]
        if v["dtype"] == "BF16":
            a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif v["dtype"] == "F32":
            a = np.frombuffer(buf, dtype="<f4").copy()
        else:
            raise ValueError((path, k, v["dtype"]))
        out[k] = a.reshape(v["shape"])
    return out


def to_bf16_bits(a):
    """float32 -> bf16 bit patterns, round to nearest even."""
    u = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def bf16_round(a):
    return (to_bf16_bits(a).astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors):
    """tensors: name -> (dtype name, shape, bytes)."""
    header, blobs, off = {}, [], 0
    for k in sorted(tensors):
        dt, shape, b = tensors[k]
        header[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def encode_tensor(dt, a):
    if dt == "BF16":
        return ("BF16", a.shape, to_bf16_bits(a).tobytes())
    if dt == "F32":
        return ("F32", a.shape, np.asarray(a, dtype="<f4").tobytes())
    raise ValueError(dt)


# --- quantization -----------------------------------------------------------------------------------
def quantize(w, opts):
    """w float32 [N,K] -> (fp8 patterns [N,K], scale array as stored, scale dtype, dequantized float32 [N,K])."""
    N, K = w.shape
    if opts["method"] == "fp8":
        bn, bk = opts["block"]
        nb, kb = -(-N // bn), -(-K // bk)
        scale = np.zeros((nb, kb), dtype=np.float32)
        for i in range(nb):
            for j in range(kb):
                amax = np.abs(w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]).max()
                scale[i, j] = np.float32(amax) / np.float32(E4M3_MAX) if amax > 0 else np.float32(1)
        full = np.repeat(np.repeat(scale, bn, 0), bk, 1)[:N, :K]
        sdt = "F32"
    else:
        if opts["strategy"] == "channel":
            amax = np.abs(w).max(axis=1, keepdims=True)
        else:
            amax = np.abs(w).max().reshape(1)
        scale = np.where(amax > 0, amax.astype(np.float32) / np.float32(E4M3_MAX), np.float32(1)).astype(np.float32)
        sdt = opts["scale_dtype"]
        if sdt == "BF16":
            scale = bf16_round(scale)
        full = np.broadcast_to(scale.reshape(-1, 1) if opts["strategy"] == "channel" else scale.reshape(1, 1), (N, K))
    q = e4m3_encode(w.astype(np.float32) / full.astype(np.float32))
    deq = (E4M3[q] * full.astype(np.float32)).astype(np.float32)  # one float32 product, as Loom computes it
    return q, scale, sdt, deq


def quant_config(opts):
    if opts["method"] == "fp8":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": opts["block"], "modules_to_not_convert": ["lm_head"]}
    acts = {"num_bits": 8, "type": "float", "symmetric": True}
    if opts["acts"] == "dynamic":
        acts.update(strategy="token", dynamic=True)
    else:
        acts.update(strategy="tensor", dynamic=False)
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": acts,
                                          "weights": {"num_bits": 8, "type": "float", "symmetric": True,
                                                      "dynamic": False, "strategy": opts["strategy"]}}},
            "ignore": ["re:.*lm_head"]}


def build(name, src_name, opts):
    src = os.path.join(ROOT, "testdata", src_name)
    dst = os.path.join(OUT, name)
    os.makedirs(dst, exist_ok=True)
    weights = read_safetensors(os.path.join(src, "model.safetensors"))
    stored, deq_all = {}, {}
    suffix = "weight_scale_inv" if opts["method"] == "fp8" else "weight_scale"
    for k, w in sorted(weights.items()):
        module = k[:-len(".weight")] if k.endswith(".weight") else None
        if module and module.rsplit(".", 1)[-1] in LINEARS:
            q, scale, sdt, deq = quantize(w, opts)
            stored[k] = ("F8_E4M3", q.shape, q.tobytes())
            stored[module + "." + suffix] = encode_tensor(sdt, scale)
            if opts["method"] == "ct" and opts["acts"] == "static":
                stored[module + ".input_scale"] = encode_tensor("F32", np.array([0.05], dtype=np.float32))
            deq_all[k] = deq
        else:
            stored[k] = encode_tensor("BF16", w)  # the source's bf16 values, unchanged
            deq_all[k] = w
    write_safetensors(os.path.join(dst, "model.safetensors"), stored)
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["quantization_config"] = quant_config(opts)
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    for f in os.listdir(src):
        if f not in ("model.safetensors", "config.json", "reference.json"):
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    print(name, "from", src_name, opts, "%d tensors" % len(stored), flush=True)
    if NO_REFS:
        return
    # the reference: transformers in float32 on the dequantized weights, in a temporary unquantized copy
    old = json.load(open(os.path.join(src, "reference.json")))
    with tempfile.TemporaryDirectory() as tmp:
        for f in os.listdir(src):
            if f not in ("model.safetensors", "reference.json"):
                shutil.copy(os.path.join(src, f), os.path.join(tmp, f))
        c = json.load(open(os.path.join(src, "config.json")))
        c["dtype"] = "float32"
        json.dump(c, open(os.path.join(tmp, "config.json"), "w"), indent=2)
        write_safetensors(os.path.join(tmp, "model.safetensors"), {k: encode_tensor("F32", v) for k, v in deq_all.items()})
        ids = {p["text"]: p["ids"] for p in old["prompts"]}  # same tokenizer, same prompts
        prompts = mf.references(tmp, lambda p: ids[p], mf.tokenizer_json_decode(tmp))
    ref = {"model": name, "note": "logits by HF transformers in float32 from a fresh from_pretrained of the "
           "DEQUANTIZED weights of this folder (fp8 value * scale in float32); made by tools/make_fp8_fixtures.py from " + src_name,
           "tokenize": old["tokenize"], "prompts": prompts, "chat": old["chat"]}
    json.dump(ref, open(os.path.join(dst, "reference.json"), "w"))


self_check()
if not NO_REFS:
    sys.path.insert(0, HERE)
    sys.argv = [sys.argv[0], "--references-only"]  # make_fixtures reads its own flags at import
    import make_fixtures as mf
for name, src_name, opts in FIXTURES:
    if not ONLY or name in ONLY:
        build(name, src_name, opts)
