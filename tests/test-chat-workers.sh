#!/usr/bin/env bash
# test-chat-workers: `hearth chat --workers` answers with the text of the one-device chat — tensor
# parallel, pipeline, and the planner's own plan (no plan flag) over loopback workers. Two turns, so
# that the second reuses the first's KV cache on the cluster (evaluation from a position inside it).
# A plan flag without --workers is refused. Every worker started is stopped (lib-cluster.sh).
set -u
source "$(dirname "$0")/lib-cluster.sh"
MSGS=$'Once upon a time there was a cat.\nWhat did the cat do next?\n'
chat() { printf '%s' "$MSGS" | timeout 120 "$BIN" chat --temp 0 -n 24 -t 1 -c 512 "$@"; }

start_worker 1
start_worker 2
# The head and the workers share one profile cache here (one machine, one XDG_CACHE_HOME): filled once
# with the standard types, every device reads the same figures and the planner splits TP evenly. Left
# to measure the model's types at once on the same cores, they differ by chance, and an uneven split
# of the synth model's near-tied logits can flip a token (--tp-shares 0.4,0.6 does, with any build:
# the TP sum order, not the planner).
"$BIN" profile -t 1 > /dev/null 2>&1 || bad "hearth profile failed"
# stories260K over two workers; a synth model over one: its random weights leave near-tied logits,
# and a three-way split of them flips one (`hearth run` gives that same other text: not chat's doing)
for case in "stories260K.gguf 1 2" "synth/synth-llama-Q8_0.gguf 1"; do
    read -r m ws <<< "$case"
    M=$SHARED/models/$m
    [[ -f "$M" ]] || { echo "$M not found; skipping it"; continue; }
    name=$(basename "$M")
    chat -m "$M" > "$TMP/ref.txt" 2> "$TMP/ref.err" || { bad "$name: one-device chat failed: $(tail -1 "$TMP/ref.err")"; continue; }
    # the reference must hold two answers (an empty chat would match anything)
    if [[ $(grep -c '^> ' "$TMP/ref.txt") -ge 2 && $(wc -c < "$TMP/ref.txt") -gt 20 ]]; then ok
    else bad "$name: the one-device chat gave no answers: $(cat "$TMP/ref.txt")"; fi
    for mode in "--tp-shares equal" "--pp" ""; do
        # shellcheck disable=SC2086 # (word splitting wanted)
        if ! chat -m "$M" --workers "$(workers $ws)" $mode > "$TMP/cl.txt" 2> "$TMP/cl.err"; then
            bad "$name --workers ${mode:-(planner)}: chat failed: $(tail -2 "$TMP/cl.err")"
        # (the planner may choose this device alone or fewer workers for so small a model: its case
        # checks the plan line below, not worker 1)
        elif [[ -n "$mode" ]] && ! grep -q "127.0.0.1:${WPORT[1]}" "$TMP/cl.err"; then bad "$name $mode: no sign of worker 1 in the log"
        elif cmp -s "$TMP/ref.txt" "$TMP/cl.txt"; then ok
        else bad "$name --workers ${mode:-(planner)}: the reply differs from one device"; diff "$TMP/ref.txt" "$TMP/cl.txt" >&2
        fi
        if [[ -z "$mode" ]]; then
            if grep -q "^plan: " "$TMP/cl.err"; then ok; else bad "$name: no plan line without plan flags"; fi
        fi
    done
done
# a plan flag needs --workers
printf 'hi\n' | "$BIN" chat -m "$SHARED/models/stories260K.gguf" --pp > /dev/null 2> "$TMP/pp.err"
rc=$?
if [[ $rc -eq 2 ]] && grep -q -- "--pp needs --workers" "$TMP/pp.err"; then ok; else bad "chat --pp without --workers: exit $rc"; fi
stop_worker 1
stop_worker 2

echo "test-chat-workers: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
