#!/usr/bin/env python3
"""dsc against llama.cpp (llama-cpp-python) and optionally transformers on
the same random-weight 134M Llama (bench/peers/make_llama.py), the same
threads, interleaved: for each weight type, pair i runs the peer, then
build/bench/bench_decode, each a fresh process measuring decode tokens/s
at batch 1 (64 tokens after a 16-token prompt) and prefill tokens/s of a
512-token prompt (median of 3 repetitions inside the process). Prints the
min and median over the pairs, the ratio of medians, bench_decode's
rooflines, and `uptime` before and after (the machine may be shared).

llama.cpp runs through llama-cpp-python, or, where its sdist cannot be
built, through xllamacpp (a prebuilt PyPI wheel of the same engine, whose
server loop reports llama.cpp's own prompt and generation timings).

Run (after bench/peers/setup.sh and make_llama.py):
  /work/.peers/venv/bin/python bench/peers/compare.py --dir /tmp/dsc-llama134m \\
      --dsc build/bench/bench_decode [--pairs 3] [--threads 2] [--types f32:f32,bf16:f16,q8_0:q8_0] [--transformers [--hf-python PY]]
  --batched 32: instead, 32 sequences at once (16-token prompts, 64 tokens each) through dsc's scheduler
  (bench_decode --batch 32) and through llama.cpp's server loop with 32 slots (xllamacpp; the PyPI
  packages have no llama-batched-bench), generated tokens/s over the wall time of the whole run.
A type pair is DSC_TYPE:GGUF_TYPE (bf16 against llama.cpp's f16: same bytes per
weight; llama.cpp's CPU backend has no bf16 matmul of its own in every build).
Prints, never asserts; never part of the test suite."""
import argparse
import json
import statistics
import subprocess
import sys
import time

PROMPT, STEPS, PREFILL, REPS = 16, 64, 512, 3


def tokens(n, vocab=32000):
    return [(i * 7919 + 11) % vocab for i in range(n)]


def llama_worker(path, threads):
    """llama.cpp through llama-cpp-python, else through xllamacpp (a prebuilt
    wheel of the same engine, when the sdist of the former cannot be built)."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return xllamacpp_worker(path, threads)
    llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=1024, n_batch=PREFILL,
                n_ubatch=PREFILL, verbose=False)
    dec, pre = [], []
    toks = tokens(PREFILL + STEPS)
    for _ in range(REPS):
        llm.reset()
        t = time.perf_counter()
        llm.eval(toks[:PREFILL])
        pre.append(PREFILL / (time.perf_counter() - t))
        llm.reset()
        llm.eval(toks[:PROMPT])
        t = time.perf_counter()
        for s in range(STEPS):  # fixed tokens: the peer's sampling is not what is timed
            llm.eval([toks[PROMPT + s]])
        dec.append(STEPS / (time.perf_counter() - t))
    return {"decode_tok_s": statistics.median(dec), "prefill_tok_s": statistics.median(pre), "via": "llama-cpp-python"}


def xllamacpp_worker(path, threads):
    """llama.cpp's server loop in-process; its own timings (prompt and generated tokens/s) are read back."""
    import xllamacpp as x

    p = x.CommonParams()
    p.model.path = path
    p.cpuparams.n_threads = threads
    p.cpuparams_batch.n_threads = threads
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_parallel = 1024, PREFILL, PREFILL, 1
    server = x.Server(p)
    toks = tokens(PREFILL + STEPS)
    dec, pre = [], []
    for _ in range(REPS):
        req = {"temperature": 0, "ignore_eos": True, "cache_prompt": False}
        r = server.handle_completions(dict(req, prompt=toks[:PREFILL], n_predict=1))
        pre.append(r["timings"]["prompt_per_second"])
        r = server.handle_completions(dict(req, prompt=toks[:PROMPT], n_predict=STEPS))
        dec.append(r["timings"]["predicted_per_second"])
    return {"decode_tok_s": statistics.median(dec), "prefill_tok_s": statistics.median(pre), "via": "xllamacpp"}


def llama_batched_worker(path, threads, batch):
    """llama.cpp's server loop with `batch` slots, given `batch` prompts in one completion request (it runs
    them as parallel tasks, continuously batched): generated tokens/s over the request's wall time, prompts
    included, as bench_decode --batch measures dsc."""
    import xllamacpp as x

    p = x.CommonParams()
    p.model.path = path
    p.cpuparams.n_threads = threads
    p.cpuparams_batch.n_threads = threads
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_parallel = batch * (PROMPT + STEPS + 16), PREFILL, PREFILL, batch
    server = x.Server(p)
    prompts = [[((i * PROMPT + j) * 7919 + 11) % 32000 for j in range(PROMPT)] for i in range(batch)]
    req = {"temperature": 0, "ignore_eos": True, "cache_prompt": False, "n_predict": STEPS}
    rates = []
    for _ in range(REPS):
        t = time.perf_counter()
        r = server.handle_completions(dict(req, prompt=prompts))
        wall = time.perf_counter() - t
        # one completion per prompt ("choices"), each ended by the length limit: STEPS tokens each
        n = sum(STEPS for c in r["choices"] if c["finish_reason"] == "length")
        if n != batch * STEPS:
            raise RuntimeError(f"llama.cpp generated {n} of {batch * STEPS} tokens")
        rates.append(n / wall)
    return {"batched_tok_s": statistics.median(rates), "via": "xllamacpp server, n_parallel slots"}


def hf_worker(path, threads):
    import torch
    from transformers import LlamaForCausalLM

    torch.set_num_threads(threads)
    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager").eval()
    toks = torch.tensor([tokens(PREFILL + STEPS)])
    dec, pre = [], []
    with torch.no_grad():
        for _ in range(REPS):
            t = time.perf_counter()
            model(toks[:, :PREFILL], use_cache=False)
            pre.append(PREFILL / (time.perf_counter() - t))
            out = model(toks[:, :PROMPT], use_cache=True)
            past = out.past_key_values
            t = time.perf_counter()
            for s in range(STEPS):
                out = model(toks[:, PROMPT + s:PROMPT + s + 1], past_key_values=past, use_cache=True)
                past = out.past_key_values
            dec.append(STEPS / (time.perf_counter() - t))
    return {"decode_tok_s": statistics.median(dec), "prefill_tok_s": statistics.median(pre)}


def run_peer(kind, path, threads, python=sys.executable, batch=0):
    out = subprocess.run([python, __file__, "--worker", kind, "--model", path, "--threads", str(threads),
                          "--batched", str(batch)],
                         check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_dsc(exe, path, wtype, threads, batch=0):
    extra = ["--batch", str(batch), "--batch-only", "1"] if batch else []
    out = subprocess.run([exe, "--model", path, "--weight-type", wtype, "--threads", str(threads), "--steps",
                          str(STEPS), "--prefill", str(PREFILL), "--reps", str(REPS)] + extra,
                         check=True, capture_output=True, text=True).stdout
    return {k: float(v) for k, v in (line.split() for line in out.splitlines() if len(line.split()) == 2)}


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def summary(name, xs):
    return f"{name} min {min(xs):8.2f} median {statistics.median(xs):8.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--model")
    ap.add_argument("--dir", default="/tmp/dsc-llama134m")
    ap.add_argument("--dsc", default="build/bench/bench_decode")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", default="f32:f32,bf16:f16,q8_0:q8_0")
    ap.add_argument("--transformers", action="store_true")
    ap.add_argument("--hf-python", default=sys.executable, help="interpreter with torch + transformers")
    ap.add_argument("--batched", type=int, default=0,
                    help="B > 0: B sequences at once (generated tok/s) instead of batch 1 decode and prefill")
    a = ap.parse_args()
    if a.worker:
        if a.batched:
            print(json.dumps(llama_batched_worker(a.model, a.threads, a.batched)))
            return
        fn = llama_worker if a.worker == "llama" else hf_worker
        print(json.dumps(fn(a.model, a.threads)))
        return
    print(f"# {a.pairs} interleaved pairs per row, {a.threads} threads; start: {uptime()}")
    rows = [tuple(t.split(":")) for t in a.types.split(",") if t]
    if a.transformers:
        rows.append(("f32", "hf"))
    if a.batched:
        for dsc_type, peer_type in rows:
            d, p = [], []
            for _ in range(a.pairs):
                p.append(run_peer("llama", f"{a.dir}/model-{peer_type}.gguf", a.threads, batch=a.batched))
                d.append(run_dsc(a.dsc, a.dir, dsc_type, a.threads, batch=a.batched))
            dv, pv = [r["batched_tok_s"] for r in d], [r["batched_tok_s"] for r in p]
            print(f"batched {a.batched:3d}  dsc {dsc_type:5s} {summary('', dv)} | llama.cpp {peer_type:7s} "
                  f"{summary('', pv)} | ratio {statistics.median(dv) / statistics.median(pv):5.2f}")
            print(f"  peer via {p[-1]['via']}; {uptime()}")
        return
    for dsc_type, peer_type in rows:
        peer = "transformers f32" if peer_type == "hf" else f"llama.cpp {peer_type}"
        res = {"dsc": [], "peer": []}
        for _ in range(a.pairs):
            if peer_type == "hf":
                res["peer"].append(run_peer("hf", a.dir, a.threads, a.hf_python))
            else:
                res["peer"].append(run_peer("llama", f"{a.dir}/model-{peer_type}.gguf", a.threads))
            res["dsc"].append(run_dsc(a.dsc, a.dir, dsc_type, a.threads))
        for key in ("decode_tok_s", "prefill_tok_s"):
            d = [r[key] for r in res["dsc"]]
            p = [r[key] for r in res["peer"]]
            print(f"{key:14s} dsc {dsc_type:5s} {summary('', d)} | {peer:17s} {summary('', p)} | "
                  f"ratio {statistics.median(d) / statistics.median(p):5.2f}")
        print(f"  peer via {res['peer'][-1].get('via', 'transformers')}")
        last = res["dsc"][-1]
        of_roof = [r["decode_of_roofline"] for r in res["dsc"]]
        print(f"  dsc {dsc_type}: read {last['read_GB_s']:.1f} GB/s -> decode roofline "
              f"{last['decode_roofline_tok_s']:.1f} tok/s (at {' / '.join(f'{x:.2f}' for x in of_roof)} of it, "
              f"median {statistics.median(of_roof):.2f}); "
              f"sgemm {last['gemm_GFLOP_s']:.0f} GFLOP/s -> prefill limit {last['prefill_limit_tok_s']:.0f} tok/s "
              f"(median at {statistics.median(r['prefill_of_limit'] for r in res['dsc']):.2f})")
        print(f"  {uptime()}")


if __name__ == "__main__":
    main()
