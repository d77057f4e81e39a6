#!/usr/bin/env python3
"""Serving benchmark (issue 27): aggregate decode tokens/s under concurrent streaming requests, and
the time to first token of a short request while a long prompt is being processed.

Works against any server that speaks llama-server's API: GET /health (503 while loading, then 200),
POST /v1/completions with "stream": true answered as Server-Sent Events (`data: {...}` chunks,
`data: [DONE]`), and POST /tokenize (used only to size the long prompt; without it the prompt is
sized by a word count). Both llama.cpp's llama-server and `hearth serve` qualify.

A server is either started here (--server NAME=COMMAND; `{port}` in COMMAND becomes a free port,
the process is stopped at the end) or already running (--url NAME=URL). With several servers the
benchmark runs in rounds: each round starts every server in turn, measures it and stops it, so that
servers are compared on runs minutes apart rather than a whole benchmark apart; figures are medians
over the rounds (--repeats).

Test 1, concurrency: for each C in --concurrency, C clients at once send distinct short prompts
(temperature 0, ignore_eos, max_tokens N) and read the streams. Per client: time to first token
(request sent -> first chunk carrying a token), the gaps between later chunks (inter-token latency),
and the tokens generated after the first (the usage's completion_tokens when the server sends usage,
else the chunks that carry text). Aggregate decode tokens/s = the sum over clients of the tokens
after each one's first / the wall time from the earliest first token to the latest last token.

Test 2, a short request behind a long prompt: a prompt of --long-tokens tokens alone (its time to
first token is its prefill time), a short prompt alone, then the long prompt again and, once a
quarter of the long prompt's prefill time has passed, the short one: its time to first token is
the figure. With --chunk NAME=TOKENS (the server's prompt chunk: llama-server's -b/--batch-size,
hearth's chunk) it is also given in chunks, a chunk's time being the long prompt's prefill time
× TOKENS / its token count.

The model: every token it can generate must have text, because a server may send no chunk for a
token without any (hearth serve does not; llama-server sends an empty one), and a stream without
chunks has no times. `hearth synth --vocab-from V` pads a smaller vocabulary with control tokens up
to the shape's n_vocab, and a random model generates those; so give `--n-vocab` the vocabulary's
own size (e.g. `--vocab-from ggml-vocab-llama-spm.gguf --n-vocab 32000`).

--ban-tokens: random-weight models emit arbitrary byte tokens, and llama-server (3f545be) answers
a stream whose text ends inside a UTF-8 character with an error chunk ("does not match the expected
Content-only format"); banning the byte tokens 0x80-0xFF (ids 131-258 in the SentencePiece vocabularies
of stories260K and llama-spm) avoids that at no measurable cost. A server that ignores
logit_bias is unaffected.

Prompts are made distinct per round, client and test (a different first word), so that no server's
prompt cache turns a prefill into a cache hit between repeats.

usage: bench/serve.py (--server NAME=COMMAND | --url NAME=URL)... [--concurrency 1,2,4,8]
                      [--max-tokens 128] [--repeats 3] [--long-tokens 2000] [--chunk NAME=TOKENS]
                      [--baseline NAME] [--no-long] [--ban-tokens A-B,C] [--json OUT.json]
                      [--log-dir DIR]

example:
  bench/serve.py --repeats 3 \\
    --server "llama=llama-server -m M.gguf -t 2 --parallel 8 -c 32768 --port {port}" \\
    --server "hearth=build/hearth serve -m M.gguf -t 2 --parallel 8 -c 4096 --port {port}"
"""
import argparse, http.client, json, os, shlex, signal, socket, statistics, subprocess, sys, threading, time
import urllib.parse

WORDS = ("the of and a to in is you that it he was for on are as with his they at be this have from or "
         "one had by word but not what all were we when your can said there use an each which she do how "
         "their if will up other about out many then them these so some her would make like him into time "
         "has look two more write go see number no way could people my than first water been call who oil "
         "its now find long down day did get come made may part").split()

FIRST = ("Once", "Today", "Yesterday", "Suddenly", "Later", "Meanwhile", "Finally", "Tomorrow", "Tonight",
         "Recently", "Again", "Here", "There", "Now", "Then", "Soon")


def die(msg):
    sys.exit("serve.py: " + msg)


class Server:
    """One server under test: started from a command (and stopped), or an existing URL."""

    def __init__(self, name, command=None, url=None, log_dir=None):
        self.name, self.command, self.url, self.log_dir = name, command, url, log_dir
        self.proc, self.log = None, None
        self.starts = 0
        self.logit_bias = None

    def start(self, timeout=600):
        if self.command is not None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            cmd = self.command.replace("{port}", str(port))
            self.url = "http://127.0.0.1:%d" % port
            self.starts += 1
            if self.log_dir:
                os.makedirs(self.log_dir, exist_ok=True)
                self.log = open(os.path.join(self.log_dir, "%s-%d.log" % (self.name, self.starts)), "wb")
            else:
                self.log = open(os.devnull, "wb")
            self.proc = subprocess.Popen(shlex.split(cmd), stdout=self.log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        u = urllib.parse.urlparse(self.url)
        self.host, self.port = u.hostname, u.port or 80
        t0 = time.monotonic()
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                die("%s: the server exited with status %d while starting (command: %s)"
                    % (self.name, self.proc.returncode, self.command))
            try:
                status, _ = self.request("GET", "/health", None, timeout=5)
                if status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() - t0 > timeout:
                self.stop()
                die("%s: /health not 200 within %d s" % (self.name, timeout))
            time.sleep(0.2)

    def stop(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
            self.proc = None
        if self.log is not None:
            self.log.close()
            self.log = None

    def request(self, method, path, body, timeout=600):
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            c.request(method, path, body=None if body is None else json.dumps(body),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def count_tokens(self, text):
        try:
            status, data = self.request("POST", "/tokenize", {"content": text})
            if status == 200:
                return len(json.loads(data)["tokens"])
        except (OSError, ValueError, KeyError):
            pass
        return None

    def stream(self, prompt, max_tokens, result):
        """One streaming completion; fills result with t_send, chunk times, usage, error."""
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        if self.logit_bias:
            body["logit_bias"] = self.logit_bias
        c = http.client.HTTPConnection(self.host, self.port, timeout=900)
        times, usage, err = [], None, None
        t_send = time.monotonic()
        try:
            c.request("POST", "/v1/completions", body=json.dumps(body),
                      headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
            r = c.getresponse()
            if r.status != 200:
                err = "HTTP %d: %s" % (r.status, r.read()[:300].decode("utf-8", "replace"))
            else:
                while True:
                    line = r.readline()
                    if not line:
                        break
                    t = time.monotonic()
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue          # blank separators, ": ping" comments, event: lines
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    obj = json.loads(data)
                    if "error" in obj:
                        err = "error chunk: %s" % json.dumps(obj["error"])[:300]
                        break
                    if obj.get("usage"):
                        usage = obj["usage"]
                    for ch in obj.get("choices") or []:
                        # a chunk that carries a token: text (possibly "" where a token ends inside a
                        # UTF-8 character); a closing chunk with finish_reason and no text carries none
                        if "text" in ch and (ch["text"] or not ch.get("finish_reason") or not times):
                            times.append(t)
        except (OSError, ValueError) as e:
            err = "%s: %s" % (type(e).__name__, e)
        finally:
            c.close()
        result.update(t_send=t_send, times=times, usage=usage, error=err)


def free_text(n_words, seed):
    return " ".join(WORDS[(seed * 7 + i * 13 + (i * i) % 11) % len(WORDS)] for i in range(n_words))


def short_prompt(tag, i):
    return "%s %s, %s" % (FIRST[i % len(FIRST)], tag, free_text(12, i))


def client_metrics(res, max_tokens):
    if res["error"]:
        die("request failed: " + res["error"])
    times = res["times"]
    if len(times) < 2:
        # a server that sends no chunk for a token without text (a control token) leaves nothing to
        # time: use a model whose every token has text (see the note at the top)
        die("a stream carried %d chunk(s) with text for %s tokens: nothing to time"
            % (len(times), (res["usage"] or {}).get("completion_tokens", "?")))
    n = len(times)
    if res["usage"] and res["usage"].get("completion_tokens"):
        n = res["usage"]["completion_tokens"]
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {"ttft_ms": (times[0] - res["t_send"]) * 1e3, "t_first": times[0], "t_last": times[-1],
            "tokens": n, "chunks": len(times), "gaps_ms": [g * 1e3 for g in gaps]}


def concurrent(server, c, max_tokens, tag):
    results = [{} for _ in range(c)]
    threads = [threading.Thread(target=server.stream, args=(short_prompt("%s-%d" % (tag, i), i), max_tokens,
                                                            results[i])) for i in range(c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ms = [client_metrics(r, max_tokens) for r in results]
    after_first = sum(m["tokens"] - 1 for m in ms)
    wall = max(m["t_last"] for m in ms) - min(m["t_first"] for m in ms)
    gaps = sorted(g for m in ms for g in m["gaps_ms"])
    return {"concurrency": c, "aggregate_tok_s": after_first / wall if wall > 0 else 0.0,
            "per_client_tok_s": med([(m["tokens"] - 1) / (m["t_last"] - m["t_first"])
                                     for m in ms if m["t_last"] > m["t_first"]]),
            "ttft_ms": statistics.median(m["ttft_ms"] for m in ms),
            "ttft_max_ms": max(m["ttft_ms"] for m in ms),
            "itl_ms": statistics.median(gaps) if gaps else 0.0,
            "itl_p90_ms": gaps[int(0.9 * (len(gaps) - 1))] if gaps else 0.0,
            "tokens": [m["tokens"] for m in ms], "chunks": [m["chunks"] for m in ms], "wall_s": wall}


def long_prompt(server, n_tokens, tag):
    """A prompt of about n_tokens tokens (sized with /tokenize when the server has it)."""
    words = n_tokens
    text = "%s %s. %s" % (FIRST[0], tag, free_text(words, 3))
    for _ in range(4):
        n = server.count_tokens(text)
        if n is None or abs(n - n_tokens) <= n_tokens // 100:
            return text, n
        words = max(1, int(words * n_tokens / n))
        text = "%s %s. %s" % (FIRST[0], tag, free_text(words, 3))
    return text, server.count_tokens(text)


def behind_long(server, n_long, tag, chunk_tokens):
    def one(prompt, max_tokens):
        r = {}
        server.stream(prompt, max_tokens, r)
        return client_metrics(r, max_tokens)

    text, n = long_prompt(server, n_long, tag + "-a")
    alone_long = one(text, 2)["ttft_ms"]
    alone_short = one(short_prompt(tag + "-b", 1), 8)["ttft_ms"]
    text2, _ = long_prompt(server, n_long, tag + "-c")
    res_long = {}
    t = threading.Thread(target=server.stream, args=(text2, 2, res_long))
    t.start()
    time.sleep(alone_long / 4e3)
    short = one(short_prompt(tag + "-d", 2), 8)
    t.join()
    lm = client_metrics(res_long, 2)
    out = {"long_tokens": n, "long_prefill_ms": alone_long, "short_alone_ttft_ms": alone_short,
           "short_behind_long_ttft_ms": short["ttft_ms"], "long_ttft_with_short_ms": lm["ttft_ms"],
           "chunk_tokens": chunk_tokens}
    if chunk_tokens and n:
        out["chunk_ms"] = alone_long * min(chunk_tokens, n) / n
        out["short_behind_long_chunks"] = short["ttft_ms"] / out["chunk_ms"]
    return out


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def summarize(runs, key):
    vals = [r[key] for r in runs]
    return {"median": med(vals), "min": min(vals), "max": max(vals)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", action="append", default=[], metavar="NAME=COMMAND",
                    help="a server to start; {port} in COMMAND becomes a free port")
    ap.add_argument("--url", action="append", default=[], metavar="NAME=URL", help="a running server")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3, help="rounds; figures are medians over them")
    ap.add_argument("--long-tokens", type=int, default=2000)
    ap.add_argument("--chunk", action="append", default=[], metavar="NAME=TOKENS",
                    help="the server's prompt chunk in tokens, to give test 2 in chunks")
    ap.add_argument("--no-long", action="store_true", help="skip test 2")
    ap.add_argument("--ban-tokens", default=None, metavar="A-B,C",
                    help="send logit_bias -100 for these token ids (see the note at the top)")
    ap.add_argument("--baseline", default=None, help="the server the others are compared with (default: the first)")
    ap.add_argument("--json", default=None, help="also write everything to this file")
    ap.add_argument("--log-dir", default=None, help="keep each started server's output here")
    a = ap.parse_args()

    servers = []
    for spec, kind in [(s, "command") for s in a.server] + [(u, "url") for u in a.url]:
        name, sep, val = spec.partition("=")
        if not sep or not name or not val:
            die("expected NAME=%s, got %r" % (kind.upper(), spec))
        if any(s.name == name for s in servers):
            die("two servers named %r" % name)
        servers.append(Server(name, command=val if kind == "command" else None,
                              url=val if kind == "url" else None, log_dir=a.log_dir))
    if not servers:
        die("no server: give --server NAME=COMMAND or --url NAME=URL")
    chunks = {}
    for spec in a.chunk:
        name, sep, val = spec.partition("=")
        if not sep or not val.isdigit() or int(val) <= 0:
            die("expected --chunk NAME=TOKENS, got %r" % spec)
        chunks[name] = int(val)
    try:
        conc = [int(x) for x in a.concurrency.split(",")]
    except ValueError:
        die("--concurrency takes numbers like 1,2,4,8")
    if any(c < 1 for c in conc) or a.max_tokens < 2 or a.repeats < 1 or a.long_tokens < 16:
        die("concurrency >= 1, max-tokens >= 2, repeats >= 1, long-tokens >= 16")
    if a.ban_tokens:
        bias = {}
        try:
            for part in a.ban_tokens.split(","):
                lo, _, hi = part.partition("-")
                for t in range(int(lo), int(hi or lo) + 1):
                    bias[str(t)] = -100
        except ValueError:
            die("--ban-tokens takes ids and ranges like 131-258,300")
        for s in servers:
            s.logit_bias = bias
    baseline = a.baseline or servers[0].name
    if baseline not in [s.name for s in servers]:
        die("--baseline %r is not a server" % baseline)

    def on_signal(signum, frame):   # SIGTERM (timeout, kill) too must stop the servers started here
        raise SystemExit("serve.py: signal %d" % signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    data = {s.name: {"command": s.command, "url": s.url, "rounds": []} for s in servers}
    started = time.time()
    try:
        for rnd in range(a.repeats):
            for s in servers:
                s.start()
                try:
                    s.stream(short_prompt("warm-%d" % rnd, 0), 8, {})    # warm-up: page cache, threads
                    r = {"concurrent": [], "long": None, "load_before": os.getloadavg()[0]}
                    for c in conc:
                        r["concurrent"].append(concurrent(s, c, a.max_tokens, "r%dc%d" % (rnd, c)))
                        print("# %s round %d C=%d: %.1f tok/s" % (s.name, rnd + 1, c,
                              r["concurrent"][-1]["aggregate_tok_s"]), file=sys.stderr)
                    if not a.no_long:
                        r["long"] = behind_long(s, a.long_tokens, "r%dL" % rnd, chunks.get(s.name))
                        print("# %s round %d short behind long: %.0f ms" % (s.name, rnd + 1,
                              r["long"]["short_behind_long_ttft_ms"]), file=sys.stderr)
                    r["load_after"] = os.getloadavg()[0]
                    data[s.name]["rounds"].append(r)
                    if a.json:      # the rounds so far, in case a later one fails or is cut off
                        with open(a.json + ".partial", "w") as f:
                            json.dump({"servers": data}, f, indent=1)
                finally:
                    s.stop()
    finally:
        for s in servers:
            s.stop()

    # summaries
    summary = {}
    for s in servers:
        rounds = data[s.name]["rounds"]
        per_c = {}
        for i, c in enumerate(conc):
            runs = [r["concurrent"][i] for r in rounds]
            per_c[c] = {k: summarize(runs, k) for k in ("aggregate_tok_s", "per_client_tok_s", "ttft_ms",
                                                         "ttft_max_ms", "itl_ms", "itl_p90_ms")}
        lg = None
        if not a.no_long:
            runs = [r["long"] for r in rounds]
            lg = {k: summarize(runs, k) for k in ("long_prefill_ms", "short_alone_ttft_ms",
                                                   "short_behind_long_ttft_ms", "chunk_ms",
                                                   "short_behind_long_chunks") if k in runs[0]}
            lg["long_tokens"] = runs[0]["long_tokens"]
            lg["chunk_tokens"] = runs[0]["chunk_tokens"]
        summary[s.name] = {"concurrent": per_c, "long": lg}

    def fmt(x):
        return "%.1f" % x

    out = []
    out.append("Aggregate decode tok/s, median of %d round(s) (min-max); max_tokens %d, temperature 0, ignore_eos"
               % (a.repeats, a.max_tokens))
    out.append("")
    out.append("| server | C | aggregate tok/s | × C=1 | × %s | per-client tok/s | TTFT ms (median / max) "
               "| ITL ms (median / p90) |" % baseline)
    out.append("|" + " --- |" * 8)
    for s in servers:
        pc = summary[s.name]["concurrent"]
        one = pc[conc[0]]["aggregate_tok_s"]["median"]
        for c in conc:
            m = pc[c]
            agg = m["aggregate_tok_s"]
            base = summary[baseline]["concurrent"][c]["aggregate_tok_s"]["median"]
            out.append("| %s | %d | %s (%s-%s) | %.2f | %.2f | %s | %.0f / %.0f | %.1f / %.1f |" % (
                s.name, c, fmt(agg["median"]), fmt(agg["min"]), fmt(agg["max"]),
                agg["median"] / one if one else 0, agg["median"] / base if base else 0,
                fmt(m["per_client_tok_s"]["median"]), m["ttft_ms"]["median"], m["ttft_max_ms"]["median"],
                m["itl_ms"]["median"], m["itl_p90_ms"]["median"]))
    if not a.no_long:
        out.append("")
        out.append("A short request (8 tokens) sent a quarter of the way into a long prompt's prefill, median of "
                   "%d round(s)" % a.repeats)
        out.append("")
        out.append("| server | long prompt tokens | its prefill ms alone | short TTFT alone ms "
                   "| short TTFT behind long ms | chunk (tokens / ms) | in chunks |")
        out.append("|" + " --- |" * 7)
        for s in servers:
            lg = summary[s.name]["long"]
            ch = "%d / %.0f" % (lg["chunk_tokens"], lg["chunk_ms"]["median"]) if "chunk_ms" in lg else "unknown"
            inch = "%.2f" % lg["short_behind_long_chunks"]["median"] if "short_behind_long_chunks" in lg else "-"
            out.append("| %s | %s | %.0f | %.0f | %.0f (%.0f-%.0f) | %s | %s |" % (
                s.name, lg["long_tokens"] if lg["long_tokens"] is not None else "?",
                lg["long_prefill_ms"]["median"], lg["short_alone_ttft_ms"]["median"],
                lg["short_behind_long_ttft_ms"]["median"], lg["short_behind_long_ttft_ms"]["min"],
                lg["short_behind_long_ttft_ms"]["max"], ch, inch))
    out.append("")
    for s in servers:
        loads = ", ".join("%.1f-%.1f" % (r["load_before"], r["load_after"]) for r in data[s.name]["rounds"])
        out.append("- %s: `%s` (1-minute load average before-after each round: %s)"
                   % (s.name, s.command if s.command else s.url, loads))
    print("\n".join(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"started": started, "finished": time.time(), "concurrency": conc,
                       "max_tokens": a.max_tokens, "repeats": a.repeats, "long_tokens": a.long_tokens,
                       "baseline": baseline, "servers": data, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
