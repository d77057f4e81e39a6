#!/usr/bin/env bash
# Tensor parallelism through the command line, on loopback: `hearth worker` processes and
# `hearth run --workers ...` heads.
# - head + 1, 2, 3 workers (even, uneven and measured shares; star and ring) print exactly the
#   single-device greedy text (`hearth run --temp 0 -n 24`) on stories260K and on synth models;
# - a second run with the same model and shares sends 0 weight bytes (the counter the head prints);
# - SIGKILL of a worker mid-generation: the head exits non-zero within 5 s naming that worker; the
#   restarted worker and the others then serve a new head;
# - garbage and a wrong-version HELLO sent to a worker: it logs the reason and keeps serving.
# Every process started here is killed on exit (trap), whatever happens.
# Env: HEARTH_BIN (the hearth binary), HEARTH_SHARED (the shared/ folder with models/).
set -u

BIN=${HEARTH_BIN:-}
SHARED=${HEARTH_SHARED:-../shared}
if [[ -z "$BIN" || ! -x "$BIN" ]]; then echo "HEARTH_BIN is not set to the hearth binary; skipping" >&2; exit 77; fi
if [[ ! -f "$SHARED/models/stories260K.gguf" ]]; then echo "shared models not found; skipping" >&2; exit 77; fi

TMP=$(mktemp -d)
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

# start_worker I [PORT]: worker I listening on 127.0.0.1:PORT (default: any free port), cache $TMP/cI
start_worker() {
    local i=$1 port=${2:-0}
    : > "$TMP/w$i.out"
    "$BIN" worker --listen "127.0.0.1:$port" --cache "$TMP/c$i" -t 1 >> "$TMP/w$i.out" 2>> "$TMP/w$i.log" &
    WPID[$i]=$!
    for _ in $(seq 100); do
        grep -q 'listening' "$TMP/w$i.out" && break
        sleep 0.05
    done
    WPORT[$i]=$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' "$TMP/w$i.out" | head -1)
    [[ -n "${WPORT[$i]}" ]] || { echo "worker $i did not start:"; cat "$TMP/w$i.log"; exit 1; }
}
workers() { # workers I J ...: their addresses, comma-separated
    local out="" i
    for i in "$@"; do out+="${out:+,}127.0.0.1:${WPORT[$i]}"; done
    echo "$out"
}

for i in 1 2 3; do start_worker $i; done

PROMPT="Once upon a time"
run() { "$BIN" run -p "$PROMPT" --temp 0 -n 24 -t 1 "$@"; }

# ---- same tokens as one device --------------------------------------------------------------------
# Q8_0 and F32 weights: the partial sums round the same way as one device's (tests/test-shard.c), so
# any split gives the same text. Q4_K/Q6_K mixes quantize activations to Q8_K per 256, where a
# last-bit difference can flip a rounding: random-weight synth models have near-tied logits, so
# only splits checked to stay clear of a tie are used here (tests/test-tp.c checks the logits).
check_same() { # check_same MODEL WORKER-LIST ARGS...
    local model=$1 list=$2
    shift 2
    if ! run -m "$model" --workers "$list" "$@" > "$TMP/tp.txt" 2> "$TMP/tp.err"; then
        bad "$(basename "$model") $list $*: head failed: $(tail -2 "$TMP/tp.err")"
    elif cmp -s "$TMP/ref.txt" "$TMP/tp.txt"; then ok
    else bad "$(basename "$model") --workers $list $*: text differs from one device"; diff "$TMP/ref.txt" "$TMP/tp.txt" >&2
    fi
}
S=$SHARED/models
for model in "$S/stories260K.gguf" "$S/synth/synth-llama-Q8_0.gguf" "$S/synth/synth-qwen2-Q8_0.gguf" \
             "$S/synth/synth-qwen3-Q8_0.gguf"; do
    run -m "$model" > "$TMP/ref.txt" 2> /dev/null || bad "single-device run of $model"
    check_same "$model" "$(workers 1)"
    check_same "$model" "$(workers 1 2)" --tp-shares 3,1,2
    check_same "$model" "$(workers 1 2 3)"
    check_same "$model" "$(workers 1 2 3)" --tp-shares 3,1,2,1
    check_same "$model" "$(workers 1 2 3)" --allreduce ring
    check_same "$model" "$(workers 2 3)" --tp-shares auto
done
model=$S/synth/synth-llama-Q4_K_M-mix.gguf
run -m "$model" > "$TMP/ref.txt" 2> /dev/null || bad "single-device run of $model"
check_same "$model" "$(workers 1)"
check_same "$model" "$(workers 1 2 3)" --tp-shares 3,1,2,1

# ---- the slice cache: the second identical run sends nothing ---------------------------------------
sent() { sed -n 's/.*weight bytes sent: \([0-9]*\).*/\1/p' "$1" | tail -1; }
model=$S/stories260K.gguf
run -m "$model" --workers "$(workers 3 1)" --tp-shares 1,2,3 > /dev/null 2> "$TMP/s1.err" || bad "cache run 1"
run -m "$model" --workers "$(workers 3 1)" --tp-shares 1,2,3 > /dev/null 2> "$TMP/s2.err" || bad "cache run 2"
s1=$(sent "$TMP/s1.err")
s2=$(sent "$TMP/s2.err")
if [[ -n "$s1" && "$s1" -gt 0 && "$s2" == 0 ]]; then ok; else bad "weight bytes sent: first run '$s1', second run '$s2' (want > 0, then 0)"; fi

# ---- a worker killed mid-generation -----------------------------------------------------------------
big=$TMP/big.gguf
"$BIN" synth --shape custom --arch llama --n-embd 256 --n-layer 6 --n-head 8 --n-head-kv 4 --n-ff 1024 \
    --n-ctx 4096 --type Q8_0 -o "$big" > /dev/null 2>&1 || bad "synth for the kill test"
"$BIN" run -m "$big" -p "$PROMPT" --temp 0 -n 4000 -c 4096 --ignore-eos -t 1 --workers "$(workers 1 2 3)" \
    > "$TMP/kill.out" 2> "$TMP/kill.err" &
HEAD_PID=$!
for _ in $(seq 200); do # until generation is under way
    [[ $(stat -c %s "$TMP/kill.out" 2> /dev/null || echo 0) -gt 100 ]] && break
    sleep 0.05
done
kill -0 "$HEAD_PID" 2> /dev/null || bad "the head ended before the kill: $(tail -3 "$TMP/kill.err")"
killed_port=${WPORT[2]}
t0=$(date +%s%N)
kill -9 "${WPID[2]}"
wait "${WPID[2]}" 2> /dev/null
unset 'WPID[2]'
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
if grep -q "127.0.0.1:$killed_port" "$TMP/kill.err"; then ok
else bad "the head's message does not name the killed worker 127.0.0.1:$killed_port: $(tail -2 "$TMP/kill.err")"; fi
echo "head exited $ms ms after the kill: $(grep 'hearth run:' "$TMP/kill.err" | tail -1)"
# the others went back to waiting; a restarted worker joins them, and a new head works
start_worker 2 "$killed_port"
model=$S/synth/synth-llama-Q8_0.gguf
run -m "$model" > "$TMP/ref.txt" 2> /dev/null
check_same "$model" "$(workers 1 2 3)"

# ---- malformed input: the worker logs why, closes that connection, and keeps serving ---------------
if command -v python3 > /dev/null; then
    python3 - "${WPORT[1]}" > "$TMP/poke.txt" 2>&1 << 'EOF'
import socket, struct, sys
port = int(sys.argv[1])
def talk(data):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(data)
    got = b""
    try:
        while True:
            b = s.recv(4096)
            if not b: break
            got += b
    except socket.timeout:
        print("timeout: the worker kept the connection open")
    except ConnectionResetError:
        pass  # closed with our bytes unread: a reset instead of a FIN
    s.close()
    return got
# garbage
talk(b"GET / HTTP/1.1\r\nHost: worker\r\n\r\n")
# HELLO that speaks only protocol version 7: u32 vmin, u32 vmax, u64 caps, 32-byte tag, str device
dev = b"old head"
payload = struct.pack("<IIQ", 7, 7, 0) + bytes(32) + struct.pack("<I", len(dev)) + dev
frame = struct.pack("<IHHII", 0x48545248, 1, 1, len(payload), 1) + payload
reply = talk(frame)
print("reply:", reply[16 + 8:].decode("utf-8", "replace"))
EOF
    if grep -q "not supported" "$TMP/poke.txt" && ! grep -q timeout "$TMP/poke.txt"; then ok
    else bad "wrong-version HELLO: $(cat "$TMP/poke.txt")"; fi
    sleep 0.2
    if grep -q "magic" "$TMP/w1.log" && grep -q "versions 7..7" "$TMP/w1.log"; then ok
    else bad "worker 1 did not log why it closed the connections: $(tail -5 "$TMP/w1.log")"; fi
    check_same "$model" "$(workers 1 2 3)"
fi

# ---- workers stop cleanly on SIGTERM (and, under ASan, without leaks) --------------------------------
for i in 1 2 3; do
    kill -TERM "${WPID[$i]}"
    wait "${WPID[$i]}"
    rc=$?
    unset "WPID[$i]"
    if [[ $rc -eq 0 ]]; then ok; else bad "worker $i exited with $rc on SIGTERM: $(tail -3 "$TMP/w$i.log")"; fi
done

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
