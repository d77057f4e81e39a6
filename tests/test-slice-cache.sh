#!/usr/bin/env bash
# A cached slice file with a corrupt data byte, or whose metadata no longer matches the plan (a hearth.slice.* value, a
# hyper-parameter, a tensor's shape) is treated as corrupt data is: that run fails saying so, the file
# is removed, and the next run re-sends the share and gives the one-device text. The head's own slice
# file (tensor parallel) is checked the same way and written again at once. Loopback only.
# Env: HEARTH_BIN, HEARTH_SHARED (see lib-cluster.sh).
set -u
source "$(dirname "$0")/lib-cluster.sh"
command -v python3 > /dev/null || { echo "python3 not found; skipping"; exit 77; }
MUT="python3 $(dirname "$0")/gguf-mutate.py"
M="$SHARED/models/stories260K.gguf"

run -m "$M" > "$TMP/ref.txt" 2> /dev/null || { echo "one-device run failed"; exit 1; }
start_worker 1

# damage MODE ARGS...: fill the cache, change the cached file, then: a failed run naming the cache
# (or, at worst, a correct one), the file gone, and a run that re-sends and matches
damage() {
    local mode=$1
    shift
    rm -rf "$TMP/c1"
    check_same "$M" "$(workers 1)" $mode
    local f
    f=$(find "$TMP/c1" -type f -name '*.gguf' | head -1)
    [[ -n "$f" ]] || { bad "$*: no cached slice file"; return; }
    $MUT "$f" "$@" > /dev/null || { bad "could not change $*"; return; }
    if run -m "$M" --workers "$(workers 1)" $mode > "$TMP/d.txt" 2> "$TMP/d.err"; then
        cmp -s "$TMP/ref.txt" "$TMP/d.txt" && ok || bad "$mode $*: a changed cache file gave other text"
    elif grep -q "removed it" "$TMP/d.err"; then ok
    else bad "$mode $*: $(grep 'hearth run' "$TMP/d.err" | tail -1)"; fi
    if [[ -e "$f" ]]; then bad "$mode $*: the inconsistent cache file is still there"; else ok; fi
    check_same "$M" "$(workers 1)" $mode
    s=$(sent "$TMP/cl.err")
    [[ -n "$s" && "$s" -gt 0 ]] && ok || bad "$mode $*: the share was not re-sent ($s bytes)"
}

damage "--tp-shares equal" flip attn_q           # corrupt data: found by its hash (as before issue 32)
damage "--tp-shares equal" kv hearth.slice.ff_begin 1
damage "--tp-shares equal" kv hearth.slice.kv_begin 1
damage "--tp-shares equal" kv llama.rope.freq_base 1000
damage "--tp-shares equal" kv llama.attention.layer_norm_rms_epsilon 0.01
damage "--tp-shares equal" swap-dims ffn_gate
damage --pp kv llama.block_count 1
damage --pp kv llama.embedding_length 8

# the head's own slice file (tensor parallel): one that no longer matches its share is written again
# in the same run, and the text is the one-device text
damage_head() {
    rm -rf "$XDG_CACHE_HOME"
    check_same "$M" "$(workers 1)" --tp-shares equal
    local f
    f=$(find "$XDG_CACHE_HOME" -type f -name '*.gguf' | head -1)
    [[ -n "$f" ]] || { bad "head: no slice file of its own"; return; }
    $MUT "$f" "$@" > /dev/null || { bad "could not change $*"; return; }
    check_same "$M" "$(workers 1)" --tp-shares equal
    grep -q "rewriting" "$TMP/cl.err" && ok || bad "head $*: its changed slice file was not rewritten"
}
damage_head kv llama.attention.layer_norm_rms_epsilon 0.01
damage_head kv hearth.slice.ff_begin 1
damage_head flip attn_q
stop_worker 1

echo "test-slice-cache: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
