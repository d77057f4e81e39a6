#!/usr/bin/env bash
# test-mem-kv: the KV cache grows into the memory budget (LIME's online adaptation, docs/memory.md).
# stories260K (1.1 MiB of weights) with -c 2048: the context's KV cache and scratch take 3.7 MiB,
# so a 4 MiB budget cannot keep everything at full length, but can while the cache is short. The run
# must start with every block pinned, re-plan as the positions in use pass each step, demote pins to
# streaming once the cache needs their room, and print exactly the text of the run without a budget.
# A budget that can never hold the whole cache beside the largest block is still refused at once.
set -u
source "$(dirname "$0")/lib-cli.sh"
ARGS=(-m "$M" -p "Once upon a time" -n 600 -c 2048 --temp 0 -t 1)

"$BIN" run "${ARGS[@]}" > "$TMP/ref.txt" 2> "$TMP/ref.err" || bad "run without a budget: $(tail -1 "$TMP/ref.err")"
"$BIN" run "${ARGS[@]}" --mem-budget 4M > "$TMP/kv.txt" 2> "$TMP/kv.err" || bad "run with 4M: $(tail -1 "$TMP/kv.err")"
if [[ -s "$TMP/ref.txt" ]] && cmp -s "$TMP/ref.txt" "$TMP/kv.txt"; then ok; else bad "the text with a 4M budget differs"; fi
# at first: the plan counts only the first positions and pins every block
if grep -Eq "planned for the first [0-9]+ positions .*, ([0-9]+) of \1 blocks pinned" "$TMP/kv.err"; then ok
else bad "the first plan does not pin every block: $(grep 'mem:' "$TMP/kv.err" | head -1)"; fi
# later: re-plans, at least one of which demotes pins (pinned A -> B blocks with B < A)
n=$(grep -c "re-planned for" "$TMP/kv.err")
if [[ $n -ge 2 ]]; then ok; else bad "$n re-plans over 600 positions of 2048 (steps of 256)"; fi
demoted=$(sed -nE 's/.*pinned ([0-9]+) -> ([0-9]+) blocks.*/\1 \2/p' "$TMP/kv.err" | awk '$2 < $1' | wc -l)
if [[ $demoted -ge 1 ]]; then ok; else bad "no re-plan demoted a pinned block"; fi
if grep -q "^mem: stream, budget 4.0 MiB" "$TMP/kv.err"; then ok; else bad "the run did not end streaming"; fi
# a short generation never passes the first step: no re-plan, same text
"$BIN" run "${ARGS[@]/600/50}" --mem-budget 4M > "$TMP/short.txt" 2> "$TMP/short.err"
"$BIN" run "${ARGS[@]/600/50}" > "$TMP/short-ref.txt" 2> /dev/null
if cmp -s "$TMP/short.txt" "$TMP/short-ref.txt" && ! grep -q "re-planned for" "$TMP/short.err"; then ok
else bad "a 50-token run re-planned or changed its text"; fi
# the whole cache can never fit: refused before anything runs
if ! "$BIN" run "${ARGS[@]}" --mem-budget 3M > /dev/null 2> "$TMP/small.err" && grep -q "too small" "$TMP/small.err"; then ok
else bad "a 3M budget was not refused: $(tail -1 "$TMP/small.err")"; fi

echo "test-mem-kv: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
