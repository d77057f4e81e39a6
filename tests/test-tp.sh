#!/usr/bin/env bash
# Tensor parallelism through the command line, on loopback: `hearth worker` processes and
# `hearth run --workers ...` heads.
# - head + 1, 2, 3 workers (even, uneven and measured shares; star and ring) print exactly the
#   single-device greedy text (`hearth run --temp 0 -n 24`) on stories260K and on synth models;
# - a second run with the same model and shares sends 0 weight bytes (the counter the head prints)
#   and the head reuses its own slice file (it wrote it on the first run);
# - a head under a memory budget smaller than its share streams it and prints the same text;
# - SIGKILL of a worker mid-generation: the head exits non-zero within 5 s naming that worker; the
#   restarted worker and the others then serve a new head;
# - garbage and a wrong-version HELLO sent to a worker: it logs the reason and keeps serving.
# Every process started here is killed on exit (trap), whatever happens.
# Env: HEARTH_BIN (the hearth binary), HEARTH_SHARED (the shared/ folder with models/).
set -u

source "$(dirname "$0")/lib-cluster.sh"

for i in 1 2 3; do start_worker $i; done

# ---- same tokens as one device --------------------------------------------------------------------
# Q8_0 and F32 weights: the partial sums round the same way as one device's (tests/test-shard.c), so
# any split gives the same text. Q4_K/Q6_K mixes quantize activations to Q8_K per 256, where a
# last-bit difference can flip a rounding: random-weight synth models have near-tied logits, so
# only splits checked to stay clear of a tie are used here (tests/test-tp.c checks the logits).
S=$SHARED/models
for model in "$S/stories260K.gguf" "$S/synth/synth-llama-Q8_0.gguf" "$S/synth/synth-qwen2-Q8_0.gguf" \
             "$S/synth/synth-qwen3-Q8_0.gguf"; do
    run -m "$model" > "$TMP/ref.txt" 2> /dev/null || bad "single-device run of $model"
    check_same "$model" "$(workers 1)" --tp-shares equal
    check_same "$model" "$(workers 1 2)" --tp-shares 3,1,2
    check_same "$model" "$(workers 1 2 3)" --tp-shares equal
    check_same "$model" "$(workers 1 2 3)" --tp-shares 3,1,2,1
    check_same "$model" "$(workers 1 2 3)" --allreduce ring
    check_same "$model" "$(workers 2 3)" --tp-shares auto
done
model=$S/synth/synth-llama-Q4_K_M-mix.gguf
run -m "$model" > "$TMP/ref.txt" 2> /dev/null || bad "single-device run of $model"
check_same "$model" "$(workers 1)" --tp-shares equal
check_same "$model" "$(workers 1 2 3)" --tp-shares 3,1,2,1
# a head whose share does not fit its budget streams it (its rows of the row-sliced tensors)
model=$S/synth/synth-llama-Q8_0.gguf
run -m "$model" > "$TMP/ref.txt" 2> /dev/null || bad "single-device run of $model"
check_same "$model" "$(workers 1 2)" --tp-shares equal --mem-budget 2M -c 64 -b 8
if grep -q "mem: stream" "$TMP/cl.err"; then ok; else bad "the TP head did not stream under --mem-budget 2M: $(grep mem: "$TMP/cl.err")"; fi
# its share from the slice file's mapping, in the file's layout; in its own cache folder
check_same "$model" "$(workers 1 2)" --tp-shares equal --mmap --no-repack --cache "$TMP/headcache"
if grep -q "tp: head: wrote its share .* to $TMP/headcache/" "$TMP/cl.err"; then ok; else bad "the head's --cache: $(grep 'tp: head' "$TMP/cl.err")"; fi

# ---- the slice cache: the second identical run sends nothing ---------------------------------------
model=$S/stories260K.gguf
run -m "$model" --workers "$(workers 3 1)" --tp-shares 1,2,3 > /dev/null 2> "$TMP/s1.err" || bad "cache run 1"
run -m "$model" --workers "$(workers 3 1)" --tp-shares 1,2,3 > /dev/null 2> "$TMP/s2.err" || bad "cache run 2"
s1=$(sent "$TMP/s1.err")
s2=$(sent "$TMP/s2.err")
if [[ -n "$s1" && "$s1" -gt 0 && "$s2" == 0 ]]; then ok; else bad "weight bytes sent: first run '$s1', second run '$s2' (want > 0, then 0)"; fi
if grep -q "tp: head: wrote its share" "$TMP/s1.err" && grep -q "tp: head: its share .* from " "$TMP/s2.err" &&
    ! grep -q "tp: head: wrote" "$TMP/s2.err"; then ok
else bad "the head's own slice file: first run '$(grep 'tp: head' "$TMP/s1.err")', second '$(grep 'tp: head' "$TMP/s2.err")'"; fi

# ---- a worker killed mid-generation -----------------------------------------------------------------
big=$TMP/big.gguf
"$BIN" synth --shape custom --arch llama --n-embd 256 --n-layer 6 --n-head 8 --n-head-kv 4 --n-ff 1024 \
    --n-ctx 4096 --type Q8_0 -o "$big" > /dev/null 2>&1 || bad "synth for the kill test"
check_kill 2 "$big" "$(workers 1 2 3)" --tp-shares equal
# the others went back to waiting; a restarted worker joins them, and a new head works
start_worker 2 "$killed_port"
model=$S/synth/synth-llama-Q8_0.gguf
run -m "$model" > "$TMP/ref.txt" 2> /dev/null
check_same "$model" "$(workers 1 2 3)" --tp-shares equal

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
frame = struct.pack("<IHHII", 0x48545248, 3, 1, len(payload), 1) + payload  # header: this build's version (3)
reply = talk(frame)
print("reply:", reply[16 + 8:].decode("utf-8", "replace"))
EOF
    if grep -q "not supported" "$TMP/poke.txt" && ! grep -q timeout "$TMP/poke.txt"; then ok
    else bad "wrong-version HELLO: $(cat "$TMP/poke.txt")"; fi
    sleep 0.2
    if grep -q "magic" "$TMP/w1.log" && grep -q "versions 7..7" "$TMP/w1.log"; then ok
    else bad "worker 1 did not log why it closed the connections: $(tail -5 "$TMP/w1.log")"; fi
    check_same "$model" "$(workers 1 2 3)" --tp-shares equal
fi

# ---- workers stop cleanly on SIGTERM (and, under ASan, without leaks) --------------------------------
for i in 1 2 3; do stop_worker $i; done

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
