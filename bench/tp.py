#!/usr/bin/env python3
"""tp — tensor-parallel decoding on the emulated home cluster: token latency of a 1B-shape Q4_0
model on 1-4 devices of equal CPU share, star vs ring all-reduce, at two link latencies, with the
per-device compute / all-reduce split (`hearth run --timings`) and the simple latency model
compute/k + 2·L·(RTT + bytes/bandwidth) beside each measurement.

    sudo bench/tp.py [--build DIR] [--model M.gguf] [--devices 1,2,3,4] [--rtt 1,5] [--modes star,ring]
                     [--tokens 16] [--cpu 0.5] [--rate 1gbit] [--out bench/reports/tp]

For each RTT it writes a testbed profile (`devices` = the largest k, `cpu` cores each, one-way link
delay RTT/4 per device so that any two devices see that RTT), brings it up as its own instance,
runs the single-device baseline on d0 and then, for every k > 1 and all-reduce, `hearth worker` on
d1..d(k-1) and the head on d0 (a warm-up run fills the workers' slice caches first), and takes it
down again. Results: OUT/results.json and OUT/report.md. Needs root (the testbed) and Python 3.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ME = os.path.realpath(__file__)
SRC = os.path.dirname(os.path.dirname(ME))
TESTBED = os.path.join(SRC, "tools", "testbed")
PORT = 7070


def log(msg):
    print(f"tp: {msg}", file=sys.stderr, flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, text=True, capture_output=True, **kw)


class Bed:
    def __init__(self, instance, build):
        self.instance = instance
        self.build = build

    def tb(self, *args, check=True):
        r = sh([sys.executable, TESTBED, "--instance", self.instance] + list(args))
        if check and r.returncode:
            raise RuntimeError(f"testbed {' '.join(args)}: {r.stderr.strip()}")
        return r

    def up(self, profile):
        self.tb("down", check=False)
        self.tb("up", profile, "--linkem", os.path.join(self.build, "linkem"))

    def down(self):
        self.tb("down", check=False)

    def addr(self, dev):
        return self.tb("addr", dev).stdout.strip()

    def cmd(self, dev, argv):
        return [sys.executable, TESTBED, "--instance", self.instance, "exec", dev, "--"] + argv

    def kill(self, dev):
        self.tb("kill", dev, check=False)


def write_profile(path, n, cpu, mem, rate, rtt_ms, period_ms):
    with open(path, "w") as f:
        f.write(f"# written by bench/tp.py: {n} devices of {cpu} core, RTT {rtt_ms} ms between any two\n")
        f.write(f"description = tp bench, {n} x {cpu} core, {rate}, RTT {rtt_ms} ms\n")
        f.write(f"devices = {n}\ncpu = {cpu}\ncpu_period = {period_ms:g}ms\nmem = {mem}\nrate = {rate}\n")
        f.write(f"delay = {rtt_ms / 4:g}ms\njitter = 0\nloss = 0\n")


def parse_rate(s):
    m = re.fullmatch(r"([0-9.]+)\s*([kmg]?)(bit)?", s.lower())
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def ping_rtt(bed, a, b):
    r = sh(bed.cmd(a, ["ping", "-c", "6", "-i", "0.2", "-q", bed.addr(b)]))
    m = re.search(r"= [0-9.]+/([0-9.]+)/", r.stdout)
    return float(m.group(1)) if m else None


def parse_run(out, err, tokens):
    """the head's stderr -> latency per token and the --timings tables"""
    m = re.search(r"generation:\s+(\d+) tokens in\s+([0-9.]+) ms", err)
    if not m:
        raise RuntimeError("no generation line in the head's output:\n" + err[-2000:])
    n, ms = int(m.group(1)), float(m.group(2))
    # the limit's last token is sampled but not evaluated: n tokens, n-1 forward passes
    res = {"tokens": n, "gen_ms": ms, "token_ms": ms / max(n - 1, 1), "devices": []}
    sent = re.search(r"weight bytes sent: (\d+)", err)
    res["weight_bytes_sent"] = int(sent.group(1)) if sent else None
    part = err.split("generation, per token:", 1)
    if len(part) == 2:
        for line in part[1].splitlines()[3:]:
            f = line.split()
            # device, layers, KV heads, FFN neurons, compute, wait, send, total, KiB out
            if len(f) != 9 or not f[1].isdigit() or not f[2].isdigit() or not re.fullmatch(r"[0-9.]+", f[4]):
                break
            res["devices"].append({"name": f[0], "kv": int(f[2]), "ff": int(f[3]), "compute_ms": float(f[4]),
                                   "wait_ms": float(f[5]), "send_ms": float(f[6]), "total_ms": float(f[7]),
                                   "kib_out": float(f[8])})
    return res


def model_info(bin_, model):
    r = sh([bin_, "info", model])
    get = lambda k: int(re.search(rf"^\s*{k}\s+(\d+)", r.stdout, re.M).group(1))
    return {"n_embd": get("n_embd"), "n_layer": get("n_layer"), "n_vocab": get("n_vocab"),
            "bytes": os.path.getsize(model)}


def start_worker(bed, args, bin_, dev, flags, procs):
    """`hearth worker` on testbed device dev (cache and log in args.work), appended to procs once it
    listens"""
    cache = os.path.join(args.work, f"cache-{dev}")
    logf = open(os.path.join(args.work, f"worker-{dev}.log"), "a")
    # each device its own profile cache ($XDG_CACHE_HOME/hearth/profile.json), as each home device has: the
    # testbed's devices share one HOME, and with one file every worker read the entry the last one wrote
    # (the same key: same CPU, quota, memory, disk), so a plan costed from the caches saw one device's
    # profile everywhere (session 24: klonet8's hand-written plans predicted 30-47% slow)
    argv = ["env", f"XDG_CACHE_HOME={os.path.join(args.work, f'prof-{dev}')}",
            bin_, "worker", "--listen", f"0.0.0.0:{PORT}", "--insecure", "--cache", cache] + flags  # plaintext, as measured before issue 29
    p = subprocess.Popen(bed.cmd(dev, argv), stdout=subprocess.PIPE, stderr=logf, text=True)
    procs.append((dev, p, logf))
    line = p.stdout.readline()
    if "listening" not in line:
        raise RuntimeError(f"worker on {dev} did not start: {line}")


def stop_workers(bed, procs):
    for dev, p, logf in procs:
        bed.kill(dev)
        p.wait(timeout=10)
        logf.close()


def run_config(bed, args, k, mode, model, bin_, prompt):
    """one measurement: head on d0 + workers on d1..d(k-1); returns parse_run's dict"""
    procs = []
    try:
        for i in range(1, k):
            start_worker(bed, args, bin_, f"d{i}", ["-t", str(args.threads)], procs)
        head = [bin_, "run", "-m", model, "-p", prompt, "--temp", "0", "--ignore-eos", "-t", str(args.threads),
                "-c", "256"]
        if k > 1:
            head += ["--workers", ",".join(f"{bed.addr(f'd{i}')}:{PORT}" for i in range(1, k)),
                     "--allreduce", mode, "--timings"]
        if k > 1:  # fill the slice caches (the first time) outside the measurement
            r = sh(bed.cmd("d0", head + ["-n", "2"]), timeout=1800)
            if r.returncode:
                raise RuntimeError(f"warm-up k={k} {mode}: {r.stderr[-1500:]}")
        reps = []
        for _ in range(args.repeats):
            r = sh(bed.cmd("d0", head + ["-n", str(args.tokens)]), timeout=1800)
            if r.returncode:
                raise RuntimeError(f"k={k} {mode}: {r.stderr[-1500:]}")
            reps.append(parse_run(r.stdout, r.stderr, args.tokens))
        best = sorted(reps, key=lambda x: x["token_ms"])[len(reps) // 2]  # the median repeat
        best["repeats_token_ms"] = [x["token_ms"] for x in reps]
        return best
    finally:
        stop_workers(bed, procs)


def predict(c1, k, mode, L, rtt_ms, hidden_bytes, bw_bps, head_frac):
    """simple: C/k + 2L(RTT + B/bw) (star; B one hidden state); ring: 2(k-1) one-way hops of B/k each.
    refined: the output head (head_frac of the weights) is not split: C (f + (1 - f)/k)."""
    xfer_ms = hidden_bytes * 8 / bw_bps * 1e3
    if k == 1:
        net = 0.0
    elif mode == "star":
        net = 2 * L * (rtt_ms + xfer_ms)
    else:
        net = 2 * L * (2 * (k - 1) * (rtt_ms / 2 + xfer_ms / k))
    return {"simple_ms": c1 / k + net, "refined_ms": c1 * (head_frac + (1 - head_frac) / k) + net, "net_ms": net}


def report(res, path):
    cfg = res["config"]
    L = [f"# Tensor-parallel decoding on the testbed ({res['model_name']})", "",
         f"{cfg['n_devices_max']} devices of {cfg['cpu']} core each (this machine has {os.cpu_count()} cores), "
         f"links {cfg['rate']}, one-way delay RTT/4 per device link; {cfg['tokens']} generated tokens, "
         f"{cfg['threads']} thread per device, CPU quota period {cfg['cpu_period_ms']:g} ms, median of "
         f"{cfg['repeats']} runs (load average {res['loadavg_start'][0]:.1f} at the start, "
         f"{res['loadavg_end'][0]:.1f} at the end, from other work on the machine). Latency = generation time / "
         "forward passes. compute / wait / send: the head's per-token split (`--timings`): forward pass outside "
         "the all-reduce / waiting for the workers' partials / sending and adding. Model: "
         "simple = C/k + 2L(RTT + B/bw) (star; ring: 2(k-1) one-way hops of B/k per all-reduce), C = the "
         "1-device latency, L = layers, B = one hidden state; refined also keeps the output head (not split) whole.",
         ""]
    for rtt in cfg["rtts"]:
        meas = res["rtt_measured"].get(str(rtt))
        L += [f"## RTT {rtt} ms (ping d0→d1: {meas:.2f} ms)" if meas else f"## RTT {rtt} ms", "",
              "| devices | all-reduce | token latency ms median (min) | head compute | head ar wait | head ar send | "
              "worker compute (mean) | model simple | model refined |",
              "|---|---|---|---|---|---|---|---|---|"]
        for r in res["runs"]:
            if r["rtt"] != rtt:
                continue
            devs = r["result"]["devices"]
            hd = devs[0] if devs else None
            wc = statistics.mean(d["compute_ms"] for d in devs[1:]) if len(devs) > 1 else None
            f = lambda v: f"{v:.1f}" if v is not None else "–"
            L.append(f"| {r['k']} | {r['mode'] if r['k'] > 1 else '–'} | {r['result']['token_ms']:.1f} "
                     f"({min(r['result']['repeats_token_ms']):.1f}) | "
                     f"{f(hd['compute_ms'] if hd else r['result']['token_ms'])} | {f(hd['wait_ms'] if hd else None)} | "
                     f"{f(hd['send_ms'] if hd else None)} | {f(wc)} | {r['model']['simple_ms']:.1f} | "
                     f"{r['model']['refined_ms']:.1f} |")
        L.append("")
    with open(path, "w") as fh:
        fh.write("\n".join(L))


def common_args(ap, name):
    """the flags every testbed benchmark has (bench/tp.py, bench/pp.py)"""
    ap.add_argument("--build", default=os.environ.get("HEARTH_BUILD", os.path.join(SRC, "build")))
    ap.add_argument("--model", help="GGUF (default: synthesize llama-3.2-1b Q4_0 into --work)")
    ap.add_argument("--work", default=f"/tmp/hearth-{name}-bench")
    ap.add_argument("--prompt", default="Once upon a time")
    ap.add_argument("--out", default=os.path.join(SRC, "bench", "reports", name))


def setup(args, name):
    """root check, folders, the hearth binary and the model (synthesized when not given): (bin, model)"""
    if os.geteuid() != 0:
        sys.exit(f"{name}: needs root (the testbed creates namespaces and cgroups)")
    bin_ = os.path.join(os.path.realpath(args.build), "hearth")
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    model = args.model or os.path.join(args.work, "llama-3.2-1b-Q4_0.gguf")
    if not os.path.exists(model):
        print(f"{name}: synthesizing {model}", file=sys.stderr, flush=True)
        r = sh([bin_, "synth", "--shape", "llama-3.2-1b", "--type", "Q4_0", "-o", model])
        if r.returncode:
            sys.exit(r.stderr)
    return bin_, model


def save(res, out):
    """results.json as it stands (after every configuration, so an interrupted run keeps its figures)"""
    with open(os.path.join(out, "results.json"), "w") as fh:
        json.dump(res, fh, indent=1)


def finish(res, out, report_fn):
    """the end of a run: the load average, results.json, report.md (printed too)"""
    res["loadavg_end"] = os.getloadavg()
    save(res, out)
    report_fn(res, os.path.join(out, "report.md"))
    print(open(os.path.join(out, "report.md")).read())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common_args(ap, "tp")
    ap.add_argument("--devices", default="1,2,3,4")
    ap.add_argument("--rtt", default="1,5", help="RTTs in ms")
    ap.add_argument("--modes", default="star,ring")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cpu", default="0.5")
    ap.add_argument("--mem", default="3G")
    ap.add_argument("--cpu-period", type=float, default=4.0,
                    help="CFS period of the CPU quota, ms (default 4: a throttled device waits at most "
                         "(1 - cpu) x 4 ms for its next slice, against 5 ms with the testbed's default 10 ms; "
                         "at 1 ms the kernel no longer enforces the quota: a 0.25-core device measured 0.47)")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--instance", default="tpb")
    args = ap.parse_args()
    bin_, model = setup(args, "tp")
    info = model_info(bin_, model)
    hidden_bytes = info["n_embd"] * 4 + 64   # f32 hidden state + frame and field headers
    head_frac = info["n_vocab"] * info["n_embd"] * 18 / 32 / info["bytes"]  # Q4_0 output head / all weights
    devices = [int(x) for x in args.devices.split(",")]
    rtts = [float(x) for x in args.rtt.split(",")]
    modes = args.modes.split(",")
    bed = Bed(args.instance, os.path.realpath(args.build))
    res = {"model": model, "model_name": os.path.basename(model), "info": info,
           "config": {"n_devices_max": max(devices), "cpu": args.cpu, "cpu_period_ms": args.cpu_period, "rate": args.rate, "tokens": args.tokens,
                      "threads": args.threads, "repeats": args.repeats, "rtts": rtts, "modes": modes},
           "rtt_measured": {}, "runs": [], "started": time.strftime("%Y-%m-%d %H:%M:%S"),
           "loadavg_start": os.getloadavg()}
    try:
        for rtt in rtts:
            prof = os.path.join(tempfile.mkdtemp(prefix="tp-prof-"), f"tp-rtt{rtt:g}")
            write_profile(prof, max(devices), args.cpu, args.mem, args.rate, rtt, args.cpu_period)
            log(f"testbed up: {max(devices)} devices, RTT {rtt} ms")
            bed.up(prof)
            if max(devices) > 1:
                res["rtt_measured"][str(rtt)] = ping_rtt(bed, "d0", "d1")
            c1 = None
            for k in devices:
                for mode in (modes if k > 1 else ["none"]):
                    log(f"RTT {rtt} ms, {k} devices, {mode}")
                    r = run_config(bed, args, k, mode, model, bin_, args.prompt)
                    if k == 1:
                        c1 = r["token_ms"]
                    m = predict(c1 or r["token_ms"], k, mode, info["n_layer"], rtt, hidden_bytes,
                                parse_rate(args.rate), head_frac)
                    res["runs"].append({"rtt": rtt, "k": k, "mode": mode, "result": r, "model": m})
                    log(f"  {r['token_ms']:.1f} ms/token (model {m['simple_ms']:.1f} / {m['refined_ms']:.1f})")
                    save(res, args.out)
            bed.down()
    finally:
        bed.down()
    finish(res, args.out, report)


if __name__ == "__main__":
    main()
