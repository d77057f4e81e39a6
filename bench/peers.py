#!/usr/bin/env python3
"""peers — hearth against prima.cpp and llama.cpp RPC on one testbed profile (issue 26): the same model,
the same emulated devices (head d0, the others workers), decode tokens/s of each.

    sudo bench/peers.py --profile home4-8b-tiny --model M.gguf [--build DIR]
        [--hearth auto] [--hearth "--pp --layer-windows 2,10,16,4"] ...      # hearth plans (auto = no plan flag)
        [--prima-dir /work/peers/prima.cpp --prima-cg /work/peers/prima-cg.sh]
        [--prima auto] [--prima 4,12,12,4] ...                               # prima.cpp -lw (auto = its solver)
        [--llama-bin /work/peers/llama.cpp/build/bin]
        [--llama "ngl=20,ts=3/14/3[,dev=3/1/2]"] ...                         # llama.cpp RPC (-ngl, -ts, order)
        [--tokens 8] [--repeats 3] [--ctx 256] [--instance pr] [--out bench/reports/peers-PROFILE]

Peers are built outside the repository (docs/benchmarks.md, "Issue 26: prima.cpp"); this script only
starts their binaries. Per configuration: a warm-up run (hearth: fills the workers' slice caches;
prima.cpp: page cache; llama.cpp: the rpc-servers' file caches), then --repeats runs; before every run
the model's pages are dropped from the page cache, so that each device reads them under its own memory
limit. Figures: decode ms/token of each run, as each program reports it —
  hearth: `generation: N tokens in X ms` -> X / (N - 1) (the last token is sampled, not evaluated);
  prima.cpp: rank 0's `eval time = X ms / N runs` -> X / N (its timer leaves out the first 5 evals, so it
             runs --tokens + 6 tokens to time --tokens of them; no warm-up run, the page cache is dropped);
  llama.cpp: llama-bench's tg test (`-p 0 -n N`), 1000 / avg_ts (its own warm-up run excluded).
Every device runs one thread (-t 1): the profiles give each a fraction of one core. The load average
is recorded at every run (the machine is shared). Results: OUT/results.json, OUT/report.md. Needs root.
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
import tp  # noqa: E402  (the testbed wrapper, hearth workers, the run parser)

RPC_PORT = 50052


def log(msg):
    print(f"peers: {msg}", file=sys.stderr, flush=True)


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def profile_mem(profile):
    """device -> memory limit in bytes, from the profile file (prima.cpp's wrapper needs it)"""
    path = profile if os.path.exists(profile) else os.path.join(tp.SRC, "tools", "profiles", profile)
    mem = {}
    default = None
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        m = re.match(r"mem\s*=\s*([0-9.]+)([kmgKMG]?)", line)
        if m:
            default = int(float(m.group(1)) * units[m.group(2).lower()])
        m = re.match(r"(d\d+)\s.*\bmem=([0-9.]+)([kmgKMG]?)", line)
        if m:
            mem[m.group(1)] = int(float(m.group(2)) * units[m.group(3).lower()])
    return mem, default


def timed(cmd, timeout, cwd=None):
    t = time.time()
    r = tp.sh(cmd, timeout=timeout, stdin=subprocess.DEVNULL, cwd=cwd)
    return r, time.time() - t


class Runner:
    def __init__(self, args, bed, n, model):
        self.args, self.bed, self.n, self.model = args, bed, n, model
        self.addrs = [bed.addr(f"d{i}") for i in range(n)]
        self.mem, self.mem_default = profile_mem(args.profile)

    def stop(self, procs):
        if procs and isinstance(procs[0], tuple):  # hearth workers (tp.start_worker's entries)
            tp.stop_workers(self.bed, procs)
            return
        for i in range(1, self.n):
            self.bed.kill(f"d{i}")
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    # --- hearth ---------------------------------------------------------------------------------------
    def hearth(self, flags, tokens):
        """one hearth run; workers are started once per configuration (see run_config)"""
        a = self.args
        workers = ",".join(f"{x}:{tp.PORT}" for x in self.addrs[1:])
        argv = ["env", f"XDG_CACHE_HOME={os.path.join(a.work, 'head-cache')}", self.bin, "run", "-m", self.model,
                "-p", a.prompt, "--temp", "0", "--ignore-eos", "-t", "1", "-c", str(a.ctx), "-n", str(tokens),
                "--workers", workers, "--profile-serial"] + flags
        r, wall = timed(self.bed.cmd("d0", argv), 3600)
        if r.returncode:
            raise RuntimeError("hearth run: " + r.stderr[-1500:])
        res = tp.parse_run(r.stdout, r.stderr, tokens)
        plan = re.search(r"^.*plan: .*$", r.stderr, re.M)
        return {"ms_per_token": res["token_ms"], "plan_line": plan.group(0) if plan else None, "wall_s": wall}

    def hearth_workers(self):
        procs = []
        for i in range(1, self.n):
            tp.start_worker(self.bed, self.args, self.bin, f"d{i}", ["-t", "1"], procs)
        return procs

    # --- prima.cpp ------------------------------------------------------------------------------------
    def prima(self, lw, tokens):
        a = self.args
        cli = os.path.join(a.prima_dir, "llama-cli")
        procs = []
        logs = []
        try:
            for r in range(self.n - 1, 0, -1):
                nxt = self.addrs[(r + 1) % self.n]
                argv = [a.prima_cg, str(self.mem.get(f"d{r}", self.mem_default)), cli, "-m", self.model,
                        "--world", str(self.n), "--rank", str(r), "--master", self.addrs[0], "--next", nxt,
                        "-t", "1", "--prefetch"]
                lf = open(os.path.join(a.work, f"prima-d{r}.log"), "w")
                logs.append(lf)
                procs.append(subprocess.Popen(self.bed.cmd(f"d{r}", argv), stdout=lf, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, cwd=a.work))  # its fio test file
            time.sleep(2)
            argv = [a.prima_cg, str(self.mem.get("d0", self.mem_default)), cli, "-m", self.model, "-c", str(a.ctx),
                    "-n", str(tokens), "-p", a.prompt, "--temp", "0", "--ignore-eos", "--world", str(self.n),
                    "--rank", "0", "--master", self.addrs[0], "--next", self.addrs[1], "-t", "1", "--prefetch"]
            argv += [] if lw == "auto" else ["-lw", lw]
            r, wall = timed(self.bed.cmd("d0", argv), 3600, cwd=a.work)
            out = r.stdout + r.stderr
            with open(os.path.join(a.work, "prima-d0.log"), "w") as f:
                f.write(out)
            m = re.search(r"\beval time =\s+([0-9.]+) ms /\s+(\d+) runs", out)
            if r.returncode or not m:
                raise RuntimeError(f"prima.cpp rank 0 (rc {r.returncode}): " + out[-1500:])
            res = {"ms_per_token": float(m.group(1)) / max(int(m.group(2)), 1), "wall_s": wall}
            w = re.findall(r"(?:layer window|n_layer_window|windows?)[^\n]*", out)
            if w:
                res["windows_line"] = w[-1][:200]
            return res
        finally:
            self.stop(procs)
            for lf in logs:
                lf.close()

    # --- llama.cpp RPC --------------------------------------------------------------------------------
    def llama_servers(self):
        a = self.args
        procs = []
        for i in range(1, self.n):
            lf = open(os.path.join(a.work, f"rpc-d{i}.log"), "a")
            argv = ["env", f"LLAMA_CACHE={os.path.join(a.work, f'rpc-cache-d{i}')}",
                    os.path.join(a.llama_bin, "ggml-rpc-server"), "-H", "0.0.0.0", "-p", str(RPC_PORT), "-t", "1",
                    "-c"]
            procs.append(subprocess.Popen(self.bed.cmd(f"d{i}", argv), stdout=lf, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL))
        time.sleep(3)
        return procs

    def llama(self, spec, tokens, reps):
        a = self.args
        kv = dict(x.split("=", 1) for x in spec.split(",") if x)
        # dev=3/1/2: the RPC devices' order (llama.cpp puts the output head on the last one)
        devs = [int(x) for x in kv["dev"].split("/")] if "dev" in kv else range(1, self.n)
        rpc = ",".join(f"{self.addrs[d]}:{RPC_PORT}" for d in devs)
        argv = [os.path.join(a.llama_bin, "llama-bench"), "-m", self.model, "--rpc", rpc, "-p", "0",
                "-n", str(tokens), "-r", str(reps), "-t", "1", "-o", "json", "-ngl", kv.get("ngl", "99")]
        if "ts" in kv:
            argv += ["-ts", kv["ts"]]
        r, wall = timed(self.bed.cmd("d0", argv), 3600)
        if r.returncode:
            raise RuntimeError(f"llama-bench (rc {r.returncode}): " + (r.stdout + r.stderr)[-1500:])
        j = json.loads(r.stdout)[0]
        return {"runs_ms": [1000.0 / x for x in j["samples_ts"]], "wall_s": wall}


def run_config(rn, kind, spec, res):
    a = rn.args
    entry = {"system": kind, "config": spec, "runs_ms": [], "loadavg": []}
    res["configs"].append(entry)
    log(f"{kind} {spec}")
    procs = []
    try:
        if kind == "hearth":
            flags = [] if spec == "auto" else spec.split()
            procs = rn.hearth_workers()
            drop_cache(rn.model)
            entry["warmup"] = rn.hearth(flags, 2)
            for _ in range(a.repeats):
                drop_cache(rn.model)
                entry["loadavg"].append(os.getloadavg()[0])
                r = rn.hearth(flags, a.tokens)
                entry["runs_ms"].append(r["ms_per_token"])
                entry["plan_line"] = r["plan_line"]
        elif kind == "prima":
            for _ in range(a.repeats):  # no warm-up: it would only fill the page cache, which is dropped
                drop_cache(rn.model)
                entry["loadavg"].append(os.getloadavg()[0])
                r = rn.prima(spec, a.tokens + 6)  # its timer skips the first 5 evals (its "preheat")
                entry["runs_ms"].append(r["ms_per_token"])
                entry["windows_line"] = r.get("windows_line")
        else:
            procs = rn.llama_servers()
            drop_cache(rn.model)
            entry["warmup"] = rn.llama(spec, 1, 1)
            drop_cache(rn.model)
            entry["loadavg"].append(os.getloadavg()[0])
            entry["runs_ms"] = rn.llama(spec, a.tokens, a.repeats)["runs_ms"]
            entry["loadavg"].append(os.getloadavg()[0])
        entry["ms_per_token"] = statistics.median(entry["runs_ms"])
        log(f"{kind} {spec}: {entry['runs_ms']} ms/token (load {entry['loadavg']})")
    except Exception as e:  # a peer that cannot run the scenario is a result too
        entry["error"] = str(e)[-2000:]
        log(f"{kind} {spec} failed: {entry['error'][-400:]}")
    finally:
        rn.stop(procs)
    tp.save(res, a.out)


def report(res, path):
    best = {}
    for c in res["configs"]:
        ms = c.get("ms_per_token")
        if ms is not None and (c["system"] not in best or ms < best[c["system"]]["ms_per_token"]):
            best[c["system"]] = c
    with open(path, "w") as f:
        f.write(f"# Peers: {res['profile']}, {os.path.basename(res['model'])}\n\nCommand: `{res['command']}`\n\n")
        f.write("| system | configuration | runs ms/token | median ms/token | tokens/s | load average |\n"
                "|---|---|---|---|---|---|\n")
        for c in res["configs"]:
            if c.get("ms_per_token") is not None:
                f.write(f"| {c['system']} | `{c['config']}` | {', '.join(f'{x:.0f}' for x in c['runs_ms'])} | "
                        f"{c['ms_per_token']:.0f} | {1000 / c['ms_per_token']:.3f} | "
                        f"{', '.join(f'{x:.1f}' for x in c['loadavg'])} |\n")
            else:
                f.write(f"| {c['system']} | `{c['config']}` | failed: {c.get('error', '')[-160:]!r} | - | - | - |\n")
        f.write("\n")
        for c in res["configs"]:
            if c.get("plan_line"):
                f.write(f"hearth `{c['config']}`: {c['plan_line'].strip()}\n\n")
        h = best.get("hearth")
        for peer in ("prima", "llama"):
            if h and peer in best:
                f.write(f"hearth best ({h['config']}) / {peer} best ({best[peer]['config']}): "
                        f"{best[peer]['ms_per_token'] / h['ms_per_token']:.2f}x tokens/s\n\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    tp.common_args(ap, "peers")
    ap.add_argument("--profile", default="home4-8b-tiny")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--instance", default="pr")
    # one list in command-line order, so that the configurations that matter most can come first
    ap.add_argument("--hearth", action="append", dest="configs", default=[], type=lambda s: ("hearth", s),
                    help="plan flags, or 'auto' (repeatable)")
    ap.add_argument("--prima", action="append", dest="configs", type=lambda s: ("prima", s),
                    help="-lw windows, or 'auto' (repeatable)")
    ap.add_argument("--llama", action="append", dest="configs", type=lambda s: ("llama", s),
                    help="'ngl=N,ts=A/B/C[,dev=3/1/2]' (repeatable)")
    ap.add_argument("--prima-dir", default="/work/peers/prima.cpp")
    ap.add_argument("--prima-cg", default="/work/peers/prima-cg.sh")
    ap.add_argument("--llama-bin", default="/work/peers/llama.cpp/build/bin")
    ap.add_argument("--keep-up", action="store_true", help="leave the testbed up (and reuse it if up)")
    args = ap.parse_args()
    if args.out == os.path.join(tp.SRC, "bench", "reports", "peers"):
        args.out += "-" + args.profile
    if not args.model:
        sys.exit("peers: --model is required (e.g. hearth synth --shape llama-3-8b --type Q4_K_M)")
    bin_, model = tp.setup(args, "peers")
    bed = tp.Bed(args.instance, args.build)
    res = {"profile": args.profile, "model": model, "command": " ".join(sys.argv), "configs": [],
           "loadavg_start": os.getloadavg()}
    try:
        if not (args.keep_up and bed.tb("status", check=False).returncode == 0 and
                bed.tb("devices", check=False).stdout.split()):
            bed.up(args.profile)
        n = len(bed.tb("devices").stdout.split())
        rn = Runner(args, bed, n, model)
        rn.bin = bin_
        for kind, spec in args.configs:
            run_config(rn, kind, spec, res)
    finally:
        if not args.keep_up:
            bed.down()
    tp.finish(res, args.out, report)


if __name__ == "__main__":
    main()
