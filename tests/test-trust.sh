#!/usr/bin/env bash
# Issue 29's cluster key and encrypted links, with real `hearth worker` processes on loopback:
# - head and workers with the same key (--key, or the default file) give the single-device greedy
#   text, tensor parallel and pipeline;
# - a head with the wrong key, a head without a key, a keyed head at a keyless worker: refused, with a
#   clear message on both sides; a forged and a truncated handshake from a raw socket: refused and
#   logged; the workers go on serving the honest head;
# - a worker that would listen beyond loopback without a key refuses to start; --insecure starts it
#   with a warning;
# - the traffic (HEARTH_NET_CAPTURE: every byte each process sends) holds no plaintext hidden state:
#   the float32 bytes of the BOS token's embedding row (read from the GGUF by tests/gguf-row.py),
#   which the head sends to every worker in its first FORWARD, are found in a plaintext run's capture
#   and not in an encrypted run's.
# Env: HEARTH_BIN, HEARTH_SHARED.
set -u

source "$(dirname "$0")/lib-cluster.sh"
export XDG_CONFIG_HOME=$TMP/cfg # no default key unless a case makes one
model=$SHARED/models/stories260K.gguf
"$BIN" keygen -o "$TMP/k1" > /dev/null && "$BIN" keygen -o "$TMP/k2" > /dev/null || { echo "keygen failed"; exit 1; }

start_worker 1 0 --key "$TMP/k1"
start_worker 2 0 --key "$TMP/k1"
start_worker 3 0
run -m "$model" > "$TMP/ref.txt" 2> /dev/null || bad "single-device run"

# ---- the honest cluster, encrypted ------------------------------------------------------------------
check_same "$model" "$(workers 1 2)" --tp-shares equal --key "$TMP/k1"
check_same "$model" "$(workers 1 2)" --pp --key "$TMP/k1"
check_same "$model" "$(workers 1 2)" --allreduce ring --key "$TMP/k1"
if grep -q "links are authenticated and encrypted" "$TMP/cl.err"; then ok; else bad "the head did not say its links are encrypted"; fi

# refused: REFUSE CASE WORKER HEAD_WANT WORKER_WANT ARGS...: the head fails naming the reason, and the
# worker's log gains a line with its own reason
refused() {
    local what=$1 w=$2 head_want=$3 worker_want=$4
    shift 4
    local before
    before=$(wc -l < "$TMP/w$w.log")
    if run -m "$model" --workers "$(workers "$w")" --tp-shares equal "$@" > /dev/null 2> "$TMP/r.err"; then
        bad "$what: the head ran"
    elif grep -q "$head_want" "$TMP/r.err"; then ok
    else bad "$what: the head's message lacks '$head_want': $(tail -1 "$TMP/r.err")"; fi
    local found=1
    for _ in $(seq 50); do # the worker logs after it has answered: give it time
        tail -n +$((before + 1)) "$TMP/w$w.log" | grep -q "$worker_want" && { found=0; break; }
        sleep 0.1
    done
    if [[ $found -eq 0 ]]; then ok
    else bad "$what: worker $w's log lacks '$worker_want': $(tail -2 "$TMP/w$w.log")"; fi
}
refused "wrong key" 1 "not the same cluster key" "does not hold this cluster key" --key "$TMP/k2"
refused "no key at the head" 1 "needs the cluster key" "plaintext HELLO refused"
refused "no key at the worker" 3 "has no cluster key" "no cluster key (--key): refused" --key "$TMP/k1"
# a key that is not a key file
printf 'not a key\n' > "$TMP/bad.key"
if run -m "$model" --workers "$(workers 1)" --key "$TMP/bad.key" > /dev/null 2> "$TMP/r.err"; then bad "a bad key file was taken"
elif grep -q "not a hearth cluster key" "$TMP/r.err"; then ok; else bad "bad key file: $(tail -1 "$TMP/r.err")"; fi
# a forged handshake (random bytes where message 1 goes) and a truncated one, from a raw socket: the
# worker answers ERROR to the first, logs both and goes on
before=$(wc -l < "$TMP/w1.log")
python3 - "${WPORT[1]}" > "$TMP/forge.txt" 2>&1 << 'PY'
import os, socket, struct, sys
port = int(sys.argv[1])
s = socket.create_connection(("127.0.0.1", port), timeout=5)
s.sendall(struct.pack("<IHHII", 0x48545248, 3, 0x7f00, 48, 0) + os.urandom(48))
h = s.recv(16)
print("reply type", struct.unpack("<IHHII", h)[2] if len(h) == 16 else None)
s.close()
s = socket.create_connection(("127.0.0.1", port), timeout=5)
s.sendall(struct.pack("<IHHII", 0x48545248, 3, 0x7f00, 48, 0) + os.urandom(20))
s.close()
PY
if grep -q "reply type 3" "$TMP/forge.txt"; then ok; else bad "a forged handshake got no ERROR: $(cat "$TMP/forge.txt")"; fi
for _ in $(seq 50); do [[ $(tail -n +$((before + 1)) "$TMP/w1.log" | grep -c "closed") -ge 2 ]] && break; sleep 0.1; done
if tail -n +$((before + 1)) "$TMP/w1.log" | grep -q "does not hold this cluster key" &&
    tail -n +$((before + 1)) "$TMP/w1.log" | grep -q "middle"; then ok
else bad "forged / truncated handshake not logged: $(tail -n +$((before + 1)) "$TMP/w1.log")"; fi
# the workers still serve the honest head, and a plaintext pair still works
check_same "$model" "$(workers 1 2)" --tp-shares equal --key "$TMP/k1"
check_same "$model" "$(workers 3)" --tp-shares equal

# ---- the default key file ---------------------------------------------------------------------------
mkdir -p "$TMP/cfg/hearth" && cp "$TMP/k1" "$TMP/cfg/hearth/cluster.key" && chmod 600 "$TMP/cfg/hearth/cluster.key"
start_worker 4 0
check_same "$model" "$(workers 4 1)" --tp-shares equal
if grep -q "links are authenticated" "$TMP/cl.err" && grep -q "links are authenticated" "$TMP/w4.log"; then ok
else bad "the default key file was not used"; fi
rm "$TMP/cfg/hearth/cluster.key"

# ---- beyond loopback --------------------------------------------------------------------------------
if "$BIN" worker --listen 0.0.0.0:0 --cache "$TMP/c9" -t 1 > /dev/null 2> "$TMP/ins.err"; then bad "a keyless worker listened on 0.0.0.0"
elif grep -q "refusing to listen on 0.0.0.0:0 without a cluster key" "$TMP/ins.err"; then ok
else bad "--insecure refusal: $(cat "$TMP/ins.err")"; fi
start_worker 5 0 # (on loopback: fine without a key) then the same on any address with --insecure:
"$BIN" worker --listen 0.0.0.0:0 --cache "$TMP/c10" -t 1 --insecure > "$TMP/w10.out" 2> "$TMP/w10.log" &
WPID[10]=$!
for _ in $(seq 100); do grep -q listening "$TMP/w10.out" && break; sleep 0.05; done
if grep -q listening "$TMP/w10.out" && grep -q "insecure" "$TMP/w10.log"; then ok; else bad "--insecure worker: $(cat "$TMP/w10.log")"; fi
stop_worker 10
"$BIN" worker --listen 0.0.0.0:0 --cache "$TMP/c11" -t 1 --key "$TMP/k1" > "$TMP/w11.out" 2> "$TMP/w11.log" &
WPID[11]=$!
for _ in $(seq 100); do grep -q listening "$TMP/w11.out" && break; sleep 0.05; done
if grep -q listening "$TMP/w11.out"; then ok; else bad "a keyed worker on 0.0.0.0: $(cat "$TMP/w11.log")"; fi
stop_worker 11

# ---- what the wire carries --------------------------------------------------------------------------
row=$(python3 "$(dirname "$0")/gguf-row.py" "$model" token_embd.weight 1) || { bad "gguf-row.py"; row=""; }
# capture MODE KEYARGS...: workers 6 and 7 and a head, each process's sent bytes in its own file
capture() {
    local mode=$1
    shift
    HEARTH_NET_CAPTURE=$TMP/cap-$mode.w6 start_worker 6 0 "$@"
    HEARTH_NET_CAPTURE=$TMP/cap-$mode.w7 start_worker 7 0 "$@"
    HEARTH_NET_CAPTURE=$TMP/cap-$mode.head check_same "$model" "$(workers 6 7)" --tp-shares equal "$@"
    HEARTH_NET_CAPTURE=$TMP/cap-$mode.head check_same "$model" "$(workers 6 7)" --pp "$@"
    stop_worker 6
    stop_worker 7
}
capture plain
capture enc --key "$TMP/k1"
has_row() { python3 -c "import sys; d=b''.join(open(f,'rb').read() for f in sys.argv[2:]); sys.exit(0 if bytes.fromhex(sys.argv[1]) in d else 1)" "$row" "$@"; }
if [[ -n "$row" ]]; then
    if has_row "$TMP"/cap-plain.*; then ok; else bad "the plaintext capture lacks the embedding row: the check cannot see hidden states"; fi
    if has_row "$TMP"/cap-enc.*; then bad "the encrypted capture holds a plaintext hidden state"; else ok; fi
    # and not even a quarter of it (16 floats)
    row=${row:0:128}
    if has_row "$TMP"/cap-enc.*; then bad "the encrypted capture holds 16 plaintext floats of a hidden state"; else ok; fi
    echo "captured: plaintext $(cat "$TMP"/cap-plain.* | wc -c) bytes (with the weight slices), encrypted $(cat "$TMP"/cap-enc.* | wc -c) bytes"
fi

for i in 1 2 3 4 5; do stop_worker $i; done
echo "test-trust: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
