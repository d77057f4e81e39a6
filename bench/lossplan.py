#!/usr/bin/env python3
"""lossplan — issue 28's loss-aware planning on the emulated home cluster: for each loss rate, what
`hearth plan` measures (each link's datagram loss) and predicts for reliable TCP tensor parallelism,
the lossy all-reduce and the best pipeline over the 8 devices, against what they measure, and whether
the planner's own choice (`hearth run --workers ...` without plan flags) is the fastest measured.

    sudo bench/lossplan.py [--build DIR] [--model M.gguf] [--profile klonet8] [--losses 0,1,2,5]
                           [--tokens 8] [--repeats 1] [--instance lp] [--subnet 10.77.61.0/24] [--out DIR]

Per loss: the testbed comes up (`--set loss=L`: L percent of what every device sends is dropped),
`hearth worker` on d1..d7, then on d0: `hearth plan --json --profile-serial`; the 8-device TP
candidate's shares run reliable (`--tp-shares S`) and lossy (`--tp-shares S --lossy`); the fastest
pipeline candidate runs with its windows (`--pp --layer-windows W`, over its devices); and the plain
`hearth run --workers ...` runs whatever the planner chooses. Each: a warm-up (fills the slice
caches), then --repeats runs of --tokens tokens; ms/token = generation time / (tokens - 1), median.
Results: OUT/results.json and OUT/report.md. Needs root (the testbed).
"""

import argparse
import json
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from tp import PORT, SRC, Bed, sh  # noqa: E402
from lossy import N_DEV, start_workers, stop_workers, token_ms  # noqa: E402



def log(msg):
    print(f"lossplan: {msg}", file=sys.stderr, flush=True)


def pick(plan):
    """the candidates measured: TP over all devices (reliable, lossy), the fastest pipeline, the chosen"""
    c = plan["candidates"]
    tp = {x["lossy"]: x for x in c if x["kind"] == "tp" and len(x["devices"]) == N_DEV}
    pp = [x for x in c if x["kind"] == "pp" and x["feasible"]]
    best_pp = min(pp, key=lambda x: x["predicted_ms_per_token"]) if pp else None
    return {"tcp": tp.get(False), "lossy": tp.get(True), "pp": best_pp, "chosen": c[plan["chosen"]]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--model", default="/tmp/lossy/m1b.gguf")
    ap.add_argument("--profile", default="klonet8")
    ap.add_argument("--losses", default="0,1,2,5")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per head run")
    ap.add_argument("--instance", default="lp")
    ap.add_argument("--subnet", default="10.77.61.0/24")
    ap.add_argument("--out", default=os.path.join(SRC, "bench", "reports", "lossplan"))
    args = ap.parse_args()
    work = os.path.join(args.out, "work")
    os.makedirs(work, exist_ok=True)
    bin_ = os.path.join(args.build, "hearth")
    bed = Bed(args.instance, args.build)
    res = {"config": vars(args), "loadavg_start": os.getloadavg(), "runs": []}
    try:
        for loss in [float(x) for x in args.losses.split(",")]:
            log(f"{args.profile} loss {loss:g}%: up")
            bed.tb("down", check=False)
            bed.tb("up", args.profile, "--linkem", os.path.join(bed.build, "linkem"), "--set", f"loss={loss}",
                   "--set", f"subnet={args.subnet}")
            procs = []
            try:
                start_workers(bed, bin_, work, procs)
                addrs = [f"{bed.addr(f'd{i}')}:{PORT}" for i in range(1, N_DEV)]
                base = [bin_, "-m", args.model, "-t", "1", "-c", "256"]
                t0 = time.time()
                # --plan-trial 0: the loss model's own choice (a trial would measure the near-ties instead)
                r = sh(bed.cmd("d0", [bin_, "plan"] + base[1:] + ["--workers", ",".join(addrs), "--profile-serial",
                                                                  "--json", "--plan-trial", "0"]), timeout=args.timeout)
                if r.returncode:
                    raise RuntimeError(f"plan at {loss}: {r.stderr[-1500:]}")
                plan = json.loads(r.stdout)
                plan_s = time.time() - t0
                json.dump(plan, open(os.path.join(work, f"plan-{loss:g}.json"), "w"), indent=1)
                cand = pick(plan)
                run = {"loss": loss, "plan_s": plan_s, "profile_ms": plan["profile_ms"],
                       "link_loss": [d.get("loss", 0) for d in plan["devices"][1:]],
                       "why": plan["why"], "modes": {}}
                log(f"loss {loss:g}%: plan in {plan_s:.1f} s; links lose {run['link_loss']}; chosen {cand['chosen']['plan']}")
                for mode in ("tcp", "lossy", "pp", "chosen"):
                    c = cand[mode]
                    if c is None:
                        continue
                    ws = [addrs[d - 1] for d in c["devices"][1:]]
                    head = [bin_, "run"] + base[1:] + ["-p", "Once upon a time", "--temp", "0", "--ignore-eos",
                                                      "--cache", os.path.join(work, "cache-d0")]
                    if mode == "chosen":
                        head += ["--workers", ",".join(addrs), "--profile-serial"]
                    elif c["kind"] == "tp":
                        head += ["--workers", ",".join(ws), "--tp-shares", ",".join(f"{x:.6f}" for x in c["shares"])]
                        head += ["--lossy"] if c["lossy"] else []
                    else:
                        head += ["--workers", ",".join(ws), "--pp", "--layer-windows", ",".join(map(str, c["windows"]))]
                    r = sh(bed.cmd("d0", head + ["-n", "2"]), timeout=args.timeout)
                    if r.returncode:
                        raise RuntimeError(f"warm-up {loss} {mode}: {r.stderr[-1500:]}")
                    reps, lines = [], []
                    for k in range(args.repeats):
                        r = sh(bed.cmd("d0", head + ["-n", str(args.tokens)]), timeout=args.timeout)
                        if r.returncode:
                            raise RuntimeError(f"{loss} {mode}: {r.stderr[-1500:]}")
                        reps.append(token_ms(r.stderr))
                        lines = [x for x in r.stderr.splitlines() if re.search(r"\bplan: ", x)]
                    m = {"plan": c["plan"], "predicted": c["predicted_ms_per_token"], "measured": statistics.median(reps),
                         "repeats": reps, "loss_ms": c.get("loss_ms", 0)}
                    if mode == "chosen":
                        m["log"] = lines
                    run["modes"][mode] = m
                    log(f"loss {loss:g}% {mode}: predicted {m['predicted']:.1f}, measured {m['measured']:.1f} ms/token")
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
    L = [f"# Issue 28: loss-aware planning on {cfg['profile']} ({os.path.basename(cfg['model'])})", "",
         f"{cfg['tokens']} tokens, median of {cfg['repeats']}; load average {res['loadavg_start'][0]:.1f} at the "
         f"start, {res['loadavg_end'][0]:.1f} at the end.", "",
         "| loss % | measured link loss % (median) | TCP TP pred / meas | lossy TP pred / meas | best PP pred / meas "
         "| chosen | chosen meas | fastest measured |", "|---|---|---|---|---|---|---|---|"]
    for run in res["runs"]:
        m = run["modes"]
        f = lambda k: f"{m[k]['predicted']:.0f} / {m[k]['measured']:.0f}" if k in m else "-"
        fastest = min((k for k in ("tcp", "lossy", "pp") if k in m), key=lambda k: m[k]["measured"])
        ch = m.get("chosen", {})
        L.append(f"| {run['loss']:g} | {100 * statistics.median(run['link_loss']):.2f} | {f('tcp')} | {f('lossy')} | "
                 f"{f('pp')} | {ch.get('plan', '-')} | {ch.get('measured', 0):.0f} | {fastest} |")
    open(path, "w").write("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
