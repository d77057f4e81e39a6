#!/usr/bin/env python3
"""pp — piped-ring pipelines on the emulated home cluster when the model does not fit: a 1B-shape
Q4_0 model on 4 devices whose memory budgets sum to about half of it, with 1, 2 and 4 trips round the
ring per token (--layer-windows 4,4,4,4 / 2,2,2,2 / 1,1,1,1), each with prefetch (hearth's residency
manager streams every device's next blocks while the others compute and releases used ones), without
prefetch (the manager loads a block only when compute reaches it, still releasing), and with plain
mmap under the devices' cgroup memory limits (what llama.cpp-style mmap does: the kernel evicts and
faults pages back in) — the ablation of prima.cpp Fig. 2 / Table 3 on our testbed. With --single, one
device with a budget of the same total runs the model alone, for comparison.

    sudo bench/pp.py [--build DIR] [--model M.gguf] [--rounds 1,2,4] [--modes prefetch,noprefetch,mmap]
                     [--head-budget 200M] [--worker-budget 60M] [--tokens 16] [--repeats 3] [--single]
                     [--out bench/reports/pp]

Every device gets 0.5 core (4 devices: the machine's 2 cores), a cgroup memory limit of its budget
plus --slack, 1 Gbit/s links and RTT 1 ms. Per configuration: a warm-up run fills the workers' slice
caches, then --repeats runs of --tokens generated tokens with `--timings --stats-json` (the per-token
stats round trips are left out of the token time by hearth run). Reported per configuration: token
latency (median of the repeats, min), and per device the disk bytes read per token, time blocked on
weights per token, peak resident weight bytes and memory pressure; per device and block kind the
TPI-LLM Prop. 4 check: t_compute + t_sync >= tau_load of the next block predicts that loading is
hidden (t_sync: the device's time outside its own compute per block, i.e. the others' turn).
Results: OUT/results.json and OUT/report.md. Needs root (the testbed) and Python 3.
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import tp  # noqa: E402  (the testbed wrapper and the --timings parser)



def log(msg):
    print(f"pp: {msg}", file=sys.stderr, flush=True)


def size_bytes(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
    return int(float(s.rstrip("KMG")) * mult)


def write_profile(path, n, cpu, period_ms, mems):
    with open(path, "w") as f:
        f.write(f"# written by bench/pp.py: {n} devices of {cpu} core, RTT 1 ms, memory limits per device\n")
        f.write(f"description = pp bench, {n} x {cpu} core\n")
        f.write(f"devices = {n}\ncpu = {cpu}\ncpu_period = {period_ms:g}ms\nrate = 1gbit\n")
        f.write("delay = 0.25ms\njitter = 0\nloss = 0\n")
        for i, m in enumerate(mems):
            f.write(f"d{i} mem={m // (1 << 20)}M\n")


def mem_flags(mode, budget):
    if mode == "mmap":
        return ["--mem-budget", "off"]
    return ["--mem-budget", str(budget)] + (["--no-prefetch"] if mode == "noprefetch" else [])


def run_config(bed, args, bin_, model, k, sizes, mode, budgets):
    """head on d0 + workers on d1..d(k-1): a warm-up run (the workers' slice caches), then one
    measured run; returns its figures"""
    procs = []
    stats = os.path.join(args.work, "stats.json")
    try:
        for i in range(1, k):
            tp.start_worker(bed, args, bin_, f"d{i}", ["-t", "1"] + mem_flags(mode, budgets[i]), procs)
        head = [bin_, "run", "-m", model, "-p", args.prompt, "--temp", "0", "--ignore-eos", "-t", "1", "-c", "256",
                "-b", "32", "--timings", "--stats-json", stats] + mem_flags(mode, budgets[0])
        if k > 1:
            head += ["--workers", ",".join(f"{bed.addr(f'd{i}')}:{tp.PORT}" for i in range(1, k)), "--pp",
                     "--layer-windows", ",".join(str(s) for s in sizes)]
            r = tp.sh(bed.cmd("d0", head + ["-n", "2"]), timeout=3600)
            if r.returncode:
                raise RuntimeError(f"warm-up {sizes} {mode}: {r.stderr[-1500:]}")
        r = tp.sh(bed.cmd("d0", head + ["-n", str(args.tokens)]), timeout=3600)
        if r.returncode:
            raise RuntimeError(f"{sizes} {mode}: {r.stderr[-1500:]}")
        res = tp.parse_run(r.stdout, r.stderr, args.tokens)
        with open(stats) as fh:
            res["stats"] = json.load(fh)
        res["token_ms"] = res["stats"]["ms_per_token"]
        return res
    finally:
        tp.stop_workers(bed, procs)


def prop4(dev, timings, token_ms):
    """TPI-LLM Prop. 4 for one device: per block kind, compute t and load tau (the manager's figures),
    and t_sync = the device's time per token outside its own forward pass (the rest of the ring's turn,
    links), spread over its blocks per token. Also the pipeline's own form of the condition: the load
    time the device's streamed blocks need per token against that idle time."""
    b = dev["blocks"]
    layers = max(1, dev["n_layers"])
    passes = max(1, b["attn"]["n"] // layers)
    blocks_per_token = 2 * layers
    comp = timings["compute_ms"] if timings else token_ms
    idle = max(0.0, token_ms - comp)
    sync = idle / blocks_per_token
    t_a, t_f = b["attn"]["compute_ms_per_block"], b["ffn"]["compute_ms_per_block"]
    tau_a, tau_f = b["attn"]["load_ms_per_block"], b["ffn"]["load_ms_per_block"]
    load = (b["attn"]["loads"] * tau_a + b["ffn"]["loads"] * tau_f) / passes
    hidden = (t_a + sync >= tau_f) and (t_f + sync >= tau_a)
    # within a window blocks follow each other with no sync: TPI's condition with t_sync = 0
    hidden_in_window = t_a >= tau_f and t_f >= tau_a
    # the idle time can preload at most the loader's room; the rest streams while the window computes
    stream, room = dev.get("stream_bytes_per_token", 0), dev.get("room_bytes", 0)
    pure = (b["attn"]["n"] * t_a + b["ffn"]["n"] * t_f) / passes
    late = load * max(0, stream - room) / stream if stream else 0.0
    return {"t_attn": t_a, "t_ffn": t_f, "t_sync": sync, "tau_attn": tau_a, "tau_ffn": tau_f, "predict_hidden": hidden,
            "hidden_in_window": hidden_in_window, "load_ms_per_token": load, "idle_ms_per_token": idle,
            "stream_mib": stream / 1048576, "room_mib": room / 1048576,
            "predict_blocked_ms": max(0.0, late - pure), "blocked_ms_per_token": dev["weights_wait_ms_per_token"]}


def report(res, path):
    cfg = res["config"]
    mib = lambda v: f"{v / 1048576:.1f}" if v is not None else "–"
    L = [f"# Piped-ring pipelines under memory budgets on the testbed ({res['model_name']}, "
         f"{res['model_bytes'] / 1048576:.0f} MiB)", "",
         f"{cfg['devices']} devices of {cfg['cpu']} core each (this machine has {os.cpu_count()} cores), 1 Gbit/s, "
         f"RTT 1 ms; budgets: head {mib(cfg['budgets'][0])} MiB (it also holds the "
         f"{mib(res['output_bytes'])} MiB output head), workers {mib(cfg['budgets'][1])} MiB each = "
         f"{100 * sum(cfg['budgets']) / res['model_bytes']:.0f}% of the model in total; cgroup limit = budget + "
         f"{mib(cfg['slack'])} MiB. {cfg['tokens']} generated tokens, median of {cfg['repeats']} rounds (min in "
         f"brackets; every configuration runs once per round, so the host's drifting disk speed affects all alike); load average {res['loadavg_start'][0]:.1f} at the start, {res['loadavg_end'][0]:.1f} at the end. "
         "prefetch: the residency manager streams each device's next blocks while the ring computes elsewhere and "
         "releases used ones; no prefetch: it loads a block when compute reaches it; mmap: no manager, the "
         "cgroup limit makes the kernel evict and fault pages back in.", "",
         "| trips | windows | mode | ms/token | disk MiB/token (head, workers) | blocked ms/token (head, workers) | "
         "peak resident MiB (head, workers) | pressure % (max) |", "|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        st = r["result"]["stats"]
        devs = st["devices"]
        d = lambda key, f: ", ".join(f(x[key]) for x in devs)
        disk = d("disk_read_bytes_per_token", lambda v: f"{v / 1048576:.0f}" if v is not None else "?")
        blk = d("weights_wait_ms_per_token", lambda v: f"{v:.0f}")
        peak = d("resident_peak_bytes", lambda v: f"{v / 1048576:.0f}")
        pres = max(x["pressure"] for x in devs) * 100
        L.append(f"| {r['trips']} | {r['windows']} | {r['mode']} | {r['result']['token_ms']:.0f} "
                 f"({min(r['result']['repeats_token_ms']):.0f}) | {disk} | {blk} | {peak} | {pres:.2f} |")
    L += ["", "## Is loading hidden? TPI-LLM Prop. 4, per device (prefetch runs)", "",
          "Times in ms. t = compute per block, tau = load per block (the loader's time for a whole block), "
          "t_sync = the device's idle time per token (the rest of the ring's turn) spread over its blocks. "
          "*Prop. 4, spread*: TPI-LLM's condition t_attn + t_sync >= tau_ffn and t_ffn + t_sync >= tau_attn. "
          "*Prop. 4, in a window*: the same with t_sync = 0, as blocks of one window follow each other with no "
          "sync between them. *load / idle*: the loader's time for the blocks streamed per token against the idle "
          "time per token. The idle time can preload at most the loader's *room*; the rest of the *stream* loads "
          "while the window computes: *predicted blocked* = load x (stream - room) / stream - compute of the "
          "window, at least 0. *blocked* is what was measured.",
          "", "| trips | device | t_attn | t_ffn | t_sync | tau_attn | tau_ffn | Prop. 4, spread | Prop. 4, in a window | "
          "load / idle | stream / room MiB | predicted blocked | blocked |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        if r["mode"] != "prefetch":
            continue
        for p in r["prop4"]:
            yn = lambda v: "hidden" if v else "not hidden"
            L.append(f"| {r['trips']} | {p['name']} | {p['t_attn']:.2f} | {p['t_ffn']:.2f} | {p['t_sync']:.2f} | "
                     f"{p['tau_attn']:.2f} | "
                     f"{p['tau_ffn']:.2f} | {yn(p['predict_hidden'])} | {yn(p['hidden_in_window'])} | "
                     f"{p['load_ms_per_token']:.0f} / {p['idle_ms_per_token']:.0f} | {p['stream_mib']:.0f} / "
                     f"{p['room_mib']:.0f} | {p['predict_blocked_ms']:.0f} | {p['blocked_ms_per_token']:.0f} |")
    L.append("")
    with open(path, "w") as fh:
        fh.write("\n".join(L))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    tp.common_args(ap, "pp")
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--rounds", default="1,2,4", help="trips round the ring per token")
    ap.add_argument("--modes", default="prefetch,noprefetch,mmap")
    ap.add_argument("--head-budget", default="200M")
    ap.add_argument("--worker-budget", default="60M")
    ap.add_argument("--slack", default="48M", help="cgroup limit above the budget (process memory)")
    ap.add_argument("--single", action="store_true", help="also one device with the budgets' total")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cpu", default="0.5")
    ap.add_argument("--cpu-period", type=float, default=4.0)
    ap.add_argument("--instance", default="ppb")
    ap.add_argument("--report-only", action="store_true", help="rewrite OUT/report.md from OUT/results.json")
    args = ap.parse_args()
    if args.report_only:
        report(json.load(open(os.path.join(args.out, "results.json"))), os.path.join(args.out, "report.md"))
        return
    bin_, model = tp.setup(args, "pp")
    info = tp.model_info(bin_, model)
    k = args.devices
    budgets = [size_bytes(args.head_budget)] + [size_bytes(args.worker_budget)] * (k - 1)
    slack = size_bytes(args.slack)
    rounds = [int(x) for x in args.rounds.split(",")]
    modes = args.modes.split(",")
    res = {"model": model, "model_name": os.path.basename(model), "model_bytes": info["bytes"], "info": info,
           "output_bytes": info["n_vocab"] * info["n_embd"] * 18 // 32,
           "config": {"devices": k, "cpu": args.cpu, "budgets": budgets, "slack": slack, "tokens": args.tokens,
                      "repeats": args.repeats, "rounds": rounds, "modes": modes},
           "runs": [], "started": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg_start": os.getloadavg()}
    bed = tp.Bed(args.instance, os.path.realpath(args.build))
    prof = os.path.join(tempfile.mkdtemp(prefix="pp-prof-"), "pp")
    write_profile(prof, k, args.cpu, args.cpu_period, [b + slack for b in budgets])
    try:
        log(f"testbed up: {k} devices; budgets {[b >> 20 for b in budgets]} MiB "
            f"({100 * sum(budgets) / info['bytes']:.0f}% of the model)")
        bed.up(prof)
        configs = []
        if args.single:
            configs.append((1, None, "prefetch"))
        for t in rounds:
            size = info["n_layer"] // (k * t)
            if size < 1 or size * k * t != info["n_layer"]:
                log(f"skipping {t} trips: {info['n_layer']} layers do not split into {k} x {t} equal windows")
                continue
            configs += [(t, [size] * k, m) for m in modes]
        # rounds: every configuration once per round, so that the host's disk speed, which drifts by
        # 2-3x within minutes, affects all of them alike; the median round is reported
        got = [[] for _ in configs]
        for rnd in range(args.repeats):
            for ci, (t, sizes, mode) in enumerate(configs):
                windows = ",".join(map(str, sizes)) if sizes else "–"
                kk = k if sizes else 1
                bud = budgets if sizes else [sum(budgets)]
                r = run_config(bed, args, bin_, model, kk, sizes, mode, bud)
                got[ci].append(r)
                log(f"round {rnd}: {t} trip(s), windows {windows}, {mode}: {r['token_ms']:.0f} ms/token")
        for ci, (t, sizes, mode) in enumerate(configs):
            windows = ",".join(map(str, sizes)) if sizes else "–"
            r = sorted(got[ci], key=lambda x: x["token_ms"])[len(got[ci]) // 2]
            r["repeats_token_ms"] = [x["token_ms"] for x in got[ci]]
            devs = r["stats"]["devices"]
            p4 = []
            for i, dv in enumerate(devs):
                tm = r["devices"][i] if i < len(r["devices"]) else None
                q = prop4(dv, tm, r["token_ms"])
                q["name"] = dv["name"]
                p4.append(q)
            res["runs"].append({"trips": t if sizes else "1 device", "windows": windows, "mode": mode, "result": r,
                                "prop4": p4})
            tp.save(res, args.out)
    finally:
        bed.down()
    tp.finish(res, args.out, report)


if __name__ == "__main__":
    main()
