#!/usr/bin/env python3
"""sweep — the planner's chosen plan against every candidate it costs and a sweep of hand-written
plans, on a testbed profile (issue 26): per scenario

  1. `hearth plan --json --no-cache [--profile-serial]` on d0 with workers on every other device;
  2. every feasible candidate it lists and every hand-written plan (HAND below: TP share variants,
     --layer-windows sets, trip counts; --plans FILE adds more, e.g. hybrids with --stages; the
     planner's hybrid candidates run as bench/plan.py runs them) is run with `hearth run` and its
     decode ms/token measured;
  3. the planner's prediction for every hand-written plan: `hearth plan --json` with its flags over its
     devices (from the profiles cached in step 1; the median of 3 calls, each measuring the links again;
     docs/planner.md, "A given plan");
  4. report.md: predicted vs measured for the candidates and, apart, the hand-written plans (median and
     largest absolute error), the
     chosen plan's measured ms/token over the best of the whole sweep, and sweep.svg: every plan's
     measured ms/token (min-max whiskers, the prediction where there is one), the chosen plan marked.

    sudo bench/sweep.py --profile home4 [--serial] [--model M.gguf] [--tokens 9] [--repeats 3]
                        [--ctx 256] [--instance sw] [--plans EXTRA.json] [--top N] [--reprofile]
                        [--out bench/reports/sweep-home4]
    bench/sweep.py --report bench/reports/sweep-home4/results.json   # re-render report.md and the plot

Measurement: round 0 runs every plan once with -n 2 (fills the workers' slice caches; a plan that
fails here is reported and dropped), then --repeats rounds run every plan once each with -n TOKENS,
every other round in reverse order, so that a change of the machine's load touches every plan alike
(the testbed shares one machine's cores). Latency = generation time / forward passes (TOKENS - 1);
a plan's figure is the median of its rounds. --top N measures only the chosen candidate and the N
predicted fastest (with every hand-written plan): an 8B sweep's warm-ups send GBs of slices a plan.
--reprofile profiles every device again before each measuring round and predicts every measured plan
from that round's profiles, so that the report can set each measurement against a prediction from the
same minutes (the shared host's speed drifts by up to a quarter over a sweep) beside the usual figure
(every measurement against the first profile, which is what a user's cached profile gives).
The model is dropped from the page cache before every run (bench/plan.py: pages another cgroup cached
are never charged to the device). The load average
is recorded before every run. Every device runs with -t 1. Results: OUT/results.json (after every
run), OUT/report.md, OUT/sweep.svg. Needs root (the testbed) and Python 3's standard library only.

--plans FILE: a JSON list of {"label": "...", "kind": "tp"|"pp"|"hybrid"|..., "devices": [0, 2, ...],
"flags": ["--pp", "--layer-windows", "0,16"]}: devices are testbed device indices, head (0) first;
flags are `hearth run` flags besides --workers (which the script derives from devices).
"""

import json
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import tp  # noqa: E402  (the testbed wrapper, worker start, the run parser)
from plan import cand_flags, drop_cache, planner_args  # noqa: E402


def log(msg):
    print(f"sweep: {msg}", file=sys.stderr, flush=True)


def tp_plan(devices, shares):
    return {"kind": "tp", "devices": devices, "label": f"tp {','.join(map(str, devices))} shares "
            + ",".join(f"{x:g}" for x in shares),
            "flags": ["--tp-shares", ",".join(f"{x:g}" for x in shares)]}


def pp_plan(devices, windows, n_layer):
    trips = trip_count(windows, n_layer)
    return {"kind": "pp", "devices": devices, "label": f"pp {','.join(map(str, devices))} windows "
            + ",".join(map(str, windows)) + f" ×{trips}",
            "flags": ["--pp", "--layer-windows", ",".join(map(str, windows))]}


def trip_count(windows, n_layer):
    """round trips of the ring the runtime makes (windows dealt round the ring until every layer is placed)"""
    return -(-n_layer // sum(windows))


# Hand-written plans per testbed profile, for a model of n_layer layers (written for the 16 layers of
# the 1B shape; windows scale with n_layer). Chosen to span what a user might try: TP with equal,
# speed-proportional and skewed shares over several device sets; pipelines of one trip with even,
# speed-proportional and head-less windows; the same sets with 2, 4, 8 trips. Hybrids: --plans.
def hand_plans(profile, n_layer):
    L = n_layer
    q = lambda f: max(1, round(L * f))  # noqa: E731  (a window as a fraction of the layers)
    if profile == "pair2":   # 2 x 0.5 core, 256 MiB each: the 1B model streams from disk on both
        return [tp_plan([0, 1], [0.5, 0.5]), tp_plan([0, 1], [0.3, 0.7]), tp_plan([0, 1], [0.7, 0.3]),
                pp_plan([0, 1], [L // 2, L // 2], L), pp_plan([0, 1], [0, L], L),
                pp_plan([0, 1], [q(1 / 4), L - q(1 / 4)], L), pp_plan([0, 1], [q(1 / 4), q(1 / 4)], L),
                pp_plan([0, 1], [q(1 / 8), q(1 / 8)], L), pp_plan([0, 1], [q(1 / 16), q(1 / 16)], L),
                pp_plan([0, 1], [0, q(1 / 4)], L), pp_plan([0, 1], [q(1 / 16), q(3 / 16)], L),
                pp_plan([0, 1], [0, 1], L)]
    if profile == "home4":   # d0 0.5 core, d1 0.4, d2 0.8, d3 0.3; everything fits for the 1B shape
        cpu = [0.5, 0.4, 0.8, 0.3]
        return [tp_plan([0, 1, 2, 3], [0.25] * 4), tp_plan([0, 1, 2, 3], [c / sum(cpu) for c in cpu]),
                tp_plan([0, 2], [0.5, 0.5]), tp_plan([0, 2], [0.2, 0.8]),
                pp_plan([0, 1, 2, 3], [L // 4] * 4, L),
                pp_plan([0, 1, 2, 3], [q(0.25), q(0.1875), L - q(0.25) - q(0.1875) - q(0.1875), q(0.1875)], L),
                pp_plan([0, 1, 2, 3], [q(1 / 8)] * 4, L), pp_plan([0, 1, 2, 3], [q(1 / 16)] * 4, L),
                pp_plan([0, 2], [L // 2, L // 2], L), pp_plan([0, 2], [0, L // 2], L),
                pp_plan([0, 2], [0, q(1 / 4)], L), pp_plan([0, 2], [q(3 / 8), L - q(3 / 8)], L),
                pp_plan([0, 1, 2], [0, q(5 / 16), L - q(5 / 16)], L),
                pp_plan([0, 2, 3], [0, L - q(3 / 16), q(3 / 16)], L)]
    if profile.startswith("home4-8b"):  # home4's cores, memory x0.4 (small) or x0.2 (tiny): 8B streams somewhere
        cpu, mem = [0.5, 0.4, 0.8, 0.3], [0.96, 1.64, 3.88, 0.76]
        by_mem = [max(1, round(L * m / sum(mem))) for m in mem]
        by_mem[2] = L - by_mem[0] - by_mem[1] - by_mem[3]
        return [tp_plan([0, 1, 2, 3], [0.25] * 4), tp_plan([0, 1, 2, 3], [c / sum(cpu) for c in cpu]),
                tp_plan([0, 1, 2, 3], [m / sum(mem) for m in mem]), tp_plan([0, 2], [0.2, 0.8]),
                pp_plan([0, 1, 2, 3], [L // 4] * 4, L), pp_plan([0, 1, 2, 3], by_mem, L),
                pp_plan([0, 1, 2, 3], [q(1 / 16), q(3 / 16), q(21 / 32), q(3 / 32)], L),
                pp_plan([0, 1, 2, 3], [q(1 / 16)] * 4, L), pp_plan([0, 1, 2, 3], [0, q(1 / 16), q(1 / 8), q(1 / 16)], L),
                pp_plan([0, 2], [0, L // 2], L), pp_plan([0, 2], [q(1 / 8), L - q(1 / 8)], L),
                pp_plan([0, 1, 2], [0, q(1 / 4), L - q(1 / 4)], L), pp_plan([0, 1, 2], [0, q(1 / 32), q(1 / 8)], L)]
    if profile == "klonet8":  # 8 x 0.25 core, 2 GiB each, RTT 2 ms, 300 Mbit/s
        return [tp_plan([0, 1], [0.5, 0.5]), tp_plan([0, 1, 2, 3], [0.25] * 4),
                tp_plan(list(range(6)), [1 / 6] * 6), tp_plan(list(range(8)), [0.125] * 8),
                pp_plan(list(range(8)), [L // 8] * 8, L), pp_plan(list(range(8)), [q(1 / 16)] * 8, L),
                pp_plan(list(range(8)), [0] + [L // 7 + (1 if i < L % 7 else 0) for i in range(7)], L),
                pp_plan([0, 1, 2, 3], [L // 4] * 4, L), pp_plan([0, 1, 2, 3], [q(1 / 8)] * 4, L),
                pp_plan([0, 1, 2, 3], [q(1 / 16)] * 4, L), pp_plan([0, 1], [L // 2, L // 2], L),
                pp_plan([0, 1], [0, L], L)]
    # any other profile: a generic set over the head and the first worker and over every device
    n = len(tools_profile_devices(profile))
    every = list(range(n))
    return [tp_plan([0, 1], [0.5, 0.5]), tp_plan(every, [1 / n] * n), pp_plan([0, 1], [L // 2, L // 2], L),
            pp_plan([0, 1], [0, L], L), pp_plan(every, [max(1, L // n)] * n, L),
            pp_plan(every, [max(1, L // (2 * n))] * n, L)]


def tools_profile_devices(profile):
    path = profile if os.path.sep in profile else os.path.join(tp.SRC, "tools", "profiles", profile)
    for line in open(path):
        if line.split("=")[0].strip() == "devices":
            return range(int(line.split("=")[1]))
    return range(2)


def short_label(p, n_layer):
    """one compact name for a candidate or a hand-written plan: kind, devices, shares or windows × trips"""
    devs = ",".join(map(str, p["devices"]))
    f = p.get("flags", [])
    if p["kind"] == "single":
        return "single (d0)"
    if p["kind"] == "tp" and "--tp-shares" in f:
        sh = f[f.index("--tp-shares") + 1].split(",")
        return f"tp {devs} shares " + ",".join(f"{float(x):.2f}".rstrip("0").rstrip(".") for x in sh)
    if p["kind"] == "hybrid" and "--stages" in f:
        return f"hybrid {devs} stages {f[f.index('--stages') + 1]} windows {f[f.index('--layer-windows') + 1]}"
    if p["kind"] == "pp" and "--layer-windows" in f:
        w = f[f.index("--layer-windows") + 1]
        return f"pp {devs} windows {w} ×{trip_count([int(x) for x in w.split(',')], n_layer)}"
    return p["label"]


def cand_plan(i, c, chosen):
    """a `hearth plan` candidate as a sweep entry"""
    e = {"kind": c["kind"], "devices": c["devices"], "candidate": i, "chosen": i == chosen,
         "label": c["plan"], "predicted_ms_per_token": c.get("predicted_ms_per_token")}
    # bench/plan.py's flags (single, tp, pp, hybrid), less its --workers (run_argv adds them)
    e["flags"] = cand_flags(c, [""] * (max(c["devices"]) + 1))[2:]
    return e


def predict_one(run, bin_, model, ctx, addrs, h, calls):
    """the planner's prediction for one plan over its devices: `hearth plan --json` with its flags (docs/planner.md,
    "A given plan"), from the profile caches; the median of `calls` calls (each measures the links again).
    Returns (given_plan of the median call or None, why not, seconds of every call)."""
    argv = [bin_, "plan", "-m", model, "--workers", ",".join(addrs[d] for d in h["devices"][1:]), "-t", "1",
            "-c", str(ctx), "--json"] + h["flags"]
    given, times = [], []
    for _ in range(calls):
        t0 = time.time()
        r = run(argv)
        times.append(time.time() - t0)
        try:
            given.append(json.loads(r.stdout)["given_plan"])
        except (ValueError, KeyError):
            return None, r.stderr.strip()[-400:] or "no given_plan in hearth plan's output", times
    if not all(g["feasible"] for g in given):
        return None, "does not fit: " + next(g.get("why", "") for g in given if not g["feasible"]), times
    given.sort(key=lambda g: g["predicted_ms_per_token"])
    g = dict(given[len(given) // 2])
    g["runs"] = [x["predicted_ms_per_token"] for x in given]
    return g, None, times


def predict_hand(run, bin_, model, ctx, addrs, plans, calls=3):
    """the planner's prediction for every hand-written plan (predict_one), from the profile caches the first
    call filled. Each call measures the links again, which on a loaded machine now and then gives one slow RTT
    or a burst of loss (on this dev machine's loopback: 0.01-0.03 ms most calls, 4-6 ms now and then, once 3.6%
    loss, a 126 ms prediction): the median of `calls` calls. run(argv) -> CompletedProcess. Sets
    predicted_ms_per_token (None where the plan does not fit or is refused: predict_error says why), given_split
    (compute / network / blocked ms of the median call), predict_runs and predict_s (seconds per call); returns
    the seconds of every call."""
    times = []
    for h in plans:
        if len(h["devices"]) < 2:   # one device: no workers, so no plan flags to cost
            continue
        g, why, t = predict_one(run, bin_, model, ctx, addrs, h, calls)
        times += t
        h["predict_s"] = t[-1]
        h["predicted_ms_per_token"] = None
        if g is None:
            h["predict_error"] = why
            log(f"{h['label']}: no prediction ({why[-200:]})")
            continue
        h["predict_runs"] = g["runs"]
        h["predicted_ms_per_token"] = g["predicted_ms_per_token"]
        h["given_split"] = [g["compute_ms"], g["network_ms"], g["blocked_ms"]]
        log(f"{h['label']}: predicted {g['predicted_ms_per_token']:.1f} ms/token (of "
            + ", ".join(f"{x:.1f}" for x in h["predict_runs"]) + f"; {h['predict_s']:.2f} s a call)")
    return times


def matvecs(devs):
    """each device's matvec GB/s for the first weight type its profile lists (the model's layers' type)"""
    return [d["types"][0]["matvec_gbps"] if d.get("types") else 0 for d in devs]


def profile_again(bed, env, bin_, model, addrs, ctx, serial, why, cache_max="1500M"):
    """`hearth plan --no-cache --plan-trial 0` on d0: every device measured again, its profile cache rewritten
    (the predictions that follow read them); returns the devices' profiles"""
    r = tp.sh(bed.cmd("d0", env + plan_argv(bin_, model, addrs, ctx, serial, 0, cache_max)), timeout=1500)
    if r.returncode:
        raise RuntimeError(f"hearth plan ({why}): " + r.stderr[-2000:])
    return json.loads(r.stdout)["devices"]


def reprofile(args, bed, env, bin_, model, addrs, plans, rnd, res):
    """--reprofile: before measuring round rnd, every device measured again (`hearth plan --no-cache
    --plan-trial 0`, which rewrites the profile caches) and every plan to be measured predicted from those
    profiles (predict_one, one call; a one-device plan has no plan flags to cost and gets none), so that each round's measurement has a prediction from the same minutes;
    the testbed's host drifts by up to a quarter over a sweep (docs/planner.md, "Session 36")"""
    devs = profile_again(bed, env, bin_, model, addrs, args.ctx, args.serial, "--reprofile", args.cache_max)
    res.setdefault("reprofiles", []).append({
        "round": rnd, "at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "matvec": matvecs(devs)})
    run = lambda a: tp.sh(bed.cmd("d0", env + a), timeout=300)  # noqa: E731
    for p in plans:
        if p.get("error") or len(p["devices"]) < 2:
            continue
        g, why, _ = predict_one(run, bin_, model, args.ctx, addrs, p, 1)
        p.setdefault("round_pred", {})[str(rnd)] = g["predicted_ms_per_token"] if g else None
        if g is None:
            log(f"round {rnd}: {p['label']}: no prediction ({why[-200:]})")


def run_argv(bin_, model, args, plan, addrs, n_tokens):
    argv = [bin_, "run", "-m", model, "-p", args.prompt, "--temp", "0", "--ignore-eos", "-t", "1",
            "-c", str(args.ctx), "-n", str(n_tokens)]
    if plan["kind"] != "single":
        # the head's own slice cache under the workers' bound (its default would be twice the model)
        argv += ["--workers", ",".join(addrs[d] for d in plan["devices"][1:]), "--cache-max", args.cache_max]
    return argv + plan["flags"]


def plan_argv(bin_, model, addrs, ctx, serial, trial=None, cache_max="1500M"):
    """step 1: `hearth plan --json --no-cache` on d0 over every other device's worker, as a user runs it
    (its default trial where near-ties are cheap to measure; --trial N: --plan-trial N, the planner's N
    best-predicted candidates measured and the fastest chosen; --trial 0: by prediction alone)"""
    return [bin_, "plan", "-m", model, "--workers", ",".join(addrs[1:]), "-t", "1", "-c", str(ctx),
            "--json", "--no-cache", "--cache-max", cache_max] + (["--profile-serial"] if serial else []) + (
            ["--plan-trial", str(trial)] if trial is not None else [])


def drop_work_caches(work):
    """the devices' slice and profile caches under --work (every plan leaves slice files on each device: GBs
    on a shared disk)"""
    for d in os.listdir(work):
        if d.startswith(("cache-", "prof-")) or d == "head-cache":
            shutil.rmtree(os.path.join(work, d), ignore_errors=True)


def measure(args):
    bin_, model = tp.setup(args, "sweep")
    info = tp.model_info(bin_, model)
    bed = tp.Bed(args.instance, os.path.realpath(args.build))
    res = {"profile": args.profile, "model": model, "model_info": info, "command": "sudo " + " ".join(sys.argv),
           "tokens": args.tokens, "repeats": args.repeats, "ctx": args.ctx, "serial": args.serial,
           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "loadavg_start": os.getloadavg(),
           "plans": []}
    procs = []
    head_cache = os.path.join(args.work, "head-cache")
    env = ["env", f"XDG_CACHE_HOME={head_cache}"]
    try:
        bed.up(args.profile)
        n = len(bed.tb("devices").stdout.split())
        addrs = ["head"] + [f"{bed.addr(f'd{i}')}:{tp.PORT}" for i in range(1, n)]
        for i in range(1, n):
            # --setup-timeout: `plan --profile-serial` opens every worker's session first and then has
            # them measure one after another; on klonet8 (7 workers of 0.25 core, ~6 s each) the first
            # waits longer than the default 20 s and drops the session
            tp.start_worker(bed, args, bin_, f"d{i}", ["-t", "1", "--cache-max", args.cache_max,
                                                       "--setup-timeout", "300"], procs)
        argv = plan_argv(bin_, model, addrs, args.ctx, args.serial, args.trial, args.cache_max)
        res["plan_command"] = " ".join(argv)
        t0 = time.time()
        r = tp.sh(bed.cmd("d0", env + argv), timeout=1500)  # the default trial may take hearth plan's budget, 1200 s
        if r.returncode:
            raise RuntimeError("hearth plan: " + r.stderr[-2000:])
        plan = json.loads(r.stdout)
        res["plan_s"] = time.time() - t0
        # how it chose: "--plan-trial N", "default" (the planner's own trial), or None (by prediction alone)
        res["trial"] = (f"--plan-trial {args.trial}" if args.trial else "default") if plan.get("chosen_by") == "trial" else None
        res["plan"] = plan
        res["chosen"] = plan["chosen"]
        plans = [cand_plan(i, c, plan["chosen"]) for i, c in enumerate(plan["candidates"]) if c.get("feasible")]
        for p in plans:  # with --trial: what the prediction alone would have chosen, measured too
            p["predicted_choice"] = p["candidate"] == plan.get("predicted_choice", plan["chosen"])
            if "measured_ms_per_token" in plan["candidates"][p["candidate"]]:
                p["trial_ms_per_token"] = plan["candidates"][p["candidate"]]["measured_ms_per_token"]
        if args.top:
            # only the chosen plan and the best-predicted others are measured (8B sweeps: a plan's warm-up sends
            # GBs of slices over the emulated links); the rest stay in results.json, marked, unmeasured
            keep = {id(p) for p in sorted(plans, key=lambda p: p["predicted_ms_per_token"])[:args.top]}
            for p in plans:
                if id(p) not in keep and not p["chosen"] and not p["predicted_choice"]:
                    p["error"] = f"not measured (--top {args.top}: not among the best predicted)"
                    p["skipped"] = True
            res["top"] = args.top
        hand = hand_plans(args.profile, info["n_layer"])
        if args.plans:
            hand += json.load(open(args.plans))
        seen = {(tuple(p["devices"]), tuple(p.get("flags", []))) for p in plans}
        for h in hand:
            key = (tuple(h["devices"]), tuple(h["flags"]))
            if max(h["devices"]) >= n or key in seen:
                continue
            seen.add(key)
            plans.append(dict(h, hand=True))
        res["plans"] = plans
        # the planner's prediction for the hand-written plans too (d0's profile from the cache the first call
        # wrote under head_cache, the workers' from theirs)
        times = predict_hand(lambda a: tp.sh(bed.cmd("d0", env + a), timeout=300), bin_, model, args.ctx, addrs,
                             [p for p in plans if p.get("hand")])
        res["hand_predict_s"] = times
        if times and max(times) > 1:
            log(f"hearth plan for a hand-written plan took up to {max(times):.1f} s (the profile caches should make it "
                "well under 1 s)")
        tp.save(res, args.out)
        for rnd in range(args.repeats + 1):
            if rnd and args.reprofile:
                reprofile(args, bed, env, bin_, model, addrs, plans, rnd, res)
            # even rounds run the plans in reverse: the machine's load drifts within a round (home4's first
            # run: 7-8 when the candidates ran, 4 for the hand-written plans after them)
            for p in (plans if rnd % 2 else plans[::-1]) if rnd else plans:
                if p.get("error"):
                    continue
                cmd = run_argv(bin_, model, args, p, addrs, 2 if rnd == 0 else args.tokens)
                p["command"] = " ".join(run_argv(bin_, model, args, p, addrs, args.tokens))
                drop_cache(model)
                load = os.getloadavg()[0]
                r = tp.sh(bed.cmd("d0", env + cmd), timeout=1800)
                if r.returncode:
                    p["error"] = r.stderr.strip()[-600:]
                    log(f"{p['label']}: failed ({p['error'][-200:]})")
                    continue
                if rnd == 0:
                    continue
                ms = tp.parse_run(r.stdout, r.stderr, args.tokens)["token_ms"]
                p.setdefault("runs_ms", []).append(ms)
                if p.get("round_pred", {}).get(str(rnd)):
                    p.setdefault("matched", []).append([p["round_pred"][str(rnd)], ms])
                p.setdefault("loadavg", []).append(load)
                p["measured_ms_per_token"] = statistics.median(p["runs_ms"])
                pred = p.get("predicted_ms_per_token")
                log(f"round {rnd}: {p['label']}: {ms:.1f} ms/token" + (f" (predicted {pred:.1f})" if pred else "")
                    + f", load {load:.1f}")
                tp.save(res, args.out)
    finally:
        tp.stop_workers(bed, procs)
        bed.down()
        if not args.keep_caches:
            drop_work_caches(args.work)
    res["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    tp.finish(res, args.out, report)
    write_svg(res, os.path.join(args.out, "sweep.svg"))


def repredict(args):
    """--repredict RESULTS: the hand-written plans of an earlier sweep predicted again (fresh profiles, every
    worker its own profile cache), their measurements kept; results and report go to --out"""
    res = json.load(open(args.repredict))
    args.model = args.model or res["model"]
    bin_, model = tp.setup(args, "sweep")
    bed = tp.Bed(args.instance, os.path.realpath(args.build))
    procs = []
    env = ["env", f"XDG_CACHE_HOME={os.path.join(args.work, 'head-cache')}"]
    try:
        bed.up(res["profile"])
        n = len(bed.tb("devices").stdout.split())
        addrs = ["head"] + [f"{bed.addr(f'd{i}')}:{tp.PORT}" for i in range(1, n)]
        for i in range(1, n):
            tp.start_worker(bed, args, bin_, f"d{i}", ["-t", "1", "--setup-timeout", "300"], procs)
        devs = profile_again(bed, env, bin_, model, addrs, res["ctx"], res.get("serial"), "--repredict")
        res["hand_predict_s"] = predict_hand(lambda a: tp.sh(bed.cmd("d0", env + a), timeout=300), bin_, model,
                                             res["ctx"], addrs, [p for p in res["plans"] if p.get("hand")])
        res["repredicted"] = {"at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                              "matvec": matvecs(devs), "type": devs[0]["types"][0]["type"], "command": "sudo " + " ".join(sys.argv)}
    finally:
        tp.stop_workers(bed, procs)
        bed.down()
        drop_work_caches(args.work)
    tp.finish(res, args.out, report)
    write_svg(res, os.path.join(args.out, "sweep.svg"))


def matched_err(p, signed=False):
    """--reprofile: the median over rounds of (the round's prediction - the round's measurement) / measurement, %"""
    if not p.get("matched"):
        return None
    e = statistics.median((a - b) / b for a, b in p["matched"]) * 100
    return e if signed else abs(e)


def stats(res):
    """the issue's figures: errors over the measured candidates, the chosen plan over the best"""
    meas = [p for p in res["plans"] if p.get("measured_ms_per_token")]
    err = lambda p: abs(p["predicted_ms_per_token"] - p["measured_ms_per_token"]) / p["measured_ms_per_token"] * 100  # noqa: E731
    errs = [err(p) for p in meas if p.get("predicted_ms_per_token") and not p.get("hand")]
    errs_hand = [err(p) for p in meas if p.get("predicted_ms_per_token") and p.get("hand")]
    best = min(meas, key=lambda p: p["measured_ms_per_token"]) if meas else None
    chosen = next((p for p in meas if p.get("chosen")), None)
    loads = [x for p in meas for x in p.get("loadavg", [])]
    # --reprofile: each round's measurement against the prediction from that round's profiles
    errs_m = [matched_err(p) for p in meas if p.get("matched") and not p.get("hand")]
    errs_m_hand = [matched_err(p) for p in meas if p.get("matched") and p.get("hand")]
    return {"errs": errs, "errs_hand": errs_hand, "errs_m": errs_m, "errs_m_hand": errs_m_hand, "best": best, "chosen": chosen, "n_hand": sum(1 for p in meas if p.get("hand")),
            "n_cand": sum(1 for p in meas if "candidate" in p), "loads": loads,
            "ratio": chosen["measured_ms_per_token"] / best["measured_ms_per_token"] if chosen and best else None}


def report(res, path):
    s = stats(res)
    info = res["model_info"]
    L = [f"# Planner sweep: {res['profile']}, {os.path.basename(res['model'])} "
         f"({info['n_layer']} layers, {info['bytes'] / 2**20:.0f} MiB)", "",
         f"Command: `{res['command']}` ({res['started']} – {res.get('finished', 'unfinished')}); planner: "
         f"`{res.get('plan_command', '')}` ({res.get('plan_s', 0):.1f} s). Per plan: one warm-up run, then "
         f"{res['repeats']} rounds of {res['tokens']} tokens ({res['tokens'] - 1} forward passes), every plan once "
         "per round; measured = median of the rounds (min–max). Load average (1 min) before the runs: "
         + (f"{min(s['loads']):.1f}–{max(s['loads']):.1f}, median {statistics.median(s['loads']):.1f}"
            if s["loads"] else "–") + ".", "",
         "| device | CPU quota | {} matvec | disk | budget | link to head: RTT ms, MB/s |", "|---|---|---|---|---|---|"]
    plan = res.get("plan", {})
    # the matvec column: the first weight type the planner profiled for this model (its layers' type; Q4_0
    # was written in for the 1B sweeps and printed 0.00 for a Q4_K_M model)
    wtype = next((d["types"][0]["type"] for d in plan.get("devices", []) if d.get("types")), "Q4_0")
    L[-2] = L[-2].format(wtype)
    L.insert(-2, f"Profiles as the planner measured them ({wtype} matvec and disk read in GB/s; budget in MiB):")
    L.insert(-2, "")
    links = {(k["a"], k["b"]): k for k in plan.get("links", [])}
    for i, d in enumerate(plan.get("devices", [])):
        mv = next((t["matvec_gbps"] for t in d["types"] if t["type"] == wtype), 0)
        k = links.get((0, i))
        L.append(f"| d{i} | {d['cpu_quota']:g} | {mv:.2f} | {d['disk_gbps']:.2f} | {d['budget'] / 2**20:.0f} | "
                 + (f"{k['rtt_ms']:.2f}, {k['gbps'] * 1000:.1f} |" if k else "– |"))
    cands = {i: c for i, c in enumerate(plan.get("candidates", []))}
    rp = res.get("reprofiles")
    L += ["", "Predicted = compute + network + blocked on disk (the planner's split, ms/token)."
          + (" Last column (`--reprofile`): every round's measurement against the prediction from the profiles taken "
             "just before that round, median over the rounds." if rp else ""), "",
          "| plan | source | predicted ms/token (compute / network / blocked) | measured ms/token (min–max) | error |"
          + (" error vs its round's profile |" if rp else ""),
          "|---|---|---|---|---|" + ("---|" if rp else "")]
    order = sorted(res["plans"], key=lambda p: (p.get("measured_ms_per_token") is None,
                                                p.get("measured_ms_per_token") or 0))
    for p in order:
        pred = p.get("predicted_ms_per_token")
        meas = p.get("measured_ms_per_token")
        src = "hand" if p.get("hand") else f"candidate {p['candidate']}" + (" (chosen)" if p.get("chosen") else "") + (
            " (prediction's choice)" if p.get("predicted_choice") and not p.get("chosen") else "") + (
            f" (trial {p['trial_ms_per_token']:.1f})" if p.get("trial_ms_per_token") else "")
        err = f"{(pred - meas) / meas * 100:+.0f}%" if pred and meas else "–"
        m = (f"{meas:.1f} ({min(p['runs_ms']):.1f}–{max(p['runs_ms']):.1f})" if meas
             else "not measured (--top)" if p.get("skipped")
             else "failed: " + p.get("error", "not run").replace("\n", " ").replace("|", "/")[-160:])
        b = "**" if p.get("chosen") else ""
        c = cands.get(p.get("candidate"))
        sp = [c["compute_ms"], c["network_ms"], c["blocked_ms"]] if c else p.get("given_split")
        split = f" ({sp[0]:.0f} / {sp[1]:.0f} / {sp[2]:.0f})" if sp and pred else ""
        if pred is None and p.get("predict_error"):
            split = " (" + p["predict_error"].replace("\n", " ").replace("|", "/")[:120] + ")"
        L.append(f"| {b}{short_label(p, info['n_layer'])}{b} | {src} | {'–' if pred is None else f'{pred:.1f}'}{split} | {m} | {err} |"
                 + ((f" {matched_err(p, True):+.0f}% |" if p.get("matched") else " – |") if rp else ""))
    L.append("")
    skipped = sum(1 for p in res["plans"] if p.get("skipped"))
    if skipped:
        L.append(f"{skipped} feasible candidates were not measured (`--top {res.get('top')}`: only the chosen plan and "
                 f"the {res.get('top')} predicted fastest were), so the errors below are over the best-predicted "
                 "candidates only.")
    if s["errs"]:
        L.append(f"Prediction error over {len(s['errs'])} measured candidates: median {statistics.median(s['errs']):.0f}%, "
                 f"largest {max(s['errs']):.0f}% (goal: median ≤ 15%, none > 35%).")
    if s["errs_hand"]:
        t = res.get("hand_predict_s") or [0]
        L.append(f"Prediction error over {len(s['errs_hand'])} measured hand-written plans (`hearth plan --json` with "
                 f"their flags, {statistics.median(t):.2f} s per call, at most {max(t):.2f} s): median "
                 f"{statistics.median(s['errs_hand']):.0f}%, largest {max(s['errs_hand']):.0f}%.")
        if res.get("repredicted"):
            rp = res["repredicted"]
            L.append(f"(The hand-written plans' predictions are from `--repredict` at {rp['at']}: fresh profiles "
                     f"({rp.get('type', 'Q4_0')} matvec GB/s {', '.join(f'{x:.2f}' for x in rp['matvec'])}), this sweep's measurements.)")
    if rp:
        L.append(f"`--reprofile`: the devices were profiled again before each of the {len(rp)} rounds ({res['plan']['devices'][0]['types'][0]['type'] if res.get('plan') else ''} "
                 "matvec GB/s per device: first profile " + ", ".join(f"{v:.2f}" for v in matvecs(res["plan"]["devices"]))
                 + "; " + "; ".join(f"round {x['round']} " + ", ".join(f"{v:.2f}" for v in x["matvec"]) for x in rp) + ").")
        if s["errs_m"]:
            L.append(f"Against each round's own profile: error over {len(s['errs_m'])} candidates median "
                     f"{statistics.median(s['errs_m']):.0f}%, largest {max(s['errs_m']):.0f}%"
                     + (f"; over {len(s['errs_m_hand'])} hand-written plans median {statistics.median(s['errs_m_hand']):.0f}%, "
                        f"largest {max(s['errs_m_hand']):.0f}%" if s["errs_m_hand"] else "") + ".")
    if s["ratio"]:
        L.append(f"Chosen plan ({short_label(s['chosen'], info['n_layer'])}) measured {s['chosen']['measured_ms_per_token']:.1f} ms/token; "
                 f"best of the sweep ({s['n_cand']} candidates + {s['n_hand']} hand-written plans): "
                 f"{short_label(s['best'], info['n_layer'])}, {s['best']['measured_ms_per_token']:.1f} ms/token: chosen/best = "
                 f"{s['ratio']:.2f} (goal ≤ 1.10).")
    if res.get("trial"):
        pc = next((p for p in res["plans"] if p.get("predicted_choice")), None)
        tr = res["plan"].get("trial", {})
        how = res["trial"] if isinstance(res["trial"], str) else f"--plan-trial {res['trial']}"  # older results: N
        how = "its default trial" if how == "default" else f"`{how}`"
        L.append(f"The planner chose by a trial ({how}: {len(tr.get('candidates', []))} candidates, "
                 f"{tr.get('rounds')} rounds of {tr.get('tokens')} tokens, {tr.get('elapsed_ms', 0) / 1000:.0f} s)"
                 + (f"; by prediction alone it would have run {short_label(pc, info['n_layer'])}, measured "
                    f"{pc['measured_ms_per_token']:.1f} ms/token here ({pc['measured_ms_per_token'] / s['best']['measured_ms_per_token']:.2f}x the best)"
                    if pc and pc.get("measured_ms_per_token") and s.get("best") else "") + ".")
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


def esc(t):
    return t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_svg(res, path):
    """a horizontal bar per measured plan, fastest first: the median, min–max whiskers, the prediction
    (a diamond) where the planner made one; the chosen plan's bar in another colour and labelled"""
    s = stats(res)
    plans = sorted((p for p in res["plans"] if p.get("measured_ms_per_token")), key=lambda p: p["measured_ms_per_token"])
    if not plans:
        return
    top, row, left, width = 56, 22, 330, 460
    xmax = max(max(max(p["runs_ms"]), p.get("predicted_ms_per_token") or 0) for p in plans) * 1.05
    x = lambda v: left + v / xmax * width  # noqa: E731
    h = top + row * len(plans) + 50
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 30}" height="{h}" '
         'font-family="sans-serif" font-size="11">', f'<rect width="100%" height="100%" fill="white"/>',
         f'<text x="10" y="18" font-size="13" font-weight="bold">{esc(res["profile"])}, '
         f'{esc(os.path.basename(res["model"]))}: decode ms/token per plan (median of {res["repeats"]}, min–max)</text>',
         f'<text x="10" y="36" fill="#444">chosen/best {s["ratio"]:.2f}' if s["ratio"] else '<text x="10" y="36">']
    if s["errs"]:
        o[-1] += f'; prediction error median {statistics.median(s["errs"]):.0f}%, largest {max(s["errs"]):.0f}%'
    o[-1] += '; ◆ predicted</text>'
    step = 10 ** len(str(int(xmax / 5))) / 10
    while xmax / step > 8:
        step *= 2
    v = 0.0
    while v <= xmax:
        o.append(f'<line x1="{x(v):.1f}" y1="{top - 4}" x2="{x(v):.1f}" y2="{top + row * len(plans)}" stroke="#ddd"/>')
        o.append(f'<text x="{x(v):.1f}" y="{top + row * len(plans) + 14}" text-anchor="middle">{v:g}</text>')
        v += step
    o.append(f'<text x="{left + width / 2}" y="{top + row * len(plans) + 32}" text-anchor="middle">ms/token</text>')
    for i, p in enumerate(plans):
        y = top + i * row
        col = "#d62728" if p.get("chosen") else ("#1f77b4" if "candidate" in p else "#9ecae1")
        lab = short_label(p, res["model_info"]["n_layer"])
        bold = ' font-weight="bold"' if p.get("chosen") else ""
        o.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end"{bold}>{esc(lab)}</text>')
        o.append(f'<rect x="{left}" y="{y + 4}" width="{x(p["measured_ms_per_token"]) - left:.1f}" height="{row - 8}" fill="{col}"/>')
        lo, hi = x(min(p["runs_ms"])), x(max(p["runs_ms"]))
        o.append(f'<line x1="{lo:.1f}" y1="{y + row / 2}" x2="{hi:.1f}" y2="{y + row / 2}" stroke="black"/>')
        pred = p.get("predicted_ms_per_token")
        if pred:
            cx, cy = x(pred), y + row / 2
            o.append(f'<path d="M{cx:.1f},{cy - 5} l5,5 l-5,5 l-5,-5 z" fill="orange" stroke="black" stroke-width="0.5"/>')
        if p.get("chosen"):
            o.append(f'<text x="{hi + 8:.1f}" y="{y + 14}" fill="#d62728" font-weight="bold">← chosen'
                     + (" (trial)" if res.get("trial") else "") + '</text>')
        elif p.get("predicted_choice") and res.get("trial"):  # --trial: what the prediction alone would have run
            o.append(f'<text x="{max(hi, x(pred or 0)) + 8:.1f}" y="{y + 14}" fill="#444">← the prediction\'s choice</text>')
    o.append(f'<text x="10" y="{h - 6}" fill="#444">dark blue: planner candidates, light blue: hand-written plans, '
             'red: the chosen plan</text>')
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")


def main():
    ap = planner_args("sweep", __doc__, 9, 3)
    ap.add_argument("--plans", help="JSON list of extra hand-written plans (hybrids: see above)")
    ap.add_argument("--cache-max", default="1500M", help="each worker's and the head's slice cache bound (the least recently used "
                    "slices are sent again: slower, the same figures)")
    ap.add_argument("--top", type=int, metavar="N", help="measure only the chosen plan and the N candidates predicted "
                    "fastest (and every hand-written plan); the other candidates are listed, not measured")
    ap.add_argument("--trial", type=int, default=None, metavar="N", help="plan with --plan-trial N: the planner measures its N "
                    "best-predicted candidates and chooses the fastest (the prediction's own choice is measured too); "
                    "0: by prediction alone; default: `hearth plan`'s own (a trial where near-ties are cheap to measure)")
    ap.add_argument("--reprofile", action="store_true", help="before every measuring round, profile every device "
                    "again and predict every plan from that round's profiles (the report gives both errors)")
    ap.add_argument("--keep-caches", action="store_true", help="leave the devices' slice caches in --work")
    ap.add_argument("--report", metavar="RESULTS_JSON", help="re-render report.md and sweep.svg beside it")
    ap.add_argument("--repredict", metavar="RESULTS_JSON", help="predict the hand-written plans of an earlier sweep "
                    "again (fresh profiles), keeping its measurements; writes --out")
    args = ap.parse_args()
    if args.repredict:
        repredict(args)
        return
    if args.report:
        res = json.load(open(args.report))
        d = os.path.dirname(args.report)
        report(res, os.path.join(d, "report.md"))
        write_svg(res, os.path.join(d, "sweep.svg"))
        print(open(os.path.join(d, "report.md")).read())
        return
    if args.out == os.path.join(tp.SRC, "bench", "reports", "sweep"):
        args.out += "-" + os.path.basename(args.profile)
    measure(args)


if __name__ == "__main__":
    main()
