#!/usr/bin/env python3
"""tpsplit — TP splits over every device of a testbed profile measured side by side, with each device's time
per token (`hearth run --timings`: compute, wait, send): what decides a split where the cost model cannot
(docs/planner.md, "Session 41: what decides a TP split on home4-8b-tiny").

    sudo bench/tpsplit.py --profile home4-8b-tiny --model M.gguf --cache-max 4500M \\
                          --shares 0.25,0.2,0.4,0.15 --shares 0.053515,0.292708,0.487274,0.166503 ...
                          [--tokens 9] [--rounds 2] [--out bench/reports/tpsplit-home4-8b-tiny]

Round 0 runs every split once with -n 2 (fills the workers' slice caches), then --rounds rounds run every
split once each, every other round in reverse order, the model dropped from the page cache before every
run (as bench/sweep.py measures). Latency = generation time / forward passes. The head's total minus a
worker's is the token's tail in which only the head works (the output head). Results: OUT/results.json and
OUT/report.md. Needs root (the testbed) and Python 3's standard library only.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import sweep  # noqa: E402  (run_argv, drop_cache, drop_work_caches)
import tp  # noqa: E402  (the testbed wrapper, worker start, the run parser)


def report(res, path):
    lines = [f"# TP splits on {res['profile']}", "", f"`{res['command']}`", "",
             f"{res['started']} to {res.get('finished', '(running)')}, load average {res['loadavg_start'][0]:.1f}"
             f" at the start; every figure is ms per token, the device's times of the median round.", "",
             "| shares | rounds ms/token | median | head compute / wait | workers' compute | workers' total | head tail |",
             "|---|---|---|---|---|---|---|"]
    for s in res["splits"]:
        runs = s.get("runs", [])
        if not runs:
            lines.append(f"| {s['shares']} | {s.get('error', 'not measured')[:80]} | | | | | |")
            continue
        med = sorted(runs, key=lambda r: r["token_ms"])[len(runs) // 2]
        head, workers = med["devices"][0], med["devices"][1:]
        wtotal = max(w["total_ms"] for w in workers) if workers else 0
        rounds = ", ".join("%.1f" % r["token_ms"] for r in runs)
        wc = ", ".join("%.0f" % w["compute_ms"] for w in workers)
        lines.append(f"| {s['shares']} | {rounds} | {statistics.median(r['token_ms'] for r in runs):.1f} | "
                     f"{head['compute_ms']:.0f} / {head['wait_ms']:.0f} | {wc} | {wtotal:.0f} | "
                     f"{head['total_ms'] - wtotal:.0f} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    tp.common_args(ap, "tpsplit")
    ap.add_argument("--profile", default="home4-8b-tiny")
    ap.add_argument("--shares", action="append", required=True, help="a split over every device, head first")
    ap.add_argument("--tokens", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--cache-max", default="4500M")
    ap.add_argument("--instance", default="ts")
    args = ap.parse_args()
    bin_, model = tp.setup(args, "tpsplit")
    bed = tp.Bed(args.instance, os.path.realpath(args.build))
    res = {"profile": args.profile, "model": model, "command": "sudo " + " ".join(sys.argv),
           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "loadavg_start": os.getloadavg(),
           "splits": [{"shares": s} for s in args.shares]}
    env = ["env", f"XDG_CACHE_HOME={os.path.join(args.work, 'head-cache')}"]
    procs = []
    try:
        bed.up(args.profile)
        n = len(bed.tb("devices").stdout.split())
        addrs = ["head"] + [f"{bed.addr(f'd{i}')}:{tp.PORT}" for i in range(1, n)]
        for s in res["splits"]:
            if len(s["shares"].split(",")) != n:
                sys.exit(f"tpsplit: --shares {s['shares']}: {n} devices in {args.profile}")
        for i in range(1, n):
            tp.start_worker(bed, args, bin_, f"d{i}", ["-t", "1", "--cache-max", args.cache_max,
                                                       "--setup-timeout", "300"], procs)
        for rnd in range(args.rounds + 1):
            for s in res["splits"] if rnd % 2 == 0 else res["splits"][::-1]:
                if s.get("error"):
                    continue
                plan = {"kind": "tp", "devices": list(range(n)), "flags": ["--tp-shares", s["shares"], "--timings"]}
                cmd = sweep.run_argv(bin_, model, args, plan, addrs, 2 if rnd == 0 else args.tokens)
                sweep.drop_cache(model)
                r = tp.sh(bed.cmd("d0", env + cmd), timeout=1800)
                if r.returncode:
                    s["error"] = r.stderr.strip()[-600:]
                    continue
                if rnd:
                    run = tp.parse_run(r.stdout, r.stderr, args.tokens)
                    s.setdefault("runs", []).append(run)
                    print(f"tpsplit: round {rnd}: {s['shares']}: {run['token_ms']:.1f} ms/token", file=sys.stderr,
                          flush=True)
                    tp.save(res, args.out)
    finally:
        tp.stop_workers(bed, procs)
        bed.down()
        sweep.drop_work_caches(args.work)
    res["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    tp.finish(res, args.out, report)


if __name__ == "__main__":
    main()
