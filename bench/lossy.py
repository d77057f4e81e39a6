#!/usr/bin/env python3
"""lossy — issue 28 on the emulated home cluster: decode latency of reliable TCP tensor parallelism,
the lossy all-reduce (`--lossy`: partials over UDP with a deadline) and a pipeline (`--pp`), on 8
devices, at several packet loss rates.

    sudo bench/lossy.py [--build DIR] [--model M.gguf] [--profiles pi8-lossy,klonet8] [--losses 0,1,2,5]
                        [--modes tcp,lossy,pp] [--tokens 16] [--repeats 3] [--deadline 10] [--out DIR]

For each profile and loss it brings the testbed up as its own instance (`--loss L`: L percent of what
every device sends is dropped), starts `hearth worker` on d1..d7, and for each mode runs the head on
d0: one warm-up run (fills the workers' slice caches), then `--repeats` runs of `--tokens` generated
tokens; latency = generation time / forward passes, the median repeat is reported. The lossy runs'
--stats-json gives the datagrams lost and elements lost per all-reduce. Results: OUT/results.json
and OUT/report.md. Needs root (the testbed) and Python 3.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from tp import PORT, SRC, Bed, sh  # noqa: E402  (the testbed wrapper of bench/tp.py)

N_DEV = 8


def log(msg):
    print(f"lossy: {msg}", file=sys.stderr, flush=True)


def bed_up(bed, profile, loss):
    """the profile with `loss` percent of every device's packets dropped"""
    bed.tb("down", check=False)
    bed.tb("up", profile, "--linkem", os.path.join(bed.build, "linkem"), "--set", f"loss={loss}")


def token_ms(err):
    m = re.search(r"generation:\s+(\d+) tokens in\s+([0-9.]+) ms", err)
    if not m:
        raise RuntimeError("no generation line in the head's output:\n" + err[-2000:])
    n, ms = int(m.group(1)), float(m.group(2))
    return ms / max(n - 1, 1)  # the limit's last token is sampled, not evaluated


def lossy_figures(path):
    try:
        d = json.load(open(path))
    except (OSError, ValueError):
        return None
    devs = d.get("devices", [])
    if not devs or "lossy" not in devs[0]:
        return None
    head = devs[0]["lossy"]
    sent = sum(x["lossy"]["datagrams_sent"] for x in devs[1:])
    lost = sum(x["lossy"]["datagrams_lost"] for x in devs[1:])
    n = head["allreduces"]
    return {"datagrams_sent": sent, "datagrams_lost": lost, "allreduces": n,
            "elements_lost_per_allreduce": head["elements_lost"] / n if n else 0,
            "elements_lost_max": head["elements_lost_max"],
            "hashes_agree": len({x["sum_hash"] for x in devs}) == 1}


def start_workers(bed, bin_, work, procs):
    """`hearth worker` on d1..d7 (appended to procs as they start, so that stop_workers ends them all)"""
    for i in range(1, N_DEV):
        dev = f"d{i}"
        logf = open(os.path.join(work, f"worker-{dev}.log"), "a")
        argv = [bin_, "worker", "--listen", f"0.0.0.0:{PORT}", "--insecure", "--cache",
                os.path.join(work, f"cache-{dev}"), "-t", "1", "--setup-timeout", "600"]
        p = subprocess.Popen(bed.cmd(dev, argv), stdout=subprocess.PIPE, stderr=logf, text=True)
        procs.append((dev, p, logf))
        if "listening" not in p.stdout.readline():
            raise RuntimeError(f"worker on {dev} did not start")


def stop_workers(bed, procs):
    for dev, p, logf in procs:
        bed.kill(dev)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
        logf.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--model", default="/tmp/lossy/m1b.gguf")
    ap.add_argument("--profiles", default="pi8-lossy,klonet8")
    ap.add_argument("--losses", default="0,1,2,5")
    ap.add_argument("--modes", default="tcp,lossy,pp")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--deadline", type=int, default=10)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per head run")
    ap.add_argument("--out", default=os.path.join(SRC, "bench", "reports", "lossy"))
    ap.add_argument("--instance", default="lossy")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = os.path.join(args.out, "work")
    os.makedirs(work, exist_ok=True)
    bin_ = os.path.join(args.build, "hearth")
    bed = Bed(args.instance, args.build)
    res = {"config": vars(args), "loadavg_start": os.getloadavg(), "runs": []}
    prompt = "Once upon a time"
    try:
        for prof in args.profiles.split(","):
            for loss in [float(x) for x in args.losses.split(",")]:
                log(f"{prof} loss {loss:g}%: up")
                bed_up(bed, prof, loss)
                procs = []
                try:
                    start_workers(bed, bin_, work, procs)
                    workers = ",".join(f"{bed.addr(f'd{i}')}:{PORT}" for i in range(1, N_DEV))
                    for mode in args.modes.split(","):
                        head = [bin_, "run", "-m", args.model, "-p", prompt, "--temp", "0", "--ignore-eos", "-t", "1",
                                "-c", "256", "--workers", workers, "--cache", os.path.join(work, "cache-d0")]
                        head += {"tcp": ["--tp-shares", "equal"],
                                 "lossy": ["--tp-shares", "equal", "--lossy", "--lossy-deadline", str(args.deadline)],
                                 "pp": ["--pp"]}[mode]
                        r = sh(bed.cmd("d0", head + ["-n", "2"]), timeout=args.timeout)
                        if r.returncode:
                            raise RuntimeError(f"warm-up {prof} {loss} {mode}: {r.stderr[-1500:]}")
                        reps, lossy = [], []
                        for k in range(args.repeats):
                            js = os.path.join(work, f"stats-{prof}-{loss:g}-{mode}-{k}.json")
                            extra = ["--stats-json", js] if mode == "lossy" else []
                            t0 = time.time()
                            r = sh(bed.cmd("d0", head + ["-n", str(args.tokens)] + extra), timeout=args.timeout)
                            if r.returncode:
                                raise RuntimeError(f"{prof} {loss} {mode}: {r.stderr[-1500:]}")
                            reps.append(token_ms(r.stderr))
                            if mode == "lossy":
                                lossy.append(lossy_figures(js))
                            log(f"{prof} loss {loss:g}% {mode}: {reps[-1]:.1f} ms/token ({time.time() - t0:.0f} s)")
                        run = {"profile": prof, "loss": loss, "mode": mode, "token_ms": statistics.median(reps),
                               "repeats_token_ms": reps}
                        if lossy:
                            run["lossy"] = lossy
                        res["runs"].append(run)
                        json.dump(res, open(os.path.join(args.out, "results.json"), "w"), indent=1)
                finally:
                    stop_workers(bed, procs)
    finally:
        bed.down()
    res["loadavg_end"] = os.getloadavg()
    json.dump(res, open(os.path.join(args.out, "results.json"), "w"), indent=1)
    report(res, os.path.join(args.out, "report.md"))


def report(res, path):
    cfg = res["config"]
    L = [f"# Issue 28: lossy TP on the testbed ({os.path.basename(cfg['model'])})", "",
         f"8 devices (head d0 + 7 workers), 1 thread each, {cfg['tokens']} generated tokens, median of "
         f"{cfg['repeats']} runs; lossy deadline {cfg['deadline']} ms; load average "
         f"{res['loadavg_start'][0]:.1f} at the start, {res['loadavg_end'][0]:.1f} at the end.", "",
         "| profile | loss % | TCP TP ms/token | lossy TP ms/token | PP ms/token | lossy / TCP speed-up | "
         "elements lost per all-reduce (lossy) | devices agree |",
         "|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["profile"], r["loss"]) for r in res["runs"]}, key=lambda x: (x[0], x[1]))
    for prof, loss in keys:
        by = {r["mode"]: r for r in res["runs"] if r["profile"] == prof and r["loss"] == loss}
        t = lambda m: f"{by[m]['token_ms']:.1f}" if m in by else "-"
        sp = f"{by['tcp']['token_ms'] / by['lossy']['token_ms']:.2f}x" if "tcp" in by and "lossy" in by else "-"
        lf = [x for x in by.get("lossy", {}).get("lossy", []) if x]
        el = f"{statistics.median(x['elements_lost_per_allreduce'] for x in lf):.1f}" if lf else "-"
        ag = ("yes" if all(x["hashes_agree"] for x in lf) else "NO") if lf else "-"
        L.append(f"| {prof} | {loss:g} | {t('tcp')} | {t('lossy')} | {t('pp')} | {sp} | {el} | {ag} |")
    open(path, "w").write("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
