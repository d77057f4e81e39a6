#!/usr/bin/env python3
"""recost — the cost model against sweeps already measured, without a testbed: every plan of one or more
bench/sweep.py results (the planner's candidates and the hand-written plans) is predicted again by this
build's `hearth plan --cluster` from the devices and links the sweep's step 1 profiled, and set against
the sweep's measurements. For working on the cost model (src/plan/cost.c): a change is judged on every
scenario measured so far in seconds, and the sweeps are run again only to confirm it.

    bench/recost.py --build build bench/reports/sweep-home4/results.json bench/reports/sweep-klonet8/results.json
                    [--model M.gguf] [--json OUT.json]

Per plan: the sweep's prediction, this build's, the measured median; per scenario: median and largest
absolute error of both, and the plan this build's model would choose among those measured, against the
fastest measured (the chosen/best figure of the sweep, were the sweep re-run with the same timings).
The plan over devices D is costed on a cluster of D alone, in plan order (links kept), with the plan's
own flags (`hearth plan --cluster SUB.json [FLAGS]`, the "given plan"); one device: the single candidate.
Each sweep's model must be at --model or at the path results.json names. Python's standard library only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def sub_cluster(plan_json, devices):
    """the saved cluster of `hearth plan --json` cut to devices, in that order (device i becomes index i)"""
    devs = [dict(plan_json["devices"][d], index=i) for i, d in enumerate(devices)]
    pos = {d: i for i, d in enumerate(devices)}
    links = []
    for lk in plan_json["links"]:
        if lk["a"] in pos and lk["b"] in pos:
            a, b = pos[lk["a"]], pos[lk["b"]]
            e = dict(lk, a=min(a, b), b=max(a, b))
            if a > b:   # the directions swap with the ends
                e["loss_ab"], e["loss_ba"] = lk.get("loss_ba", lk["loss"]), lk.get("loss_ab", lk["loss"])
            links.append(e)
    return {"devices": devs, "links": links}


def predict(bin_, model, ctx, plan_json, p, tmp):
    """this build's ms/token for sweep plan p (None: refused or does not fit, with the reason)"""
    path = os.path.join(tmp, "cluster.json")
    with open(path, "w") as f:
        json.dump(sub_cluster(plan_json, p["devices"]), f)
    flags = [] if p["kind"] == "single" else [x for x in p.get("flags", []) if x]
    r = subprocess.run([bin_, "plan", "-m", model, "--cluster", path, "-t", "1", "-c", str(ctx), "--json"] + flags,
                       capture_output=True, text=True, timeout=600)
    try:
        out = json.loads(r.stdout)
    except ValueError:
        return None, (r.stderr.strip() or "no JSON")[-300:]
    if p["kind"] == "single":
        c = out["candidates"][0]
        return (c["predicted_ms_per_token"], "") if c["feasible"] else (None, c.get("why", ""))
    g = out.get("given_plan")
    if not g:
        return None, (r.stderr.strip() or "no given_plan")[-300:]
    return (g["predicted_ms_per_token"], "") if g["feasible"] else (None, g.get("why", ""))


def errors(rows, key):
    e = [abs(r[key] - r["measured"]) / r["measured"] * 100 for r in rows if r.get(key) and r.get("measured")]
    return (statistics.median(e), max(e), len(e)) if e else (None, None, 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("results", nargs="+", help="bench/sweep.py results.json files")
    ap.add_argument("--build", default="build", help="folder of the hearth binary to cost with")
    ap.add_argument("--model", help="the sweeps' model (default: the path each results.json names)")
    ap.add_argument("--json", help="write every plan's figures here")
    ap.add_argument("-v", "--verbose", action="store_true", help="every plan's row, not only the summaries")
    args = ap.parse_args()
    bin_ = os.path.join(args.build, "hearth")
    if not os.access(bin_, os.X_OK):
        sys.exit(f"recost: no hearth binary at {bin_}")
    out = []
    with tempfile.TemporaryDirectory(prefix="recost-") as tmp:
        for path in args.results:
            res = json.load(open(path))
            model = args.model or res["model"]
            if not os.path.exists(model):
                sys.exit(f"recost: {path}: its model {model} is not here (--model)")
            rows = []
            for p in res["plans"]:
                meas = p.get("measured_ms_per_token")
                if not meas:
                    continue
                new, why = predict(bin_, model, res["ctx"], res["plan"], p, tmp)
                rows.append({"label": p["label"], "kind": p["kind"], "hand": bool(p.get("hand")), "measured": meas,
                             "old": p.get("predicted_ms_per_token"), "new": new, "why": why})
            name = res["profile"]
            print(f"\n{name} ({os.path.basename(model)}, {len(rows)} plans measured)")
            if args.verbose:
                for r in rows:
                    f = lambda v: "-" if v is None else f"{v:7.1f}"  # noqa: E731
                    e = lambda v: "" if v is None else f"{(v - r['measured']) / r['measured'] * 100:+6.1f}%"  # noqa: E731
                    print(f"  {r['label'][:72]:72} meas {r['measured']:7.1f}  sweep {f(r['old'])} {e(r['old']):8}"
                          f"  now {f(r['new'])} {e(r['new']):8} {r['why'][:60]}")
            for which, sel in (("candidates", [r for r in rows if not r["hand"]]), ("hand-written", [r for r in rows if r["hand"]]),
                               ("all", rows)):
                o, n = errors(sel, "old"), errors(sel, "new")
                if o[2] or n[2]:
                    fmt = lambda t: "-" if t[0] is None else f"{t[0]:.1f}% / {t[1]:.1f}% ({t[2]})"  # noqa: E731
                    print(f"  {which:13} median / largest |error|: sweep {fmt(o):24} now {fmt(n)}")
            best = min(rows, key=lambda r: r["measured"])
            for key in ("old", "new"):
                pick = min((r for r in rows if r.get(key) and not r["hand"]), key=lambda r: r[key], default=None)
                if pick:
                    print(f"  {'sweep' if key == 'old' else 'now':5} would choose {pick['label'][:60]}: measured "
                          f"{pick['measured']:.1f}, {pick['measured'] / best['measured']:.2f}x the best measured "
                          f"({best['label'][:50]}, {best['measured']:.1f})")
            out.append({"results": path, "profile": name, "plans": rows})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
