#!/usr/bin/env python3
"""harness — runs a benchmark scenario on the emulated home cluster (tools/testbed) and writes the
results as JSON, a markdown table and PNG plots (gnuplot), so that hearth and its peers are measured
the same way on the same emulated devices.

A scenario (bench/scenarios/*.json, format in bench/README.md) is profile x model x a command
template per device. Workers start first (they may print a ready line); the head's command is the
measured run: when it exits the repeat ends, the workers are stopped, and the next repeat starts.

Metrics come from two places:
  * the commands: the last stdout line that holds {"hearth_metrics": {...}} (contract in
    bench/README.md), or regexes from the scenario for peer systems that print their own format;
  * the harness itself: per-device peak RSS (sum over the device's processes), cgroup peak memory,
    MemAvailable drop (non-reclaimable memory growth inside the device), bytes sent (interface
    counters) and wall time.

    bench/harness.py run bench/scenarios/klonet8-star.json [--repeats N] [--out DIR]
    bench/harness.py report RESULTS.json [--out DIR]      re-render markdown + plots from JSON
    bench/harness.py tool echo|star ...                   the small workload of the example report
Python 3 standard library only; runs as root (the testbed needs it).
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

ME = os.path.realpath(__file__)
SRC = os.path.dirname(os.path.dirname(ME))
TESTBED = os.path.join(SRC, "tools", "testbed")


class HarnessError(Exception):
    pass


def log(msg):
    print(f"harness: {msg}", file=sys.stderr, flush=True)


# ---- statistics --------------------------------------------------------------------------------

def pctl(xs, p):
    """p-th percentile with linear interpolation (numpy's default)"""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---- templates ---------------------------------------------------------------------------------

TEMPLATE_RE = re.compile(r"\{\{|\}\}|\{(\w+)(?::([^{}]*))?\}")


def expand(template, ctx, devices):
    """{name} from ctx; {addr:dN} a device's address; {workers:PORT} 'addr:PORT,...' of the worker
    devices (PORT a number or a variable name); {{ and }} are literal braces."""
    def sub(m):
        if m.group(0) == "{{":
            return "{"
        if m.group(0) == "}}":
            return "}"
        name, arg = m.group(1), m.group(2)
        if name == "addr" and arg:
            if arg not in devices:
                raise HarnessError(f"template {m.group(0)}: no device {arg}")
            return devices[arg]["addr"]
        if name == "workers":
            addrs = [devices[d]["addr"] for d in ctx["_workers"]]
            if arg and not arg.isdigit():  # {workers:port} names a variable
                if arg not in ctx:
                    raise HarnessError(f"template {m.group(0)}: unknown variable {arg}")
                arg = str(ctx[arg])
            return ",".join(f"{a}:{arg}" if arg else a for a in addrs)
        if arg is not None:
            raise HarnessError(f"template {m.group(0)}: '{name}' takes no argument")
        if name not in ctx:
            raise HarnessError(f"template: unknown variable {{{name}}} (known: "
                               f"{', '.join(sorted(k for k in ctx if not k.startswith('_')))}, addr:dN, workers:PORT)")
        return str(ctx[name])
    return TEMPLATE_RE.sub(sub, template)


def device_list(spec, all_devices):
    """'d1-d7', 'd0', 'all', or a list of names"""
    if isinstance(spec, list):
        out = []
        for s in spec:
            out += device_list(s, all_devices)
        return out
    if spec == "all":
        return list(all_devices)
    m = re.fullmatch(r"d(\d+)-d?(\d+)", spec)
    names = [f"d{i}" for i in range(int(m.group(1)), int(m.group(2)) + 1)] if m else [spec]
    for n in names:
        if n not in all_devices:
            raise HarnessError(f"scenario names device {n}, the profile has {', '.join(all_devices)}")
    return names


# ---- the testbed -------------------------------------------------------------------------------

def tb(instance, *args, check=True, capture=True, timeout=600):
    cmd = [sys.executable, TESTBED, "--instance", instance] + list(args)
    r = subprocess.run(cmd, capture_output=capture, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise HarnessError(f"testbed {' '.join(args)}: {(r.stderr or '').strip()}")
    return r


def tb_status(instance):
    r = tb(instance, "status", "--json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def read_int(path):
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def read_kv(path):
    out = {}
    try:
        with open(path) as f:
            for line in f:
                k, _, v = line.partition(" ")
                if v.strip().isdigit():
                    out[k] = int(v)
    except OSError:
        pass
    return out


class DeviceProbe:
    """Reads one device's memory figures from its cgroup and /proc, and its interface counters."""

    def __init__(self, dev, cgv):
        self.name = dev["name"]
        self.ns = dev["ns"]
        self.cgv = cgv
        self.limit = dev["mem"]
        self.mem_cg = next((p for p in dev["cgroups"] if os.path.exists(os.path.join(p, "memory.stat"))), None)
        self.procs_cg = dev["cgroups"]

    def pids(self):
        pids = set()
        for p in self.procs_cg:
            try:
                with open(os.path.join(p, "cgroup.procs")) as f:
                    pids.update(int(x) for x in f.read().split())
            except OSError:
                pass
        return pids

    def rss(self):
        """(sum of VmRSS, max VmHWM) over the device's processes, bytes"""
        total, hwm = 0, 0
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            total += int(line.split()[1]) * 1024
                        elif line.startswith("VmHWM:"):
                            hwm = max(hwm, int(line.split()[1]) * 1024)
            except (OSError, ValueError):
                pass
        return total, hwm

    def unreclaimable(self):
        """cgroup memory that the kernel could not drop: usage minus file cache. A device's
        MemAvailable is its limit minus this, so its growth is the MemAvailable drop."""
        if not self.mem_cg:
            return None
        st = read_kv(os.path.join(self.mem_cg, "memory.stat"))
        if self.cgv == "v1":
            use = read_int(os.path.join(self.mem_cg, "memory.usage_in_bytes"))
            file_ = st.get("total_inactive_file", 0) + st.get("total_active_file", 0)
        else:
            use = read_int(os.path.join(self.mem_cg, "memory.current"))
            file_ = st.get("inactive_file", 0) + st.get("active_file", 0)
        return None if use is None else max(0, use - file_)

    def reset_peak(self):
        if not self.mem_cg:
            return
        f = os.path.join(self.mem_cg, "memory.max_usage_in_bytes" if self.cgv == "v1" else "memory.peak")
        try:
            with open(f, "w") as fh:
                fh.write("0")
        except OSError:
            pass  # v2 before 6.12: memory.peak is not resettable; the first repeat's value then carries

    def peak(self):
        if not self.mem_cg:
            return None
        return read_int(os.path.join(self.mem_cg, "memory.max_usage_in_bytes" if self.cgv == "v1" else "memory.peak"))

    def tx_bytes(self):
        r = subprocess.run(["ip", "-n", self.ns, "-s", "-j", "link", "show", "eth0"], capture_output=True, text=True)
        try:
            return json.loads(r.stdout)[0]["stats64"]["tx"]["bytes"]
        except (ValueError, KeyError, IndexError):
            return None


def meminfo_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


class Sampler(threading.Thread):
    def __init__(self, probes, period):
        super().__init__(daemon=True)
        self.probes = probes
        self.period = period
        self.stop_ev = threading.Event()
        self.base = {p.name: p.unreclaimable() for p in probes}
        self.host_base = meminfo_available()
        self.peak_rss = {p.name: 0 for p in probes}
        self.peak_hwm = {p.name: 0 for p in probes}
        self.peak_unrec = {p.name: self.base[p.name] or 0 for p in probes}
        self.host_min = self.host_base

    def run(self):
        while not self.stop_ev.is_set():
            self.sample()
            self.stop_ev.wait(self.period)

    def sample(self):
        for p in self.probes:
            rss, hwm = p.rss()
            self.peak_rss[p.name] = max(self.peak_rss[p.name], rss)
            self.peak_hwm[p.name] = max(self.peak_hwm[p.name], hwm)
            u = p.unreclaimable()
            if u is not None:
                self.peak_unrec[p.name] = max(self.peak_unrec[p.name], u)
        a = meminfo_available()
        if a is not None and self.host_min is not None:
            self.host_min = min(self.host_min, a)

    def finish(self):
        self.stop_ev.set()
        self.join()
        self.sample()


# ---- running commands --------------------------------------------------------------------------

class Proc:
    """A command inside a device, its output teed to a log file and kept for parsing."""

    def __init__(self, instance, dev, cmd, logpath):
        self.dev = dev
        self.cmd = cmd
        self.lines = []
        self.cond = threading.Condition()
        self.log = open(logpath, "w")
        self.log.write(f"# {dev}: {cmd}\n")
        self.log.flush()
        self.p = subprocess.Popen([sys.executable, TESTBED, "--instance", instance, "exec", dev, "--", "sh", "-c", cmd],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  text=True, errors="replace", start_new_session=True)
        self.t0 = time.monotonic()
        self.t_end = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.log.write(line)
            self.log.flush()
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, regex, timeout):
        rx = re.compile(regex)
        deadline = time.monotonic() + timeout
        with self.cond:
            i = 0
            while True:
                while i < len(self.lines):
                    if rx.search(self.lines[i]):
                        return True
                    i += 1
                if self.p.poll() is not None and not self.reader.is_alive():
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.2))

    def wait(self, timeout):
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            self.t_end = time.monotonic()
        self.reader.join(5)
        return self.p.returncode

    def close(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait()
        self.reader.join(5)
        self.log.close()


METRIC_KEYS = ("tokens", "ttft_ms", "token_ms", "token_ms_median", "token_ms_p90", "tok_per_s",
               "peak_rss_bytes", "bytes_sent")


def parse_metrics(lines, regexes):
    """The last {"hearth_metrics": {...}} line wins; scenario regexes fill what it lacks."""
    m = {}
    for line in reversed(lines):
        s = line.strip()
        if s.startswith("{") and "hearth_metrics" in s:
            try:
                obj = json.loads(s)["hearth_metrics"]
                if isinstance(obj, dict):
                    m = obj
                    break
            except (ValueError, KeyError, TypeError):
                continue
    text = "\n".join(lines)
    for key, rx in (regexes or {}).items():
        if key in m:
            continue
        found = re.findall(rx, text, re.MULTILINE)
        if found:
            v = found[-1] if not isinstance(found[-1], tuple) else found[-1][0]
            try:
                m[key] = float(v)
            except ValueError:
                pass
    return m


def summarize_metrics(m):
    """per-run figures from a hearth_metrics object: median/p90 token latency, TTFT, tok/s"""
    tl = [float(x) for x in m.get("token_ms", []) if isinstance(x, (int, float))]
    out = {
        "tokens": m.get("tokens") or ((len(tl) + 1) if tl else None),
        "ttft_ms": m.get("ttft_ms"),
        "token_ms_median": m.get("token_ms_median", pctl(tl, 50)),
        "token_ms_p90": m.get("token_ms_p90", pctl(tl, 90)),
        "tok_per_s": m.get("tok_per_s", (1000.0 * len(tl) / sum(tl)) if tl and sum(tl) > 0 else None),
        "app_peak_rss_bytes": m.get("peak_rss_bytes"),
        "app_bytes_sent": m.get("bytes_sent"),
    }
    out["extra"] = {k: v for k, v in m.items() if k not in METRIC_KEYS}
    return out, tl


# ---- run ---------------------------------------------------------------------------------------

def load_scenario(path):
    try:
        with open(path) as f:
            sc = json.load(f)
    except (OSError, ValueError) as e:
        raise HarnessError(f"{path}: {e}")
    for k in ("name", "profile", "commands"):
        if k not in sc:
            raise HarnessError(f"{path}: missing '{k}'")
    heads = [c for c in sc["commands"] if c.get("role", "worker") == "head"]
    if len(heads) != 1:
        raise HarnessError(f"{path}: exactly one command must have \"role\": \"head\"")
    if not re.fullmatch(r"[\w.-]+", sc["name"]):
        raise HarnessError(f"{path}: name must be letters, digits, '.', '_' or '-'")
    return sc


def git_rev():
    r = subprocess.run(["git", "-C", SRC, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or None


def cmd_run(args):
    if os.geteuid() != 0:
        raise HarnessError("needs root (the testbed creates namespaces and cgroups)")
    sc = load_scenario(args.scenario)
    repeats = args.repeats or sc.get("repeats", 3)
    out = args.out or os.path.join(SRC, "bench", "reports", sc["name"])
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    inst = args.instance
    st = tb_status(inst)
    brought_up = False
    if st and st["profile"] != os.path.basename(sc["profile"]):
        raise HarnessError(f"testbed instance '{inst}' is up with profile {st['profile']}, scenario wants "
                           f"{sc['profile']}; bring it down or use --instance")
    if not st:
        log(f"bringing up {sc['profile']} {' '.join(sc.get('profile_args', []))}")
        tb(inst, "up", sc["profile"], *sc.get("profile_args", []), capture=False)
        brought_up = True
        st = tb_status(inst)
    try:
        results = run_repeats(sc, st, inst, repeats, out, args)
    finally:
        if brought_up and not args.keep_up:
            tb(inst, "down", check=False)
    path = os.path.join(out, "results.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    render(results, out)
    log(f"wrote {path}, {os.path.join(out, 'report.md')} and plots")
    failed = [r for r in results["runs"] if r["status"] != "ok"]
    return 1 if failed and len(failed) == len(results["runs"]) else 0


def run_repeats(sc, st, inst, repeats, out, args):
    devices = {d["name"]: d for d in st["devices"]}
    probes = [DeviceProbe(d, st["cgroup"]) for d in st["devices"]]
    cmds = []
    for c in sc["commands"]:
        role = c.get("role", "worker")
        for dev in device_list(c["devices"] if "devices" in c else c["device"], devices):
            cmds.append({"dev": dev, "role": role, "template": c["cmd"], "ready": c.get("ready"),
                         "start_delay": c.get("start_delay", 0)})
    worker_devs = [c["dev"] for c in cmds if c["role"] == "worker"]
    model = args.model or sc.get("model", "")
    base_ctx = {"harness": ME, "testbed": TESTBED, "src": SRC, "python": sys.executable, "model": model,
                "build": os.environ.get("HEARTH_BUILD", os.path.join(SRC, "build")),
                "profile": st["profile"], "_workers": worker_devs}
    base_ctx.update({k: v for k, v in sc.get("vars", {}).items()})
    timeout = sc.get("timeout_s", 600)
    runs = []
    for rep in range(repeats):
        log(f"repeat {rep + 1}/{repeats}")
        tb(inst, "kill", "all", check=False)
        for p in probes:
            p.reset_peak()
        tx0 = {p.name: p.tx_bytes() for p in probes}
        sampler = Sampler(probes, sc.get("sample_period_s", 0.05))
        sampler.start()
        procs = []
        status = "ok"
        run = {"repeat": rep, "status": status}
        try:
            head = None
            for c in cmds:
                ctx = dict(base_ctx, device=c["dev"], addr=devices[c["dev"]]["addr"], repeat=rep)
                cmd = expand(c["template"], ctx, devices)
                pr = Proc(inst, c["dev"], cmd, os.path.join(out, "logs", f"r{rep}-{c['dev']}-{c['role']}.log"))
                procs.append((c, pr))
                if c["role"] == "head":
                    head = pr
                    continue
                if c["ready"] and not pr.wait_for(c["ready"], sc.get("ready_timeout_s", 60)):
                    raise HarnessError(f"{c['dev']}: worker never printed /{c['ready']}/ (see its log)")
                if c["start_delay"]:
                    time.sleep(c["start_delay"])
            rc = head.wait(timeout)
            if rc is None:
                status = f"timeout after {timeout} s"
            elif rc != 0:
                status = f"head exited {rc}"
            run["wall_s"] = (head.t_end or time.monotonic()) - head.t0
        except HarnessError as e:
            status = str(e)
        finally:
            sampler.finish()
            tb(inst, "kill", "all", check=False)
            for _, pr in procs:
                pr.close()
        run["status"] = status
        head_lines = next((pr.lines for c, pr in procs if c["role"] == "head"), [])
        m = parse_metrics(head_lines, sc.get("metrics_regex"))
        summ, tl = summarize_metrics(m)
        run.update(summ)
        run["token_ms"] = tl
        run["workers_metrics"] = {pr.dev: parse_metrics(pr.lines, None) for c, pr in procs if c["role"] == "worker"}
        run["devices"] = {}
        for p in probes:
            tx1 = p.tx_bytes()
            base = sampler.base[p.name] or 0
            run["devices"][p.name] = {
                "peak_rss_bytes": sampler.peak_rss[p.name],
                "peak_hwm_bytes": sampler.peak_hwm[p.name],
                "cgroup_peak_bytes": p.peak(),
                "memavail_drop_bytes": max(0, sampler.peak_unrec[p.name] - base),
                "mem_limit_bytes": p.limit,
                "bytes_sent": (tx1 - tx0[p.name]) if tx1 is not None and tx0[p.name] is not None else None,
            }
        run["host_memavail_drop_bytes"] = (sampler.host_base - sampler.host_min) if sampler.host_base else None
        if status == "ok" and run.get("token_ms_median") is None and run.get("tok_per_s") is None:
            run["status"] = status = "no metrics (the head printed no hearth_metrics line)"
        log(f"repeat {rep + 1}: {status}; token median {fmt(run.get('token_ms_median'), 'ms')}, "
            f"TTFT {fmt(run.get('ttft_ms'), 'ms')}, {fmt(run.get('tok_per_s'), 'tok/s')}")
        runs.append(run)
    return {
        "scenario": sc, "scenario_file": os.path.relpath(os.path.realpath(args.scenario), SRC),
        "model": model,
        "testbed": {"profile": st["profile"], "delay_mode": st["delay_mode"], "rate_by": st.get("rate_by"),
                    "cgroup": st["cgroup"],
                    "devices": st["devices"]},
        "machine": {"host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
        "git": git_rev(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commands": [{"dev": c["dev"], "role": c["role"], "template": c["template"]} for c in cmds],
        "runs": runs, "summary": summary(runs, list(devices)),
    }


def summary(runs, devs):
    ok = [r for r in runs if r["status"] == "ok"]
    s = {"repeats": len(runs), "ok": len(ok)}
    for k in ("token_ms_median", "token_ms_p90", "ttft_ms", "tok_per_s", "wall_s"):
        vals = [r[k] for r in ok if r.get(k) is not None]
        s[k] = {"median": median(vals), "min": min(vals) if vals else None, "max": max(vals) if vals else None}
    s["devices"] = {}
    for d in devs:
        s["devices"][d] = {}
        for k in ("peak_rss_bytes", "cgroup_peak_bytes", "memavail_drop_bytes", "bytes_sent"):
            vals = [r["devices"][d][k] for r in ok if r["devices"][d].get(k) is not None]
            s["devices"][d][k] = median(vals)
    return s


# ---- report ------------------------------------------------------------------------------------

def fmt(v, unit="", nd=2):
    if v is None:
        return "–"
    if unit == "B":
        for u, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if abs(v) >= k:
                return f"{v / k:.1f} {u}"
        return f"{v:.0f} B"
    return f"{v:.{nd}f} {unit}".strip()


def render(res, out):
    md = render_markdown(res)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(md)
    plots(res, out)


def render_markdown(res):
    sc, s = res["scenario"], res["summary"]
    L = [f"# {sc['name']}", ""]
    if sc.get("description"):
        L += [sc["description"], ""]
    L += [f"- scenario: `{res['scenario_file']}`; model: {res['model'] or '–'}",
          f"- testbed: profile `{res['testbed']['profile']}`, delay by {res['testbed']['delay_mode']}, "
          f"rate by {res['testbed'].get('rate_by') or '?'}, "
          f"cgroups {res['testbed']['cgroup']}",
          f"- machine: {res['machine']['cpus']} CPUs, Linux {res['machine']['kernel']}; git {res['git'] or '?'}; "
          f"{res['date']}",
          f"- repeats: {s['repeats']} ({s['ok']} ok)", "", "## Summary (median of repeats, [min – max])", "",
          "| metric | value |", "|---|---|"]
    for k, label, unit in (("token_ms_median", "token latency, median", "ms"),
                           ("token_ms_p90", "token latency, p90", "ms"), ("ttft_ms", "TTFT", "ms"),
                           ("tok_per_s", "throughput", "tok/s"), ("wall_s", "wall time of the head", "s")):
        v = s[k]
        L.append(f"| {label} | {fmt(v['median'], unit)} [{fmt(v['min'])} – {fmt(v['max'])}] |")
    L += ["", "## Devices (median of repeats)", "",
          "| device | role | CPU | mem limit | peak RSS | cgroup peak | MemAvailable drop | bytes sent |",
          "|---|---|---|---|---|---|---|---|"]
    roles = {}
    for c in res["commands"]:
        roles.setdefault(c["dev"], []).append(c["role"])
    for d in res["testbed"]["devices"]:
        ds = s["devices"][d["name"]]
        L.append(f"| {d['name']} | {', '.join(roles.get(d['name'], ['idle']))} | {d['cpu']:g} "
                 f"| {fmt(d['mem'] or None, 'B')} | {fmt(ds['peak_rss_bytes'], 'B')} "
                 f"| {fmt(ds['cgroup_peak_bytes'], 'B')} | {fmt(ds['memavail_drop_bytes'], 'B')} "
                 f"| {fmt(ds['bytes_sent'], 'B')} |")
    L += ["", "## Repeats", "", "| # | status | token median | token p90 | TTFT | tok/s | wall |",
          "|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        L.append(f"| {r['repeat']} | {r['status']} | {fmt(r.get('token_ms_median'), 'ms')} "
                 f"| {fmt(r.get('token_ms_p90'), 'ms')} | {fmt(r.get('ttft_ms'), 'ms')} "
                 f"| {fmt(r.get('tok_per_s'), 'tok/s')} | {fmt(r.get('wall_s'), 's')} |")
    L += ["", "## Commands", ""]
    seen = set()
    for c in res["commands"]:
        key = (c["role"], c["template"])
        devs = [x["dev"] for x in res["commands"] if (x["role"], x["template"]) == key]
        if key in seen:
            continue
        seen.add(key)
        L.append(f"- {c['role']} on {', '.join(devs)}: `{c['template']}`")
    L += ["", "## Plots", "", "![token latency](token_latency.png)", "", "![per repeat](repeats.png)", "",
          "![devices](devices.png)", ""]
    return "\n".join(L)


def plots(res, out):
    if not shutil.which("gnuplot"):
        log("gnuplot not found: no PNGs")
        return
    runs = [r for r in res["runs"] if r["status"] == "ok"]
    with open(os.path.join(out, "repeats.dat"), "w") as f:
        f.write("# repeat ttft_ms tok_per_s\n")
        for r in runs:
            f.write(f"{r['repeat']} {r.get('ttft_ms') or 0} {r.get('tok_per_s') or 0}\n")
    with open(os.path.join(out, "token_latency.dat"), "w") as f:
        for r in runs:
            f.write(f"# repeat {r['repeat']}\n")
            for i, t in enumerate(r["token_ms"]):
                f.write(f"{i + 1} {t}\n")
            f.write("\n\n")
    with open(os.path.join(out, "devices.dat"), "w") as f:
        f.write("# device peak_rss_MiB memavail_drop_MiB bytes_sent_MiB\n")
        for d, v in res["summary"]["devices"].items():
            mib = [((v[k] or 0) / 2**20) for k in ("peak_rss_bytes", "memavail_drop_bytes", "bytes_sent")]
            f.write(f"{d} {mib[0]:.3f} {mib[1]:.3f} {mib[2]:.3f}\n")
    s = res["summary"]
    med = s["token_ms_median"]["median"] or 0
    p90 = s["token_ms_p90"]["median"] or 0
    name = res["scenario"]["name"]
    # relative names, run from `out`: the files can be committed and re-rendered anywhere
    gp = f"""set terminal pngcairo size 900,500 font ",10"
set output "token_latency.png"
set title "{name}: latency of each token (one line per repeat)"
set xlabel "token"
set ylabel "ms"
set key outside right
set grid ytics
set yrange [0:*]
plot for [i=0:{max(len(runs) - 1, 0)}] "token_latency.dat" index i using 1:2 with linespoints pt 7 ps 0.4 title sprintf("repeat %d", i), \\
     {med} with lines lw 2 dt 2 lc rgb "black" title "median {med:.2f} ms", \\
     {p90} with lines lw 2 dt 3 lc rgb "red" title "p90 {p90:.2f} ms"
set output "devices.png"
set title "{name}: per device (median of repeats)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set xlabel "device"
set ylabel "MiB"
set xtics nomirror
set offsets 0, 0, graph 0.1, 0
unset xrange
plot "devices.dat" using 2:xtic(1) title "peak RSS", "" using 3 title "MemAvailable drop", "" using 4 title "bytes sent"
set output "repeats.png"
set multiplot layout 1,2 title "{name}: per repeat"
set title "time to first token"
set ylabel "ms"
set xlabel "repeat"
unset key
plot "repeats.dat" using 2:xtic(1) lc rgb "#4a7ebb"
set title "decode throughput"
set ylabel "tok/s"
plot "repeats.dat" using 3:xtic(1) lc rgb "#e07b39"
unset multiplot
"""
    with open(os.path.join(out, "plots.gp"), "w") as f:
        f.write(gp)
    r = subprocess.run(["gnuplot", "plots.gp"], capture_output=True, text=True, cwd=out)
    if r.returncode != 0:
        log(f"gnuplot failed: {r.stderr.strip()}")


def cmd_report(args):
    with open(args.results) as f:
        res = json.load(f)
    out = args.out or os.path.dirname(os.path.abspath(args.results))
    render(res, out)
    log(f"wrote {out}/report.md")
    return 0


# ---- tools: the small workload of the example report --------------------------------------------

def recv_exact(sock, n, buf):
    view = memoryview(buf)[:n]
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("peer closed")
        got += k


def tool_echo(a):
    """a worker: echoes every message back (length-prefixed, so message boundaries survive)"""
    srv = socket.create_server(("0.0.0.0", a.port), backlog=64)
    print(f"listening on {a.port}", flush=True)

    def serve(c):
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray(1 << 22)
        try:
            while True:
                recv_exact(c, 4, buf)
                n = int.from_bytes(buf[:4], "little")
                if n > len(buf) - 4:
                    raise ConnectionError("message too long")
                recv_exact(c, n, memoryview(buf)[4:])
                c.sendall(memoryview(buf)[:4 + n])
        except (ConnectionError, OSError):
            pass
        c.close()
    while True:
        c, _ = srv.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def tool_star(a):
    """the head: per token, --syncs star all-reduces (send --bytes to every worker at once, wait for
    every reply), like TPI-LLM's star all-reduce with a tiny model; the first token sends
    --prompt-tokens times more (prefill). Prints hearth_metrics."""
    import selectors
    peers = []
    for w in a.workers.split(","):
        host, port = w.rsplit(":", 1)
        for attempt in range(100):
            try:
                s = socket.create_connection((host, int(port)), timeout=5)
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise SystemExit(f"star: cannot reach {w}")
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        peers.append(s)
    sel = selectors.DefaultSelector()

    def allreduce(nbytes):
        msg = nbytes.to_bytes(4, "little") + b"\x42" * nbytes
        want = {s: len(msg) for s in peers}
        out = {s: memoryview(msg) for s in peers}
        for s in peers:
            sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
        while want:
            for key, ev in sel.select(10):
                s = key.fileobj
                if ev & selectors.EVENT_WRITE and len(out[s]):
                    out[s] = out[s][s.send(out[s]):]
                    if not len(out[s]):
                        sel.modify(s, selectors.EVENT_READ)
                if ev & selectors.EVENT_READ and s in want:
                    d = s.recv(1 << 20)
                    if not d:
                        raise SystemExit("star: a worker closed")
                    want[s] -= len(d)
                    if want[s] <= 0:
                        del want[s]
                        sel.unregister(s)
        for s in list(sel.get_map().values()):
            sel.unregister(s.fileobj)

    t0 = time.perf_counter()
    token_ms = []
    for tok in range(a.tokens):
        t = time.perf_counter()
        for _ in range(a.syncs):
            allreduce(a.bytes * (a.prompt_tokens if tok == 0 else 1))
        dt = (time.perf_counter() - t) * 1e3
        if tok == 0:
            ttft = (time.perf_counter() - t0) * 1e3
        else:
            token_ms.append(round(dt, 4))
    rss = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                rss = int(line.split()[1]) * 1024
    sent = (a.prompt_tokens + a.tokens - 1) * a.syncs * (a.bytes + 4) * len(peers)
    print(json.dumps({"hearth_metrics": {"tokens": a.tokens, "ttft_ms": round(ttft, 4), "token_ms": token_ms,
                                         "peak_rss_bytes": rss, "bytes_sent": sent, "workers": len(peers),
                                         "syncs_per_token": a.syncs, "bytes_per_sync": a.bytes}}), flush=True)


# ---- main --------------------------------------------------------------------------------------

def main(argv):
    ap = argparse.ArgumentParser(prog="harness", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Scenario format and the metrics contract: bench/README.md")
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("run", help="run a scenario")
    p.add_argument("scenario")
    p.add_argument("--repeats", type=int, help="override the scenario's repeats")
    p.add_argument("--model", help="override the scenario's model ({model} in templates)")
    p.add_argument("--out", help="output directory (default bench/reports/NAME)")
    p.add_argument("--instance", default="bench", help="testbed instance (default bench)")
    p.add_argument("--keep-up", action="store_true", help="leave the testbed up afterwards")
    p = sub.add_parser("report", help="re-render report.md and plots from results.json")
    p.add_argument("results")
    p.add_argument("--out")
    p = sub.add_parser("tool", help="the example workload")
    tsub = p.add_subparsers(dest="tool", required=True)
    t = tsub.add_parser("echo", help="worker: echo length-prefixed messages")
    t.add_argument("--port", type=int, default=7070)
    t = tsub.add_parser("star", help="head: star all-reduce per token, prints hearth_metrics")
    t.add_argument("--workers", required=True, help="addr:port,...")
    t.add_argument("--tokens", type=int, default=32)
    t.add_argument("--syncs", type=int, default=4, help="all-reduces per token")
    t.add_argument("--bytes", type=int, default=16384, help="bytes per worker per all-reduce")
    t.add_argument("--prompt-tokens", type=int, default=16, help="the first token moves this many times more")
    a = ap.parse_args(argv)
    if a.what == "run":
        return cmd_run(a)
    if a.what == "report":
        return cmd_report(a)
    if a.tool == "echo":
        return tool_echo(a)
    return tool_star(a)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except HarnessError as e:
        log(str(e))
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
