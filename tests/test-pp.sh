#!/usr/bin/env bash
# Pipelines (--pp, piped ring) through the command line, on loopback: `hearth worker` processes and
# `hearth run --workers ... --pp --layer-windows ...` heads.
# - 2, 3 and 4 devices, one round and several rounds per token (windows dealt round the ring), a head
#   that owns no layers, the default split: exactly the single-device greedy text on stories260K
#   (5 layers), on the synth models (2 layers) and on a 6-layer synth model; the head's weights loaded
#   and packed when they fit, as one device's are;
# - memory budgets below what each device holds (streaming, with and without prefetch) on the workers
#   and the head: the same text, and --stats-json reports resident bytes, disk reads and blocked time;
# - the slice cache: a second identical run sends 0 weight bytes;
# - impossible flags (also --pp without workers): a clear message and a non-zero exit;
# - SIGKILL of a middle stage mid-generation: the head exits non-zero within 5 s naming it.
# Every process started here is killed on exit (trap), whatever happens.
# Env: HEARTH_BIN (the hearth binary), HEARTH_SHARED (the shared/ folder with models/).
set -u

source "$(dirname "$0")/lib-cluster.sh"

for i in 1 2 3; do start_worker $i; done
S=$SHARED/models

# ---- same tokens as one device: every layer runs whole on one device, with the same kernels ----------
model=$S/stories260K.gguf
run -m "$model" > "$TMP/ref.txt" 2> /dev/null || bad "single-device run of $model"
check_same "$model" "$(workers 1)" --pp                            # default: one round, even split
check_same "$model" "$(workers 1)" --pp --layer-windows 3,2        # one round
check_same "$model" "$(workers 1)" --pp --layer-windows 1,1        # 2 trips round the ring
check_same "$model" "$(workers 1 2)" --pp --layer-windows 1,2,1    # 2 trips, a worker ends the layers
check_same "$model" "$(workers 1 2)" --pp --layer-windows 0,1,1    # the head: embedding and output only
check_same "$model" "$(workers 3 1 2)" --pp --layer-windows 1,1,1,1
for model in "$S/synth/synth-llama-Q8_0.gguf" "$S/synth/synth-qwen2-Q8_0.gguf" "$S/synth/synth-qwen3-Q8_0.gguf" \
             "$S/synth/synth-llama-Q4_K_M-mix.gguf"; do
    run -m "$model" > "$TMP/ref.txt" 2> /dev/null || bad "single-device run of $model"
    check_same "$model" "$(workers 1)" --pp --layer-windows 1,1
    # the head's window and output head fit its budget: loaded and packed, as on one device
    if grep -q "weights: .* loaded into memory (.* packed" "$TMP/cl.err"; then ok
    else bad "$(basename "$model"): the pipeline's head did not load its weights: $(grep -E 'weights|mem:' "$TMP/cl.err" | tail -2)"; fi
    check_same "$model" "$(workers 1 2)" --pp --layer-windows 0,1,1
done
six=$TMP/six.gguf
"$BIN" synth --shape custom --arch llama --n-embd 256 --n-layer 6 --n-head 8 --n-head-kv 4 --n-ff 1024 \
    --n-ctx 4096 --type Q8_0 -o "$six" > /dev/null 2>&1 || bad "synth of a 6-layer model"
run -m "$six" > "$TMP/ref.txt" 2> /dev/null || bad "single-device run of $six"
check_same "$six" "$(workers 1 2)" --pp --layer-windows 1,1,1      # 2 trips round 3 devices
check_same "$six" "$(workers 1 2 3)" --pp --layer-windows 2,1,1,1  # the last window cut short

# ---- memory budgets smaller than the weights each device holds ---------------------------------------
# the 6-layer model is 2.3 MiB of layers per device here: the workers get 1.5M (KV cache and scratch
# included) and stream; the head too, with --mem-budget
for i in 1 2; do stop_worker $i; start_worker $i 0 --mem-budget 1.5M; done
start_worker 4 0 --mem-budget 1.5M --no-prefetch
check_same "$six" "$(workers 1 2)" --pp --layer-windows 1,1,1 -c 64 -b 8 --mem-budget 2M \
    --stats-json "$TMP/stats.json"
if grep -q "streaming" "$TMP/w1.log" && grep -q "mem: stream" "$TMP/w1.log"; then ok
else bad "worker 1 did not stream under its budget: $(grep mem: "$TMP/w1.log" | tail -2)"; fi
python3 - "$TMP/stats.json" > "$TMP/stats.txt" 2>&1 << 'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["generated_tokens"] > 0 and d["ms_per_token"] > 0, d
devs = d["devices"]
assert [x["name"] for x in devs][0] == "head" and len(devs) == 3, [x["name"] for x in devs]
for x in devs:
    assert x["budget_bytes"] > 0 and x["resident_peak_bytes"] > 0, x["name"]
    assert len(x["samples"]) == d["generated_tokens"] + 1, (x["name"], len(x["samples"]))
    assert x["blocks"]["attn"]["n"] > 0 and x["blocks"]["ffn"]["compute_ms_per_block"] > 0, x["name"]
    # streamed: FFN blocks loaded again for every token (the loader's own count; resident bytes, from
    # mincore, depend on what the kernel's readahead brings back, so they are reported, not asserted)
    assert x["stream_bytes_per_token"] > 0 and x["room_bytes"] > 0, x["name"]
    assert x["blocks"]["ffn"]["loads"] >= d["generated_tokens"], x["name"]
    assert x["disk_read_bytes_per_token"] is None or x["disk_read_bytes_per_token"] > 0, x["name"]
print("ok", [(x["name"], x["n_layers"], x["disk_read_bytes_per_token"]) for x in devs])
PY
if grep -q "^ok" "$TMP/stats.txt"; then ok; else bad "--stats-json: $(tail -3 "$TMP/stats.txt")"; fi
check_same "$six" "$(workers 4 2)" --pp --layer-windows 1,1,1 -c 64 -b 8 --mem-budget 2M --no-prefetch
# plain mmap (--mem-budget off): no budget, but the figures are still observed
start_worker 5 0 --mem-budget off
check_same "$six" "$(workers 5 3)" --pp --layer-windows 1,1,1 --mem-budget off --stats-json "$TMP/mmap.json"
python3 - "$TMP/mmap.json" > "$TMP/mmap.txt" 2>&1 << 'PY'
import json, sys
d = json.load(open(sys.argv[1]))
devs = d["devices"]
assert devs[0]["budget_bytes"] == 0 and devs[0]["resident_peak_bytes"] > 0, devs[0]
assert devs[1]["budget_bytes"] == 0 and devs[1]["resident_peak_bytes"] > 0, devs[1]
print("ok")
PY
if grep -q "^ok" "$TMP/mmap.txt"; then ok; else bad "--mem-budget off figures: $(tail -3 "$TMP/mmap.txt")"; fi
if grep -q "no prefetch" "$TMP/w4.log"; then ok; else bad "worker 4 did not run without prefetch"; fi

for i in 1 2; do stop_worker $i; start_worker $i; done   # no budgets from here on

# ---- the slice cache: the second identical run sends nothing -----------------------------------------
model=$S/stories260K.gguf
run -m "$model" --workers "$(workers 3 1)" --pp --layer-windows 1,2,1 > /dev/null 2> "$TMP/s1.err" || bad "cache run 1"
run -m "$model" --workers "$(workers 3 1)" --pp --layer-windows 1,2,1 > /dev/null 2> "$TMP/s2.err" || bad "cache run 2"
s1=$(sent "$TMP/s1.err")
s2=$(sent "$TMP/s2.err")
if [[ -n "$s1" && "$s1" -gt 0 && "$s2" == 0 ]]; then ok; else bad "weight bytes sent: first run '$s1', second run '$s2' (want > 0, then 0)"; fi

# ---- impossible flags --------------------------------------------------------------------------------
expect_error "needs --pp" --workers "$(workers 1)" --layer-windows 2,3
expect_error "needs --workers" --pp
expect_error "2 sizes for 3 devices" --workers "$(workers 1 2)" --pp --layer-windows 2,3
expect_error "gets no layers" --workers "$(workers 1 2)" --pp --layer-windows 5,1,1
expect_error "whole numbers" --workers "$(workers 1)" --pp --layer-windows 1.5,2
expect_error "not --pp" --workers "$(workers 1)" --pp --tp-shares 1,1
expect_error "must be positive" --workers "$(workers 1)" --pp --layer-windows 0,0

# ---- a middle stage killed mid-generation -------------------------------------------------------------
check_kill 1 "$six" "$(workers 2 1 3)" --pp --layer-windows 1,1,1,1

for i in 2 3 4 5; do stop_worker $i; done

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
