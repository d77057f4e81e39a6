#!/usr/bin/env bash
# bench/recover.sh — issue 29: the time from a worker's failure to the next token, on the testbed.
# The head on d0, workers on d1 and d2 of a testbed that is up (tools/testbed up home4); worker d1
# fails with HEARTH_TEST_FAULT=ACTION:forward:N (it raises SIGKILL or SIGSTOP on itself as the N-th
# forward pass reaches it, so the failure starts with that pass); the head logs how long that call took
# from its start to its result and where the time went (src/cluster/recover.c). Each case is run REPS
# times; the figures are the head's lines, and the median of the totals.
# Usage: sudo bench/recover.sh BUILD MODEL [INSTANCE [REPS]]    (docs/benchmarks.md, "Issue 29: recovery")
set -u
BIN=$(realpath "$1")
[[ -d "$BIN" ]] && BIN=$BIN/hearth
MODEL=$(realpath "$2")
INST=${3:-rc29}
REPS=${4:-3}
SRC=$(cd "$(dirname "$0")/.." && pwd)
TB=("$SRC/tools/testbed" --instance "$INST")
W1=$("${TB[@]}" addr d1):7070
W2=$("${TB[@]}" addr d2):7070
OUT=$(mktemp -d /tmp/recover-bench.XXXXXX)
trap '"${TB[@]}" kill d1 > /dev/null 2>&1; "${TB[@]}" kill d2 > /dev/null 2>&1; rm -rf "$OUT"' EXIT

worker() { # worker DEVICE FAULT
    "${TB[@]}" exec "$1" -- env HEARTH_TEST_FAULT="$2" "$BIN" worker --listen 0.0.0.0:7070 --cache "$OUT/c-$1" -t 1 \
        > /dev/null 2>> "$OUT/$1.log" &
    sleep 0.5
}

for plan in "--pp" "--tp-shares equal"; do
    for action in kill stop; do
        totals=()
        for r in $(seq "$REPS"); do
            worker d1 "$action:forward:40"
            worker d2 ""
            "${TB[@]}" exec d0 -- "$BIN" run -m "$MODEL" -p "Once upon a time" -n 64 --temp 0 --ignore-eos -t 1 \
                --workers "$W1,$W2" $plan > /dev/null 2> "$OUT/head.err"
            line=$(grep "the call went on" "$OUT/head.err" | sed 's/.*head: //')
            [[ -n "$line" ]] || tail -n 3 "$OUT/head.err" "$OUT/d1.log"
            total=$(sed -n 's/.*went on \([0-9]*\) ms.*/\1/p' <<< "$line")
            echo "$plan $action rep $r: $line"
            grep "warning: worker" "$OUT/head.err" | sed 's/^/    /'
            totals+=("${total:-nan}")
            "${TB[@]}" kill d1 > /dev/null 2>&1
            "${TB[@]}" kill d2 > /dev/null 2>&1
            wait 2> /dev/null
        done
        med=$(printf '%s\n' "${totals[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
        echo "== $plan, $action: failure to next token, median of $REPS: $med ms (${totals[*]})"
    done
done
