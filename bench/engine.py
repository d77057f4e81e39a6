#!/usr/bin/env python3
"""Single-device engine benchmark (issue: the engine).

Makes Llama-3.2-1B-shape models with `hearth synth` (random weights, real shapes) in Q4_0, Q8_0 and
Q4_K_M, measures the machine's memory read bandwidth with `membw` (the decode roofline: every weight
byte is read once per generated token), runs `hearth bench` for decode (tg128) and prefill (pp128,
pp512) at 1 and 2 threads, and prints a markdown table with tok/s, the roofline tok/s and the
fraction of it reached. With --llama-bench PATH it also runs llama.cpp's llama-bench on the same
files, side by side, and reports hearth / llama.cpp ratios.

usage: bench/engine.py [--build build] [--models DIR] [--reps 5] [--threads 1,2]
                       [--types Q4_0,Q8_0,Q4_K_M] [--llama-bench PATH] [--json OUT.json]
"""
import argparse, json, os, subprocess, sys, statistics

def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit("command failed: %s\n%s" % (" ".join(cmd), r.stderr))
    return r.stdout

def decode_bytes(info):
    """weight bytes read per decoded token: every tensor, except that the embedding table
    contributes one row unless it is also the output head (tied)"""
    total, embd = 0, 0
    for t in info["tensors"]:
        total += t["bytes"]
        if t["name"] == "token_embd.weight":
            embd = t["bytes"]
    if not info["hparams"]["tied_output"]:
        total -= embd
    return total

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--models", default=os.environ.get("HEARTH_BENCH_MODELS", "/tmp/hearth-bench-models"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--types", default="Q4_0,Q8_0,Q4_K_M")
    ap.add_argument("--vocab-from", default="../shared/models/stories260K.gguf")
    ap.add_argument("--llama-bench", default=None, help="path to llama.cpp's llama-bench, to run side by side")
    ap.add_argument("--json", default=None, help="also write all results to this file")
    a = ap.parse_args()
    hearth = os.path.join(a.build, "hearth")
    membw = os.path.join(a.build, "membw")
    os.makedirs(a.models, exist_ok=True)
    threads = [int(t) for t in a.threads.split(",")]

    bw = {}
    for t in threads:
        bw[t] = json.loads(run([membw, "-t", str(t), "-s", "2048", "--json"]))["gb_per_s"]

    rows, results = [], {"bandwidth_gb_per_s": bw, "models": {}}
    for ty in a.types.split(","):
        path = os.path.join(a.models, "llama-3.2-1b-%s.gguf" % ty)
        if not os.path.exists(path):
            run([hearth, "synth", "--shape", "llama-3.2-1b", "--type", ty, "--vocab-from", a.vocab_from, "-o", path])
        info = json.loads(run([hearth, "info", "--json", path]))
        dbytes = decode_bytes(info)
        out = json.loads(run([hearth, "bench", "-m", path, "-t", a.threads, "-p", "128,512", "-n", "128",
                              "-r", str(a.reps), "--json"]))
        peer = {}
        if a.llama_bench:
            lb = json.loads(run([a.llama_bench, "-m", path, "-t", a.threads, "-p", "128,512", "-n", "128",
                                 "-r", str(a.reps), "-o", "json"]))
            for r in lb:
                test = ("pp%d" % r["n_prompt"]) if r["n_gen"] == 0 else ("tg%d" % r["n_gen"])
                peer[(test, r["n_threads"])] = r["avg_ts"]
        results["models"][ty] = {"file_bytes": info["file_size"], "decode_bytes": dbytes, "hearth": out,
                                 "llama_bench": {"%s/t%d" % k: v for k, v in peer.items()}}
        print("%s: hearth %s" % (ty, ", ".join("%s/t%d %.1f" % (r["test"], r["threads"], r["tok_per_s"]) for r in out)),
              file=sys.stderr, flush=True)
        for r in out:
            t, test = r["threads"], r["test"]
            roof = bw[t] * 1e9 / dbytes if test.startswith("tg") else None
            p = peer.get((test, t))
            rows.append((ty, test, t, r["tok_per_s"], roof, p))

    print("memory read bandwidth (membw, median): " +
          ", ".join("%d thread%s %.1f GB/s" % (t, "s" if t > 1 else "", bw[t]) for t in threads))
    hdr = "| model | test | threads | hearth tok/s | roofline tok/s | of roofline |"
    sep = "| --- | --- | ---: | ---: | ---: | ---: |"
    if a.llama_bench:
        hdr += " llama.cpp tok/s | hearth / llama.cpp |"
        sep += " ---: | ---: |"
    print(hdr)
    print(sep)
    for ty, test, t, ts, roof, p in rows:
        line = "| llama-3.2-1b %s | %s | %d | %.1f | %s | %s |" % (
            ty, test, t, ts, "%.1f" % roof if roof else "", "%.0f%%" % (100 * ts / roof) if roof else "")
        if a.llama_bench:
            line += " %s | %s |" % ("%.1f" % p if p else "", "%.2f" % (ts / p) if p else "")
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)

if __name__ == "__main__":
    main()
