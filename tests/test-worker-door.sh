#!/usr/bin/env bash
# A worker held hostage: idle connections, a HELLO followed by silence, and a second head while one
# generates. Idle connections must not keep a real head out, a silent session is dropped after
# --setup-timeout, and a second head hears "busy" at once. Loopback only; everything started is stopped.
# Env: HEARTH_BIN, HEARTH_SHARED (see lib-cluster.sh).
set -u
source "$(dirname "$0")/lib-cluster.sh"
HC="python3 $(dirname "$0")/hostile-client.py"
command -v python3 > /dev/null || { echo "python3 not found; skipping"; exit 77; }
M="$SHARED/models/stories260K.gguf"
declare -a CPIDS=()
stop_clients() { for p in "${CPIDS[@]}"; do kill -9 "$p" 2> /dev/null; wait "$p" 2> /dev/null; done; CPIDS=(); }
trap 'stop_clients; cleanup' EXIT
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }
# expect_busy DESC: a head now fails within 3 s, told the worker is busy
expect_busy() {
    local t0 rc ms
    t0=$(date +%s%N)
    run -m "$M" --workers "$(workers 1)" --tp-shares equal > /dev/null 2> "$TMP/busy.err"
    rc=$?
    ms=$(ms_since "$t0")
    if [[ $rc -ne 0 && $ms -lt 3000 ]] && grep -q busy "$TMP/busy.err"; then ok
    else bad "$1: exit $rc after $ms ms: $(tail -1 "$TMP/busy.err")"; fi
}

run -m "$M" > "$TMP/ref.txt" 2> /dev/null || { echo "one-device run failed"; exit 1; }
start_worker 1 0 --setup-timeout 3

# ---- idle connections: a real head is served at once ------------------------------------------------
$HC "${WPORT[1]}" idle 4 60 > "$TMP/idle.out" &
CPIDS+=($!)
for _ in $(seq 100); do [[ -s "$TMP/idle.out" ]] && break; sleep 0.05; done
t0=$(date +%s%N)
check_same "$M" "$(workers 1)" --tp-shares equal
ms=$(ms_since "$t0")
if [[ $ms -lt 8000 ]]; then ok; else bad "with 4 idle connections the head took $ms ms"; fi
stop_clients

# ---- HELLO then silence: busy at once, then dropped after --setup-timeout -------------------------
$HC "${WPORT[1]}" hello-silent 60 > "$TMP/silent.out" &
CPIDS+=($!)
for _ in $(seq 100); do [[ -s "$TMP/silent.out" ]] && break; sleep 0.05; done
grep -q HELLO_ACK "$TMP/silent.out" && ok || bad "the silent client got no HELLO_ACK: $(cat "$TMP/silent.out")"
expect_busy "a head while a silent one holds the worker"
sleep 3.5
check_same "$M" "$(workers 1)" --tp-shares equal
grep -q "setting up" "$TMP/w1.log" && ok || bad "the worker's log does not say why the silent session ended"
stop_clients

# ---- a second head while one generates: busy at once ---------------------------------------------------
big=$TMP/big.gguf
"$BIN" synth --shape custom --arch llama --n-embd 256 --n-layer 6 --n-head 8 --n-head-kv 4 --n-ff 1024 \
    --n-ctx 4096 --type Q8_0 -o "$big" > /dev/null 2>&1 || bad "synth"
"$BIN" run -m "$big" -p "$PROMPT" --temp 0 -n 3000 -c 4096 --ignore-eos -t 1 --workers "$(workers 1)" --tp-shares equal \
    > "$TMP/long.out" 2> "$TMP/long.err" &
HEAD_PID=$!
for _ in $(seq 200); do [[ $(stat -c %s "$TMP/long.out" 2> /dev/null || echo 0) -gt 100 ]] && break; sleep 0.05; done
expect_busy "a second head during generation"
kill -0 "$HEAD_PID" 2> /dev/null && ok || bad "the generating head ended early: $(tail -2 "$TMP/long.err")"
kill -9 "$HEAD_PID"
wait "$HEAD_PID" 2> /dev/null
HEAD_PID=
sleep 0.5
check_same "$M" "$(workers 1)" --tp-shares equal
stop_worker 1

[[ $fail -eq 0 ]] || { echo "worker log:"; cat "$TMP/w1.log"; } >&2
echo "test-worker-door: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
