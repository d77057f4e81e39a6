#!/usr/bin/env bash
# `hearth chat` driven through a pseudo-terminal (python3's pty module) on stories260K, greedy:
#  - two turns; the second turn evaluates only its new tokens, the first turn and its answer
#    come from the KV cache (/stats: prompt tokens evaluated vs reused);
#  - Ctrl-C while a long answer streams stops that answer, the session goes on and takes a
#    further turn that again evaluates only the new tokens;
#  - /exit, Ctrl-D and Ctrl-C at the prompt end the chat with status 0; unknown commands and
#    /reset are answered.
# Also `hearth run --stop` (the output ends where the stop string would begin) and `run --chat`.
# Env: HEARTH_BIN (the hearth binary), HEARTH_SHARED (the shared/ folder with models/).
set -u

BIN=${HEARTH_BIN:-}
SHARED=${HEARTH_SHARED:-../shared}
MODEL="$SHARED/models/stories260K.gguf"
if [[ -z "$BIN" || ! -x "$BIN" ]]; then
    echo "HEARTH_BIN is not set to the hearth binary; skipping" >&2
    exit 77
fi
if [[ ! -f "$MODEL" ]]; then
    echo "$MODEL not found (set HEARTH_SHARED); skipping" >&2
    exit 77
fi
if ! command -v python3 > /dev/null; then
    echo "python3 not found; skipping" >&2
    exit 77
fi

exec python3 - "$BIN" "$MODEL" << 'EOF'
import os, pty, re, select, signal, subprocess, sys, time

BIN, MODEL = sys.argv[1], sys.argv[2]
passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL: " + what, file=sys.stderr)
    return cond


class Session:
    """hearth chat on the slave side of a pty; everything it writes is collected in self.out"""

    def __init__(self, *args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.environ["HEARTH_LOG"] = "warn"
            os.execv(BIN, [BIN, "chat", "-m", MODEL, "--temp", "0", "-t", "2"] + list(args))
        self.out = ""
        self.status = None

    def read(self, timeout):
        r, _, _ = select.select([self.fd], [], [], timeout)
        if not r:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            data = b""
        if not data:
            return None
        self.out += data.decode("utf-8", "replace")
        return True

    def expect(self, pattern, start, timeout=20.0):
        """waits for pattern in the output after offset start; returns the match or None"""
        end = time.time() + timeout
        while True:
            m = re.compile(pattern).search(self.out, start)
            if m:
                return m
            left = end - time.time()
            if left <= 0 or self.read(left) is None:
                return None

    def send(self, text):
        mark = len(self.out)
        os.write(self.fd, text.encode())
        return mark

    def turn(self, text, timeout=20.0):
        """sends a line and waits for the next prompt; returns what came back, or None"""
        mark = self.send(text + "\n")
        m = self.expect(r"\n> ", mark + len(text), timeout)
        return self.out[mark:m.start()] if m else None

    def stats(self):
        mark = self.send("/stats\n")
        m = self.expect(r"last turn: (\d+) prompt tokens evaluated \((\d+) reused[^\n]*; (\d+) tokens generated"
                        r"[\s\S]*context (\d+) of (\d+) tokens in use[\s\S]*\n> ", mark)
        return tuple(int(x) for x in m.groups()) if m else None

    def wait(self, timeout=10.0):
        end = time.time() + timeout
        while time.time() < end:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(st)
                return self.status
            self.read(0.05)
        return None

    def close(self):
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except OSError:
                pass
        os.close(self.fd)


t_start = time.time()

# ---- hearth run: --stop and --chat ------------------------------------------------------------------
def run(*args):
    p = subprocess.run([BIN, "run", "-m", MODEL, "--temp", "0", "-t", "1"] + list(args), capture_output=True, timeout=60)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


prompt = "Once upon a time"
rc, full, _ = run("-p", prompt, "-n", "48")
gen = full[len(prompt):].rstrip("\n")
check(rc == 0 and full.startswith(prompt) and len(gen) > 40, "run: %r" % full)
if len(gen) > 40:
    stop = gen[30:36]  # ends the output where it first occurs
    rc, out, _ = run("-p", prompt, "-n", "48", "--stop", "never-there", "--stop", stop)
    check(rc == 0 and out == prompt + gen[:gen.index(stop)] + "\n", "run --stop %r: %r" % (stop, out))
rc, out, err = run("-p", "Hello", "--chat", "-sys", "Be kind.", "-n", "16")
check(rc == 0 and out.strip() and "no chat template" in err and "chatml" in err, "run --chat: %r %r" % (out, err))
check(not out.startswith("Hello"), "run --chat does not echo the prompt")
rc, out, err = run("-p", "Hello", "--chat-template", "no-such-template")
check(rc == 2 and "unknown chat template" in err, "run --chat-template with a bad name: %d %r" % (rc, err))

# ---- two turns, Ctrl-C in a long answer, a further turn, /exit -----------------------------------
s = Session("-c", "4096", "-n", "24", "--ignore-eos", "-sys", "You tell stories.")
try:
    check(s.expect(r"\n> ", 0) is not None, "first prompt")
    check(re.search(r"template chatml", s.out) and re.search(r"no chat template.*chatml", s.out),
          "the missing template is reported with the fallback: " + s.out[:300])
    a1 = s.turn("Tell me about a cat.")
    check(a1 is not None and len(a1.strip()) > len("Tell me about a cat."), "first answer: %r" % a1)
    st1 = s.stats()
    check(st1 is not None, "stats after turn 1")
    a2 = s.turn("What did the cat eat?")
    check(a2 is not None and len(a2.strip()) > len("What did the cat eat?"), "second answer: %r" % a2)
    st2 = s.stats()
    check(st2 is not None, "stats after turn 2")
    if st1 and st2:
        p1, r1, g1, ctx1, n_ctx = st1
        p2, r2, g2, ctx2, _ = st2
        print("turn 1: %d prompt tokens evaluated, %d reused, %d generated" % (p1, r1, g1))
        print("turn 2: %d prompt tokens evaluated, %d reused, %d generated" % (p2, r2, g2))
        check(r1 == 0 and p1 > 0 and g1 == 24, "turn 1 starts from an empty cache: %s" % (st1,))
        # the whole conversation is r2 + p2 tokens; what turn 1 left in the cache (its prompt and
        # all but the last answer token) is reused, only the new message is evaluated
        check(r2 >= p1 + g1 - 2, "turn 2 reuses turn 1 from the cache: %s" % (st2,))
        check(0 < p2 < r2 + p2 and p2 < p1 + 30, "turn 2 evaluates only the new message: %s" % (st2,))

    # a long answer, stopped by Ctrl-C once it is streaming
    check(s.turn("/set n -1") is not None, "/set n -1")
    text = "Tell me a very long story."
    mark = s.send(text + "\n")
    streaming = s.expect(r"[\s\S]{200}", mark + len(text) + 2, 30)
    check(streaming is not None, "the long answer streams")
    t_int = time.time()
    s.send("\x03")
    m = s.expect(r"\[interrupted\][\s\S]*\n> ", mark, 15)
    check(m is not None, "Ctrl-C stops the answer and the prompt comes back")
    print("answer stopped %.2f s after Ctrl-C" % (time.time() - t_int))
    st3 = s.stats()
    if st3:
        print("turn 3: %d prompt tokens evaluated, %d reused, %d generated before Ctrl-C" % st3[:3])
    check(st3 is not None and 0 < st3[2] < st3[4] - st3[3], "the interrupted answer is partial: %s" % (st3,))
    check("context is full" not in s.out[mark:], "the answer did not run to the end of the context")

    # the session goes on; the partial answer stays in the conversation and in the cache
    check(s.turn("/set n 16") is not None, "/set n 16")
    a4 = s.turn("And then?")
    check(a4 is not None and len(a4.strip()) > len("And then?"), "the turn after Ctrl-C is answered: %r" % a4)
    st4 = s.stats()
    if st2 and st3 and st4:
        print("turn 4: %d prompt tokens evaluated, %d reused, %d generated" % st4[:3])
        # "And then?" is shorter than turn 2's message, with the same template around it
        check(st4[1] >= st3[3] - 2 and st4[0] <= st2[0], "turn 4 reuses the conversation, partial answer included: %s" % (st4,))
    r = s.turn("/nonsense")
    check(r is not None and "unknown command" in r, "unknown commands are answered")
    r = s.turn("/reset")
    check(r is not None and "reset" in r, "/reset")
    st5 = s.stats()
    check(st5 is not None and st5[3] == 0, "/reset empties the cache: %s" % (st5,))
    s.send("/exit\n")
    check(s.wait() == 0, "/exit ends the chat with status 0 (got %s)" % s.status)
finally:
    s.close()

# ---- Ctrl-D and Ctrl-C at the prompt --------------------------------------------------------------
for key, name in (("\x04", "Ctrl-D"), ("\x03", "Ctrl-C")):
    s = Session("-n", "8")
    try:
        check(s.expect(r"\n> ", 0) is not None, name + ": first prompt")
        s.send(key)
        check(s.wait() == 0, "%s at the prompt ends the chat with status 0 (got %s)" % (name, s.status))
    finally:
        s.close()

print("%.1f s" % (time.time() - t_start))
print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
EOF
