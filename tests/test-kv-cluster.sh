#!/usr/bin/env bash
# test-kv-cluster: the KV cache grows into a *worker's* memory budget during a long generation (LIME's
# online adaptation, docs/memory.md "The KV cache grows into the budget", on cluster devices).
# stories260K with -c 2048: a worker that holds every layer (pipeline, --layer-windows 0,5) has 0.9 MiB of
# weights and 3.7 MiB of KV cache and scratch at full length; with a 3.85M budget it pins every block
# while the cache is short and must demote pins once 800 generated tokens fill it past 768 positions.
# A tensor-parallel worker (half the KV heads) under 3.4M re-plans the same way. Each run must print
# the single-device text; the worker logs its re-plans and reports them (--stats-json mem_replans).
# The head's own pipeline stage (3 layers and the output head) under 3.5M re-plans the same way.
# Env: HEARTH_BIN, HEARTH_SHARED. Every process started here is killed on exit.
set -u
source "$(dirname "$0")/lib-cluster.sh"

M=$SHARED/models/stories260K.gguf
ARGS=(-m "$M" -p "$PROMPT" --temp 0 -n 800 -c 2048 -t 1)
"$BIN" run "${ARGS[@]}" > "$TMP/ref.txt" 2> "$TMP/ref.err" || bad "single-device run: $(tail -1 "$TMP/ref.err")"

# replans LOG STATS DEVICE: the worker's log has >= 2 re-plans and its stats report as many
replans() {
    local n
    n=$(grep -c "re-planned for" "$1")
    if [[ $n -ge 2 ]]; then ok; else bad "$n re-plans logged by the worker over 800 positions (steps of 256)"; fi
    if python3 -c "import json,sys; d=json.load(open(sys.argv[1])); w=d['devices'][1]; sys.exit(w['mem_replans'] != int(sys.argv[2]))" \
        "$2" "$n"; then ok; else bad "--stats-json does not report the worker's $n re-plans"; fi
}

# ---- pipeline: the worker holds every layer -------------------------------------------------------------
start_worker 1 0 --mem-budget 3.85M
"$BIN" run "${ARGS[@]}" --workers "$(workers 1)" --pp --layer-windows 0,5 --stats-json "$TMP/pp.json" \
    > "$TMP/pp.txt" 2> "$TMP/pp.err" || bad "pipeline run: $(tail -1 "$TMP/pp.err")"
if [[ -s "$TMP/ref.txt" ]] && cmp -s "$TMP/ref.txt" "$TMP/pp.txt"; then ok; else bad "the pipeline's text differs from one device"; fi
if grep -Eq "planned for the first [0-9]+ positions .*, ([0-9]+) of \1 blocks pinned" "$TMP/w1.log"; then ok
else bad "the worker's first plan does not pin every block: $(grep 'mem:' "$TMP/w1.log" | head -1)"; fi
replans "$TMP/w1.log" "$TMP/pp.json"
demoted=$(sed -nE 's/.*pinned ([0-9]+) -> ([0-9]+) blocks.*/\1 \2/p' "$TMP/w1.log" | awk '$2 < $1' | wc -l)
if [[ $demoted -ge 1 ]]; then ok; else bad "no re-plan on the worker demoted a pinned block"; fi
stop_worker 1

# ---- tensor parallel: the worker's share of the KV heads --------------------------------------------------
start_worker 2 0 --mem-budget 3.4M
"$BIN" run "${ARGS[@]}" --workers "$(workers 2)" --tp-shares equal --stats-json "$TMP/tp.json" \
    > "$TMP/tp.txt" 2> "$TMP/tp.err" || bad "tensor-parallel run: $(tail -1 "$TMP/tp.err")"
if cmp -s "$TMP/ref.txt" "$TMP/tp.txt"; then ok; else bad "the tensor-parallel text differs from one device"; fi
replans "$TMP/w2.log" "$TMP/tp.json"

# ---- the head's own stage: 3 layers and the output head under --mem-budget 3.5M -------------------------
"$BIN" run "${ARGS[@]}" --workers "$(workers 2)" --pp --layer-windows 3,2 --mem-budget 3.5M \
    > "$TMP/hd.txt" 2> "$TMP/hd.err" || bad "pipeline run with a head budget: $(tail -1 "$TMP/hd.err")"
if cmp -s "$TMP/ref.txt" "$TMP/hd.txt"; then ok; else bad "the text with a head budget differs from one device"; fi
demoted=$(sed -nE 's/.*pinned ([0-9]+) -> ([0-9]+) blocks.*/\1 \2/p' "$TMP/hd.err" | awk '$2 < $1' | wc -l)
if [[ $demoted -ge 1 ]]; then ok; else bad "no re-plan on the head demoted a pinned block: $(grep 'mem:' "$TMP/hd.err" | tail -1)"; fi
stop_worker 2

echo "test-kv-cluster: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
