#!/usr/bin/env python3
"""plan — the planner's predictions against measurement on the emulated home cluster (issue 26): on
a testbed profile, `hearth plan --json` on d0 with workers on the other devices, then every candidate
it lists is run (`hearth run` with the candidate's flags: none for one device, --tp-shares for TP,
--pp --layer-windows for a pipeline) and its decode ms/token measured; the report puts predicted and
measured side by side, with the error, and marks the chosen plan.

    sudo bench/plan.py [--profile pair2] [--build DIR] [--model M.gguf] [--tokens 16] [--repeats 2]
                       [--ctx 256] [--out bench/reports/plan-pair2]

The profiles are measured afresh (--no-cache: the machine's load changes). Every device runs with -t 1 (the profiles give each device a fraction of one core). Per candidate: a
warm-up run (fills the workers' slice caches), then --repeats runs of --tokens tokens; latency =
generation time / forward passes, median. Results: OUT/results.json and OUT/report.md. Needs root.
--profile-only: the first profile's time alone (per device and the cluster's), no candidate runs.
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import tp  # noqa: E402  (the testbed wrapper, worker start, the run parser)


def log(msg):
    print(f"plan: {msg}", file=sys.stderr, flush=True)


def drop_cache(path):
    """the model's pages out of the page cache, so that a device reads them under its own memory
    limit (pages cached by another cgroup would be hits it is never charged for)"""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cand_flags(c, addrs):
    """the hearth run flags that run candidate c (workers: the cluster's addresses, head first)"""
    if c["kind"] == "single":
        return []
    w = ",".join(addrs[d] for d in c["devices"][1:])
    if c["kind"] == "tp":   # the lossy twin runs lossy (before session 25 it ran as the TCP plan: same flags)
        return ["--workers", w, "--tp-shares", ",".join(f"{x:.6f}" for x in c["shares"])] + \
            (["--lossy", "--lossy-deadline", f"{c.get('deadline_ms', 10):g}"] if c.get("lossy") else [])
    if c["kind"] == "hybrid":  # a stage per device but the group's: devices[group_stage..group_stage + group)
        g, n, gs = c["group"], len(c["devices"]), c.get("group_stage", 0)
        stages = ",".join([str(i) for i in range(gs)] + ["+".join(str(i) for i in range(gs, gs + g))] +
                          [str(i) for i in range(gs + g, n)])
        return ["--workers", w, "--stages", stages, "--tp-shares", ",".join(f"{x:.6f}" for x in c["shares"]),
                "--layer-windows", ",".join(str(x) for x in c["windows"])]
    return ["--workers", w, "--pp", "--layer-windows", ",".join(str(x) for x in c["windows"])]


def report(res, path):
    rows = []
    errs = []
    for i, c in enumerate(res["candidates"]):
        meas = c.get("measured_ms_per_token")
        pred = c["predicted_ms_per_token"]
        err = None
        if meas and pred:
            err = (pred - meas) / meas * 100
            errs.append(abs(err))
        mark = "**" if i == res["chosen"] else ""
        rows.append(f"| {mark}{i}{mark} | {c['plan']} | {pred if pred is None else f'{pred:.1f}'} | "
                    f"{'-' if meas is None else f'{meas:.1f}'} | {'-' if err is None else f'{err:+.0f}%'} |")
    with open(path, "w") as f:
        f.write(f"# Planner: predicted vs measured, {res['profile']}, {os.path.basename(res['model'])}\n\n")
        f.write(f"Command: `{res['command']}`\n\n")
        f.write("| # | plan | predicted ms/token | measured ms/token (median) | error |\n|---|---|---|---|---|\n")
        f.write("\n".join(rows) + "\n\n")
        if errs:
            f.write(f"Median absolute error {statistics.median(errs):.0f}%, largest {max(errs):.0f}% "
                    f"({len(errs)} candidates). Chosen: {res['chosen']} (bold).\n")
            best = min((c for c in res["candidates"] if c.get("measured_ms_per_token")),
                       key=lambda c: c["measured_ms_per_token"])
            ch = res["candidates"][res["chosen"]]
            if ch.get("measured_ms_per_token"):
                f.write(f"Chosen measured {ch['measured_ms_per_token']:.1f} ms/token, best measured "
                        f"{best['measured_ms_per_token']:.1f} ({best['plan']}): "
                        f"{ch['measured_ms_per_token'] / best['measured_ms_per_token']:.2f}x.\n")


def planner_args(name, doc, tokens, repeats):
    """the flags of the planner benchmarks (this one and bench/sweep.py)"""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    tp.common_args(ap, name)
    ap.add_argument("--profile", default="pair2")
    ap.add_argument("--tokens", type=int, default=tokens)
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--instance", default={"plan": "plan"}.get(name, "sw"))
    ap.add_argument("--serial", action="store_true", help="hearth plan --profile-serial (the devices share cores)")
    return ap


def main():
    ap = planner_args("plan", __doc__, 16, 2)
    ap.add_argument("--profile-only", action="store_true",
                    help="only the first profile (hearth plan --no-cache): its time per device and in all, no runs")
    args = ap.parse_args()
    if args.out == os.path.join(tp.SRC, "bench", "reports", "plan"):
        args.out += "-" + args.profile
    bin_, model = tp.setup(args, "plan")
    bed = tp.Bed(args.instance, args.build)
    res = {"profile": args.profile, "model": model, "command": " ".join(sys.argv), "candidates": []}
    procs = []
    try:
        bed.up(args.profile)
        n = len(bed.tb("devices").stdout.split())
        addrs = ["head"] + [f"{bed.addr(f'd{i}')}:{tp.PORT}" for i in range(1, n)]
        for i in range(1, n):
            tp.start_worker(bed, args, bin_, f"d{i}", ["-t", "1"], procs)
        head_cache = os.path.join(args.work, "head-cache")
        env = ["env", f"XDG_CACHE_HOME={head_cache}"]
        plan_argv = [bin_, "plan", "-m", model, "--workers", ",".join(addrs[1:]), "-t", "1", "-c", str(args.ctx),
                     "--json", "--no-cache", "--plan-trial", "0"] + (["--profile-serial"] if args.serial else [])
        # --plan-trial 0: this measures the cost model, whose choice is the prediction's (bench/sweep.py measures
        # the planner's default, a trial among near-ties)
        r = tp.sh(bed.cmd("d0", env + plan_argv), timeout=600)
        if r.returncode:
            raise RuntimeError("hearth plan: " + r.stderr[-2000:])
        plan = json.loads(r.stdout)
        res["plan"] = plan
        res["chosen"] = plan["chosen"]
        res["profile_ms"] = plan.get("profile_ms")
        log(f"first profile: {plan.get('profile_ms', 0):.0f} ms; devices "
            + ", ".join(f"{d.get('profile_ms', 0):.0f}" for d in plan["devices"]) + " ms")
        for i, c in enumerate([] if args.profile_only else plan["candidates"]):
            entry = {k: c.get(k) for k in ("kind", "plan", "devices", "group", "shares", "windows", "trips", "feasible",
                                           "predicted_ms_per_token", "predicted_prefill_ms")}
            res["candidates"].append(entry)
            if not c["feasible"]:
                continue
            head = env + [bin_, "run", "-m", model, "-p", args.prompt, "--temp", "0", "--ignore-eos", "-t", "1",
                          "-c", str(args.ctx)] + cand_flags(c, addrs)
            log(f"candidate {i}: {c['plan']} (predicted {c['predicted_ms_per_token']:.1f} ms/token)")
            drop_cache(model)
            w = tp.sh(bed.cmd("d0", head + ["-n", "2"]), timeout=1800)
            if w.returncode:
                entry["error"] = w.stderr[-800:]
                log(f"candidate {i} failed: {w.stderr[-300:]}")
                continue
            ms = []
            for _ in range(args.repeats):
                drop_cache(model)
                r = tp.sh(bed.cmd("d0", head + ["-n", str(args.tokens)]), timeout=1800)
                if r.returncode:
                    raise RuntimeError(f"candidate {i}: {r.stderr[-1500:]}")
                ms.append(tp.parse_run(r.stdout, r.stderr, args.tokens)["token_ms"])
            entry["measured_runs_ms"] = ms
            entry["measured_ms_per_token"] = statistics.median(ms)
            log(f"candidate {i}: measured {entry['measured_ms_per_token']:.1f} ms/token")
            tp.save(res, args.out)
    finally:
        tp.stop_workers(bed, procs)
        bed.down()
    tp.finish(res, args.out, report)


if __name__ == "__main__":
    main()
