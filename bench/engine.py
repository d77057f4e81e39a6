#!/usr/bin/env python3
"""Single-device engine benchmark (issue: the engine).

Makes Llama-3.2-1B-shape models with `hearth synth` (random weights, real shapes) in Q4_0, Q8_0 and
Q4_K_M, measures the machine's memory read bandwidth with `membw` (the decode roofline: every weight
byte is read once per generated token), runs `hearth bench` for decode (tg128) and prefill (pp128,
pp512) at 1 and 2 threads, and prints a markdown table with tok/s, the roofline tok/s and the
fraction of it reached. With --llama-bench PATH it also runs llama.cpp's llama-bench on the same
files, side by side, and reports hearth / llama.cpp ratios.

Decode is a stream of the weights through memory, and this machine's bandwidth moves by 10-20%
from minute to minute (other tenants), so decode is then measured again in --rounds interleaved
rounds: each round measures the roofline (membw with 4 KiB and with 2 MiB pages: the higher is the
roofline) and runs hearth and llama-bench back to back on every model, so that each ratio compares
runs a minute apart. Medians over the rounds, with their range.

usage: bench/engine.py [--build build] [--models DIR] [--reps 5] [--threads 1,2]
                       [--types Q4_0,Q8_0,Q4_K_M] [--llama-bench PATH] [--rounds 3] [--json OUT.json]
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

def decode_rounds(a, hearth, bandwidth, threads, paths):
    """tg128 in interleaved rounds: per round and thread count the roofline, then per model hearth
    and llama-bench back to back; prints a table of medians (ranges) and returns the raw figures"""
    raw = []
    for rd in range(a.rounds):
        for t in threads:
            b4, b2 = bandwidth(t, False), bandwidth(t, True)
            for ty, (path, dbytes) in paths.items():
                h = json.loads(run([hearth, "bench", "-m", path, "-t", str(t), "-p", "0", "-n", "128", "-r", "3",
                                    "--json"]))[0]["tok_per_s"]
                p = None
                if a.llama_bench:
                    lb = json.loads(run([a.llama_bench, "-m", path, "-t", str(t), "-p", "0", "-n", "128", "-r", "3",
                                         "-o", "json"]))
                    p = lb[0]["avg_ts"]
                raw.append({"round": rd, "type": ty, "threads": t, "membw_4k": b4, "membw_2m": b2,
                            "decode_bytes": dbytes, "hearth": h, "llama_bench": p})
                print("round %d %s t%d: membw %.1f/%.1f GB/s, hearth %.2f, llama.cpp %s" % (
                    rd + 1, ty, t, b4, b2, h, "%.2f" % p if p else "-"), file=sys.stderr, flush=True)

    def med(xs):
        xs = [x for x in xs if x is not None]
        return (statistics.median(xs), min(xs), max(xs)) if xs else None

    def fmt(m, f="%.1f"):
        return ("%s (%s-%s)" % (f % m[0], f % m[1], f % m[2])) if m else ""

    print("\ndecode tg128, %d interleaved rounds (medians, range); roofline = the round's better membw / bytes "
          "per token" % a.rounds)
    print("| model | threads | membw GB/s (4 KiB / 2 MiB) | hearth tok/s | llama.cpp tok/s | hearth / llama.cpp "
          "| hearth of roofline |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for t in threads:
        for ty in paths:
            rs = [r for r in raw if r["type"] == ty and r["threads"] == t]
            roof = [100 * r["hearth"] * r["decode_bytes"] / (max(r["membw_4k"], r["membw_2m"]) * 1e9) for r in rs]
            ratio = [r["hearth"] / r["llama_bench"] if r["llama_bench"] else None for r in rs]
            print("| %s | %d | %.1f / %.1f | %s | %s | %s | %s |" % (
                ty, t, statistics.median(r["membw_4k"] for r in rs), statistics.median(r["membw_2m"] for r in rs),
                fmt(med(r["hearth"] for r in rs)), fmt(med(r["llama_bench"] for r in rs)),
                fmt(med(ratio), "%.2f"), fmt(med(roof), "%.0f%%")))
    return raw

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--models", default=os.environ.get("HEARTH_BENCH_MODELS", "/tmp/hearth-bench-models"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--types", default="Q4_0,Q8_0,Q4_K_M")
    ap.add_argument("--vocab-from", default="../shared/models/stories260K.gguf")
    ap.add_argument("--llama-bench", default=None, help="path to llama.cpp's llama-bench, to run side by side")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved decode rounds (0: none)")
    ap.add_argument("--json", default=None, help="also write all results to this file")
    a = ap.parse_args()
    hearth = os.path.join(a.build, "hearth")
    membw = os.path.join(a.build, "membw")
    os.makedirs(a.models, exist_ok=True)
    threads = [int(t) for t in a.threads.split(",")]

    def bandwidth(t, huge):
        cmd = [membw, "-t", str(t), "-s", "2048", "--json"] + (["--huge"] if huge else [])
        return json.loads(run(cmd))["gb_per_s"]

    bw = {}
    for t in threads:
        bw[t] = max(bandwidth(t, False), bandwidth(t, True))

    rows, results, paths = [], {"bandwidth_gb_per_s": bw, "models": {}}, {}
    for ty in a.types.split(","):
        path = os.path.join(a.models, "llama-3.2-1b-%s.gguf" % ty)
        if not os.path.exists(path):
            run([hearth, "synth", "--shape", "llama-3.2-1b", "--type", ty, "--vocab-from", a.vocab_from, "-o", path])
        info = json.loads(run([hearth, "info", "--json", path]))
        dbytes = decode_bytes(info)
        paths[ty] = (path, dbytes)
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

    print("memory read bandwidth (membw, median, the better of 4 KiB and 2 MiB pages): " +
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
    if a.rounds > 0:
        results["rounds"] = decode_rounds(a, hearth, bandwidth, threads, paths)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)

if __name__ == "__main__":
    main()
