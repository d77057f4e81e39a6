# Shared by the cluster tests (test-tp.sh, test-pp.sh): `hearth worker` processes on loopback.
# Source it after setting nothing; it reads HEARTH_BIN and HEARTH_SHARED, exits 77 (skipped) without
# them, makes $TMP, and kills every worker it started (and $HEAD_PID) on exit, whatever happens.
BIN=${HEARTH_BIN:-}
SHARED=${HEARTH_SHARED:-../shared}
if [[ -z "$BIN" || ! -x "$BIN" ]]; then echo "HEARTH_BIN is not set to the hearth binary; skipping" >&2; exit 77; fi
if [[ ! -f "$SHARED/models/stories260K.gguf" ]]; then echo "shared models not found; skipping" >&2; exit 77; fi

TMP=$(mktemp -d)
export XDG_CACHE_HOME=$TMP/xdg   # the heads' slice cache (their own shares)
declare -A WPID WPORT
cleanup() {
    for i in "${!WPID[@]}"; do kill -9 "${WPID[$i]}" 2> /dev/null; done
    [[ -n "${HEAD_PID:-}" ]] && kill -9 "$HEAD_PID" 2> /dev/null
    wait 2> /dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

# start_worker I [PORT [FLAGS...]]: worker I listening on 127.0.0.1:PORT (default 0: any free port),
# cache $TMP/cI, log $TMP/wI.log
start_worker() {
    local i=$1 port=${2:-0}
    shift $(($# < 2 ? $# : 2))
    : > "$TMP/w$i.out"
    "$BIN" worker --listen "127.0.0.1:$port" --cache "$TMP/c$i" -t 1 "$@" >> "$TMP/w$i.out" 2>> "$TMP/w$i.log" &
    WPID[$i]=$!
    for _ in $(seq 100); do
        grep -q 'listening' "$TMP/w$i.out" && break
        sleep 0.05
    done
    WPORT[$i]=$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' "$TMP/w$i.out" | head -1)
    [[ -n "${WPORT[$i]}" ]] || { echo "worker $i did not start:"; cat "$TMP/w$i.log"; exit 1; }
}
stop_worker() { # stop_worker I: SIGTERM, and it must exit 0
    kill -TERM "${WPID[$1]}"
    wait "${WPID[$1]}"
    local rc=$?
    unset "WPID[$1]"
    if [[ $rc -eq 0 ]]; then ok; else bad "worker $1 exited with $rc on SIGTERM: $(tail -3 "$TMP/w$1.log")"; fi
}
workers() { # workers I J ...: their addresses, comma-separated
    local out="" i
    for i in "$@"; do out+="${out:+,}127.0.0.1:${WPORT[$i]}"; done
    echo "$out"
}

PROMPT="Once upon a time"
run() { "$BIN" run -p "$PROMPT" --temp 0 -n 24 -t 1 "$@"; }

# check_same MODEL WORKER-LIST ARGS...: the head's text equals $TMP/ref.txt (the one-device run)
check_same() {
    local model=$1 list=$2
    shift 2
    if ! run -m "$model" --workers "$list" "$@" > "$TMP/cl.txt" 2> "$TMP/cl.err"; then
        bad "$(basename "$model") $list $*: head failed: $(tail -2 "$TMP/cl.err")"
    elif cmp -s "$TMP/ref.txt" "$TMP/cl.txt"; then ok
    else bad "$(basename "$model") --workers $list $*: text differs from one device"; diff "$TMP/ref.txt" "$TMP/cl.txt" >&2
    fi
}
# expect_error PATTERN ARGS...: a head on stories260K exits non-zero and says PATTERN
expect_error() {
    local pat=$1
    shift
    run -m "$SHARED/models/stories260K.gguf" "$@" > /dev/null 2> "$TMP/e.err"
    local rc=$?
    if [[ $rc -ne 0 ]] && grep -q -- "$pat" "$TMP/e.err"; then ok
    else bad "$* -> exit $rc, want an error saying '$pat': $(tail -2 "$TMP/e.err")"; fi
}
sent() { sed -n 's/.*weight bytes sent: \([0-9]*\).*/\1/p' "$1" | tail -1; }

# check_kill I MODEL WORKER-LIST ARGS...: a long generation on MODEL; SIGKILL worker I once it is
# under way: with --no-recover the head must exit non-zero within 5 s with a message naming that worker
check_kill() {
    local victim=$1 big=$2 list=$3
    shift 3
    "$BIN" run -m "$big" -p "$PROMPT" --temp 0 -n 4000 -c 4096 --ignore-eos -t 1 --no-recover --workers "$list" "$@" \
        > "$TMP/kill.out" 2> "$TMP/kill.err" &
    HEAD_PID=$!
    for _ in $(seq 200); do # until generation is under way
        [[ $(stat -c %s "$TMP/kill.out" 2> /dev/null || echo 0) -gt 100 ]] && break
        sleep 0.05
    done
    kill -0 "$HEAD_PID" 2> /dev/null || bad "the head ended before the kill: $(tail -3 "$TMP/kill.err")"
    killed_port=${WPORT[$victim]}
    t0=$(date +%s%N)
    kill -9 "${WPID[$victim]}"
    wait "${WPID[$victim]}" 2> /dev/null
    unset "WPID[$victim]"
    for _ in $(seq 120); do kill -0 "$HEAD_PID" 2> /dev/null || break; sleep 0.05; done
    t1=$(date +%s%N)
    if kill -0 "$HEAD_PID" 2> /dev/null; then
        bad "the head still runs 6 s after its worker was killed"
        kill -9 "$HEAD_PID"
    fi
    wait "$HEAD_PID"
    head_rc=$?
    HEAD_PID=
    ms=$(((t1 - t0) / 1000000))
    if [[ $head_rc -ne 0 && $ms -le 5000 ]]; then ok; else bad "head exit code $head_rc after $ms ms (want non-zero within 5000)"; fi
    if grep 'hearth run:' "$TMP/kill.err" | tail -1 | grep -q "127.0.0.1:$killed_port"; then ok
    else bad "the head's message does not name the killed worker 127.0.0.1:$killed_port: $(tail -2 "$TMP/kill.err")"; fi
    echo "head exited $ms ms after the kill: $(grep 'hearth run:' "$TMP/kill.err" | tail -1)"
}
