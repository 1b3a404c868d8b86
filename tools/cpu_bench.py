#!/usr/bin/env python3
"""CPU decode and prefill of a Qwen2.5-0.5B-shaped bf16 checkpoint against the memory-read
floor, several Loom binaries alternating in one run (docs/PERFORMANCE.md, session 8).

    tools/cpu_bench.py [--base REV|none] [--rounds 3] [--out /tmp/loom-cpubench] [--llamacpp SHARED_TOOLS]

Builds, from the work tree, `loom` (a plain `go build`, what `go run` and `go install` give)
and, from REV (default HEAD~1) in a temporary worktree, `base` (plain) and `base-simd`
(GOEXPERIMENT=simd, REV's `make build`); synthesizes qwen2.5-0.5b once (`loom synth`); then
each round runs every binary's `loom bench` (one request, a 128-token prompt, 32 tokens) and
backend/cpu's BenchmarkMemoryRead/vector (every core reading a 1 GiB buffer). Prints per
round the median inter-token time (decode), time to first token (prefill of 128 tokens plus
the first token) and each decode time over the floor (weight bytes / read bandwidth of the
same round). LOOM_CPU_KERNELS in the environment applies to every binary that knows it.

With --llamacpp SHARED_TOOLS (the folder holding ggufsynth/ and llamacpp_run.mjs), each round
also runs llama.cpp (npm node-llama-cpp 3.22.1, prebuilt, CPU, 2 threads) on a GGUF with the
same bf16 bytes (`ggufsynth convert`), the same 128 prompt ids and as many new tokens: the
tools are built and installed under --out, not in the project.
"""
import argparse, json, os, re, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw).stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="HEAD~1", help='commit to compare with, or "none"')
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="/tmp/loom-cpubench")
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--llamacpp", metavar="SHARED_TOOLS", help="also run llama.cpp with the tools in this folder")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ, CGO_ENABLED="0")
    bins = {"loom": os.path.join(a.out, "loom")}
    run(["go", "build", "-o", bins["loom"], "./cmd/loom"], cwd=ROOT, env=env)
    if a.base != "none":
        with tempfile.TemporaryDirectory() as wt:
            run(["git", "worktree", "add", "--detach", wt, a.base], cwd=ROOT)
            try:
                for name, extra in (("base", {}), ("base-simd", {"GOEXPERIMENT": "simd"})):
                    bins[name] = os.path.join(a.out, name)
                    run(["go", "build", "-o", bins[name], "./cmd/loom"], cwd=wt, env=dict(env, **extra))
            finally:
                run(["git", "worktree", "remove", "--force", wt], cwd=ROOT)
    test = os.path.join(a.out, "cpu.test")
    run(["go", "test", "-c", "-o", test, "./backend/cpu"], cwd=ROOT, env=env)
    model = os.path.join(a.out, "qwen2.5-0.5b")
    if not os.path.exists(os.path.join(model, "model.safetensors")):
        run([bins["loom"], "synth", "qwen2.5-0.5b", "--out", model])
    weights = os.path.getsize(os.path.join(model, "model.safetensors"))
    cpu = re.search(r"Model name:\s*(.*)", run(["lscpu"]))
    print(f"CPU {cpu.group(1) if cpu else '?'}")
    print(f"weights {weights/1e9:.3f} GB; GOMAXPROCS {os.cpu_count()}; load {os.getloadavg()}")
    llama = None
    if a.llamacpp:
        llama = setup_llamacpp(a.llamacpp, a.out, model)
    res = {n: [] for n in bins}
    if llama:
        res["llama.cpp"] = []
    for r in range(a.rounds):
        out = run([test, "-test.run", "^$", "-test.bench", "MemoryRead/vector", "-test.count", "1"], cwd=os.path.join(ROOT, "backend/cpu"))
        bw = float(re.search(r"([\d.]+) MB/s", out).group(1)) * 1e6
        floor = weights / bw * 1e3
        print(f"round {r+1}: read {bw/1e9:.2f} GB/s, floor {floor:.1f} ms/token")
        for name, b in bins.items():
            j = json.loads(run([b, "bench", "--model", model, "--device", "cpu", "--num-requests", "1", "--concurrency", "1",
                                "--input-len", "128", "--output-len", str(a.output_len), "--json"]))
            dec, ttft = j["itl"]["p50_ms"], j["ttft"]["mean_ms"]
            res[name].append((dec, ttft, dec / floor))
            print(f"  {name:10s} decode {dec:7.1f} ms/token ({dec/floor:.2f}x floor), first token after 128-token prompt {ttft:7.0f} ms")
        if llama:
            node, script, gguf = llama
            ids = ",".join(str(17 + 31 * i % 5000) for i in range(128))
            j = json.loads(run([node, script, gguf, ids, str(a.output_len), "2"], cwd=os.path.dirname(script)).strip().splitlines()[-1])
            dec, ttft = j["decode_ms_per_tok"], j["prefill_ms"]
            res["llama.cpp"].append((dec, ttft, dec / floor))
            print(f"  {'llama.cpp':10s} decode {dec:7.1f} ms/token ({dec/floor:.2f}x floor), first token after 128-token prompt {ttft:7.0f} ms")
    print("\nmedian over rounds:")
    for name, rows in res.items():
        d, t, x = (statistics.median(c) for c in zip(*rows))
        print(f"  {name:10s} decode {d:7.1f} ms/token, {x:.2f}x floor; ttft(128) {t:7.0f} ms; "
              f"decode speedup of loom over it {d / statistics.median(r[0] for r in res['loom']):.2f}x")


def setup_llamacpp(tools, out, model):
    """Builds ggufsynth, converts the checkpoint, installs node-llama-cpp; returns (node, the
    run script's copy, the GGUF)."""
    gg = os.path.join(out, "ggufsynth")
    run(["go", "build", "-o", gg, "."], cwd=os.path.join(tools, "ggufsynth"))
    gguf = os.path.join(out, "qwen2.5-0.5b.gguf")
    if not os.path.exists(gguf):
        run([gg, "convert", model, gguf])
    npm = os.path.join(out, "llamacpp")
    os.makedirs(npm, exist_ok=True)
    if not os.path.exists(os.path.join(npm, "node_modules", "node-llama-cpp")):
        run(["npm", "install", "--no-audit", "--no-fund", "node-llama-cpp@3.22.1"], cwd=npm)
    script = os.path.join(npm, "llamacpp_run.mjs")
    with open(os.path.join(tools, "llamacpp_run.mjs")) as src, open(script, "w") as dst:
        dst.write(src.read())
    return "node", script, gguf


if __name__ == "__main__":
    sys.exit(main())
