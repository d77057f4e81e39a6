#!/usr/bin/env python3
"""mem — one device, a model larger than its memory: hearth's residency manager against plain mmap
(hearth --mem-budget off) and, with --llama-bench, llama.cpp, each inside a cgroup memory limit of
(share of the weights + --slack), for shares 100%, 50%, 25% of the weights (docs/memory.md has the
method and the Q4_0/Q4_1 figures; this script makes the runs repeatable).

    sudo bench/mem.py --model M.gguf [--build build] [--shares 100,50,25] [--rounds 3] [--tokens 8]
                      [--threads 2] [--llama-bench PATH] [--out bench/reports/mem-Q8_0]

Per round and share, the systems run interleaved (the host's disk speed drifts within minutes, so
only interleaved medians compare), each from a cold page cache for the model file (dd iflag=nocache),
inside a fresh child of this process's memory cgroup (v1: memory.limit_in_bytes; the peak is
memory.max_usage_in_bytes, OOM kills from memory.oom_control). hearth: `bench -p 0 -n TOKENS -r 2 -b 32
--mem-budget N% --json`; llama.cpp: `llama-bench -p 0 -n TOKENS -r 2 -b 32 -o json`. Results:
OUT/results.json and OUT/report.md (median over rounds).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SRC = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def log(msg):
    print(f"mem: {msg}", file=sys.stderr, flush=True)


def own_cgroup():
    for line in open("/proc/self/cgroup"):
        _, ctrl, path = line.strip().split(":", 2)
        if "memory" in ctrl.split(","):
            return "/sys/fs/cgroup/memory" + path
    sys.exit("mem: no cgroup v1 memory controller (this script handles v1, the machine's kind)")


def run_in_cgroup(parent, limit, argv, timeout=1800):
    cg = os.path.join(parent, f"hearth-mem-bench-{os.getpid()}")
    os.mkdir(cg)
    try:
        with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
        try:
            with open(os.path.join(cg, "memory.swappiness"), "w") as f:
                f.write("0")
        except OSError:
            pass
        pre = lambda: open(os.path.join(cg, "cgroup.procs"), "w").write(str(os.getpid()))
        r = subprocess.run(argv, capture_output=True, text=True, preexec_fn=pre, timeout=timeout)
        peak = int(open(os.path.join(cg, "memory.max_usage_in_bytes")).read())
        oom = 0
        for line in open(os.path.join(cg, "memory.oom_control")):
            if line.startswith("oom_kill "):
                oom = int(line.split()[1])
        return r, peak, oom
    finally:
        for _ in range(50):
            try:
                os.rmdir(cg)
                break
            except OSError:
                time.sleep(0.1)


def cold(model):
    subprocess.run(["dd", f"if={model}", "iflag=nocache", "count=0"], capture_output=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--shares", default="100,50,25")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slack", type=int, default=64, help="MiB of cgroup limit above the share (the process)")
    ap.add_argument("--llama-bench", default=None)
    ap.add_argument("--out", default=os.path.join(SRC, "bench", "reports", "mem"))
    ap.add_argument("--report-only", action="store_true", help="rewrite OUT/report.md from OUT/results.json")
    a = ap.parse_args()
    if a.report_only:
        res = json.load(open(os.path.join(a.out, "results.json")))
        res.setdefault("systems", sorted({x["system"] for x in res["runs"]}, key=lambda n: (n != "hearth, manager", n)))
        res.setdefault("shares", sorted({x["share"] for x in res["runs"]}, reverse=True))
        return report(res, a.out)
    if os.geteuid() != 0:
        sys.exit("mem: needs root (memory cgroups)")
    hearth = os.path.join(os.path.realpath(a.build), "hearth")
    info = json.loads(subprocess.run([hearth, "info", "--json", a.model], capture_output=True, text=True).stdout)
    weights = sum(t["bytes"] for t in info["tensors"])
    parent = own_cgroup()
    os.makedirs(a.out, exist_ok=True)
    common = ["-p", "0", "-n", str(a.tokens), "-r", "2", "-b", "32", "-t", str(a.threads)]
    systems = [("hearth, manager", lambda pct: [hearth, "bench", "-m", a.model] + common + ["--mem-budget", f"{pct}%", "--json"]),
               ("hearth, plain mmap", lambda pct: [hearth, "bench", "-m", a.model] + common + ["--mem-budget", "off", "--json"])]
    if a.llama_bench:
        systems.append(("llama-bench", lambda pct: [a.llama_bench, "-m", a.model] + common + ["-o", "json"]))
    res = {"model": a.model, "weights": weights, "threads": a.threads, "tokens": a.tokens, "slack_mib": a.slack,
           "started": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg_start": os.getloadavg(), "runs": []}
    for rnd in range(a.rounds):
        for pct in [int(x) for x in a.shares.split(",")]:
            limit = weights * pct // 100 + a.slack * 1048576
            for name, argv in systems:
                cold(a.model)
                r, peak, oom = run_in_cgroup(parent, limit, argv(pct))
                row = {"round": rnd, "share": pct, "system": name, "limit": limit, "peak": peak, "oom_kills": oom,
                       "rc": r.returncode}
                if r.returncode == 0:
                    out = json.loads(r.stdout)
                    tg = [x for x in out if x.get("test", "").startswith("tg") or x.get("n_gen", 0) > 0][0]
                    tps = tg.get("tok_per_s", tg.get("avg_ts"))
                    row["ms_per_token"] = 1000.0 / tps
                    # hearth bench --json with a manager (or observing, with --mem-budget off)
                    conv = {"mem_mode": ("mode", 1), "disk_bytes_per_tok": ("disk_mib_per_token", 1048576),
                            "blocked_ms_per_tok": ("blocked_ms_per_token", 1),
                            "resident_bytes_median": ("resident_mib", 1048576), "pressure": ("pressure", 1),
                            "pinned_bytes": ("pinned_mib", 1048576), "t_attn_ms": ("t_attn_ms", 1),
                            "t_ffn_ms": ("t_ffn_ms", 1), "tau_attn_ms": ("tau_attn_ms", 1),
                            "tau_ffn_ms": ("tau_ffn_ms", 1)}
                    for k, (name_, div) in conv.items():
                        if k in tg:
                            row[name_] = tg[k] / div if div != 1 else tg[k]
                else:
                    row["error"] = (r.stderr or "")[-300:]
                res["runs"].append(row)
                log(f"round {rnd} {pct}% {name}: " + (f"{row['ms_per_token']:.0f} ms/token" if "ms_per_token" in row
                                                     else f"failed (rc {r.returncode}, OOM kills {oom})"))
                with open(os.path.join(a.out, "results.json"), "w") as f:
                    json.dump(res, f, indent=1)
    res["loadavg_end"] = os.getloadavg()
    res["systems"] = [name for name, _ in systems]
    res["shares"] = [int(x) for x in a.shares.split(",")]
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    report(res, a.out)


def report(res, out):
    L = [f"# One device under a memory limit: {os.path.basename(res['model'])} ({res['weights'] / 1048576:.0f} MiB of "
         "weights)", "",
         f"{res['threads']} threads, {res['tokens']} tokens x 2 reps per run, cgroup limit = share + {res['slack_mib']} "
         f"MiB, cold page cache per run, median over {1 + max(x['round'] for x in res['runs'])} interleaved rounds "
         f"(load average {res['loadavg_start'][0]:.1f} -> {res['loadavg_end'][0]:.1f}). Plain mmap runs the manager in "
         "observe mode (figures only).", "",
         "| share | system | ms/token | disk MiB/token | blocked ms/token | resident MiB | cgroup peak MiB | pressure % | "
         "OOM-killed |", "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for pct in res["shares"]:
        for name in res["systems"]:
            rows = [x for x in res["runs"] if x["share"] == pct and x["system"] == name]
            ok = [x for x in rows if "ms_per_token" in x]
            med = lambda k: statistics.median(x[k] for x in ok if k in x) if any(k in x for x in ok) else None
            f = lambda v, p=0: "" if v is None else f"{v:.{p}f}"
            pres = med("pressure")
            peak = statistics.median(x["peak"] for x in rows) / 1048576
            L.append(f"| {pct}% | {name}{' (' + ok[0]['mode'] + ')' if ok and 'mode' in ok[0] else ''} | "
                     f"{f(med('ms_per_token'))} | {f(med('disk_mib_per_token'))} | {f(med('blocked_ms_per_token'))} | "
                     f"{f(med('resident_mib'))} | {peak:.0f} | {f(None if pres is None else 100 * pres, 2)} | "
                     f"{sum(1 for x in rows if x['rc'] != 0)}/{len(rows)} |")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
