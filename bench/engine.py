#!/usr/bin/env python3
"""Single-device engine benchmark (issue: the engine).

Makes Llama-3.2-1B-shape models with `hearth synth` (random weights, real shapes) in Q4_0, Q8_0 and
Q4_K_M, runs `hearth bench` for decode (tg128) and prefill (pp128, pp512) at 1 and 2 threads, and
prints a markdown table with tok/s, the decode roofline and the fraction of it reached. With
--llama-bench PATH it also runs llama.cpp's llama-bench on the same files, side by side, and reports
hearth / llama.cpp ratios.

The roofline: decode reads every weight byte once per token, so its bound is the time the same
threads take to stream those bytes. This machine's bandwidth moves (on a Zen 4 VM it flips between
~35 and ~60 GB/s at 2 threads, each phase lasting tens of seconds), so a roofline measured apart
from the run misleads; `hearth bench --roofline` reads the token's weights once more as a plain
stream after every token (untimed), and each tgN's fraction is its tokens' time against those
streams, measured in the same seconds. membw (a 1-2 GiB buffer, 4 KiB and 2 MiB pages) is printed
beside it for reference, and brackets llama-bench's decode runs, which have no such stream: their
fraction uses the higher of the membw passes just before and after, only where the two agree
within 10% (see decode_rounds).

Decode is measured again in --rounds interleaved rounds: each round runs hearth and llama-bench
back to back on every model, so that each ratio compares runs seconds apart. Medians over the
rounds, with their range.

usage: bench/engine.py [--build build] [--models DIR] [--reps 5] [--threads 1,2]
                       [--types Q4_0,Q8_0,Q4_K_M] [--llama-bench PATH] [--rounds 5] [--rounds-only]
                       [--json OUT.json]
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
    """tg128 in interleaved rounds, hearth and llama-bench back to back.  hearth's roofline is its
    own same-seconds stream (hearth bench --roofline: the token's weights read once more after
    every token).  llama-bench has none, so each of its runs is bracketed by membw (2 MiB pages)
    just before and just after, and its fraction is taken only when the two agree within 10% (a
    "steady" run), against the higher of them; the tok/s and hearth / llama.cpp ratios use every
    run.  Prints a table of medians (ranges) and returns the raw figures."""
    raw = []

    def bracketed(t, cmd, get):
        b0 = bandwidth(t, True, quick=True)
        x = get(run(cmd))
        b1 = bandwidth(t, True, quick=True)
        return x, b0, b1

    for rd in range(a.rounds):
        for t in threads:
            for ty, (path, dbytes) in paths.items():
                h = json.loads(run([hearth, "bench", "-m", path, "-t", str(t), "-p", "0", "-n", "128", "-r", "1",
                                    "--roofline", "--json"]))[0]
                p, pb0, pb1 = None, None, None
                if a.llama_bench:
                    p, pb0, pb1 = bracketed(t, [a.llama_bench, "-m", path, "-t", str(t), "-p", "0", "-n", "128", "-r", "1",
                                             "-o", "json"], lambda o: json.loads(o)[0]["avg_ts"])
                raw.append({"round": rd, "type": ty, "threads": t, "decode_bytes": dbytes, "hearth": h["tok_per_s"],
                            "hearth_stream_gb_per_s": h["stream_gb_per_s"], "hearth_of_roofline": h["of_roofline"],
                            "llama_bench": p, "llama_bench_membw": [pb0, pb1]})
                print("round %d %s t%d: hearth %.2f (%.1f%% of a %.1f GB/s stream), llama.cpp %s" % (
                    rd + 1, ty, t, h["tok_per_s"], 100 * h["of_roofline"], h["stream_gb_per_s"],
                    "%.2f (membw %.1f / %.1f)" % (p, pb0, pb1) if p else "-"), file=sys.stderr, flush=True)

    def med(xs):
        xs = [x for x in xs if x is not None]
        return (statistics.median(xs), min(xs), max(xs)) if xs else None

    def fmt(m, f="%.1f"):
        return ("%s (%s-%s)" % (f % m[0], f % m[1], f % m[2])) if m else ""

    def steady(b):
        return b[0] is not None and abs(b[0] - b[1]) <= 0.1 * max(b)

    def frac(tok, dbytes, b):
        return 100 * tok * dbytes / (max(b) * 1e9)

    print("\ndecode tg128, %d interleaved rounds (medians, range); hearth of roofline: its tokens against a "
          "stream of their weights in the same seconds (hearth bench --roofline); llama.cpp of roofline: runs "
          "whose two membw passes (2 MiB pages) agree within 10%%, against the higher" % a.rounds)
    print("| model | threads | hearth tok/s | llama.cpp tok/s | hearth / llama.cpp | stream GB/s | hearth of roofline "
          "| llama.cpp steady runs | llama.cpp of roofline |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for t in threads:
        for ty in paths:
            rs = [r for r in raw if r["type"] == ty and r["threads"] == t]
            ps = [r for r in rs if r["llama_bench"] and steady(r["llama_bench_membw"])]
            ratio = [r["hearth"] / r["llama_bench"] if r["llama_bench"] else None for r in rs]
            print("| %s | %d | %s | %s | %s | %s | %s | %d / %d | %s |" % (
                ty, t, fmt(med(r["hearth"] for r in rs)), fmt(med(r["llama_bench"] for r in rs)),
                fmt(med(ratio), "%.2f"), fmt(med(r["hearth_stream_gb_per_s"] for r in rs)),
                fmt(med(100 * r["hearth_of_roofline"] for r in rs), "%.0f%%"), len(ps), len(rs),
                fmt(med(frac(r["llama_bench"], r["decode_bytes"], r["llama_bench_membw"]) for r in ps), "%.0f%%")))
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
    ap.add_argument("--rounds", type=int, default=5, help="interleaved decode rounds (0: none)")
    ap.add_argument("--rounds-only", action="store_true", help="only the decode rounds (no single pass, no prefill)")
    ap.add_argument("--json", default=None, help="also write all results to this file")
    a = ap.parse_args()
    hearth = os.path.join(a.build, "hearth")
    membw = os.path.join(a.build, "membw")
    os.makedirs(a.models, exist_ok=True)
    threads = [int(t) for t in a.threads.split(",")]

    def bandwidth(t, huge, quick=False):
        cmd = [membw, "-t", str(t), "-s", "1024" if quick else "2048", "-r", "3" if quick else "7",
               "--json"] + (["--huge"] if huge else [])
        return json.loads(run(cmd))["gb_per_s"]

    bw = {} if a.rounds_only else {t: max(bandwidth(t, False), bandwidth(t, True)) for t in threads}

    rows, results, paths = [], {"bandwidth_gb_per_s": bw, "models": {}}, {}
    for ty in a.types.split(","):
        path = os.path.join(a.models, "llama-3.2-1b-%s.gguf" % ty)
        if not os.path.exists(path):
            run([hearth, "synth", "--shape", "llama-3.2-1b", "--type", ty, "--vocab-from", a.vocab_from, "-o", path])
        info = json.loads(run([hearth, "info", "--json", path]))
        dbytes = decode_bytes(info)
        paths[ty] = (path, dbytes)
        if a.rounds_only:
            continue
        out = json.loads(run([hearth, "bench", "-m", path, "-t", a.threads, "-p", "128,512", "-n", "128",
                              "-r", str(a.reps), "--roofline", "--json"]))
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
            p = peer.get((test, t))
            rows.append((ty, test, t, r["tok_per_s"], r.get("roofline_tok_per_s"), r.get("of_roofline"),
                         r.get("stream_gb_per_s"), p))

    if not a.rounds_only:
        print_single_pass(a, threads, bw, rows)
    if a.rounds > 0:
        results["rounds"] = decode_rounds(a, hearth, bandwidth, threads, paths)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)

def print_single_pass(a, threads, bw, rows):
    print("memory read bandwidth (membw, median, the better of 4 KiB and 2 MiB pages; for reference, the "
          "roofline is each run's own stream): " +
          ", ".join("%d thread%s %.1f GB/s" % (t, "s" if t > 1 else "", bw[t]) for t in threads))
    hdr = "| model | test | threads | hearth tok/s | stream GB/s | roofline tok/s | of roofline |"
    sep = "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
    if a.llama_bench:
        hdr += " llama.cpp tok/s | hearth / llama.cpp |"
        sep += " ---: | ---: |"
    print(hdr)
    print(sep)
    for ty, test, t, ts, roof, frac, gbs, p in rows:
        line = "| llama-3.2-1b %s | %s | %d | %.1f | %s | %s | %s |" % (
            ty, test, t, ts, "%.1f" % gbs if gbs else "", "%.1f" % roof if roof else "",
            "%.0f%%" % (100 * frac) if frac else "")
        if a.llama_bench:
            line += " %s | %s |" % ("%.1f" % p if p else "", "%.2f" % (ts / p) if p else "")
        print(line)

if __name__ == "__main__":
    main()
