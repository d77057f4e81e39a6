#!/usr/bin/env bash
# The lossy all-reduce (docs/lossy.md) when a worker lags: one-token passes (perplexity -b 1) over two
# loopback workers with the HEARTH_LOSSY_DROP hook dropping 5% and 30% of every device's datagrams.
# Lost partials make the head merge at the deadline without a worker, and lost sums make that worker
# ask again (NACK) for a sum the head has gone past — another sum of the pass, or the pass is over and
# the next FORWARD (or the stats request) is on its way. Before the head kept every sum of a pass, the
# worker never got it and left ("sent FORWARD during an all-reduce"). Checks: the run finishes with
# every device (no worker left, the lossy summary counts 3 devices), and every device's hash of the
# sums it continued from equals the head's (no device skipped or guessed a sum); the workers did ask
# again; at 30% the ends of passes waited for a worker behind (hc_ar_lossy_settle).
# Env: HEARTH_BIN, HEARTH_SHARED.
set -u
source "$(dirname "$0")/lib-cluster.sh"
M="$SHARED/models/stories260K.gguf"
TEXT="$(dirname "$0")/data/lossy-text.txt"
start_worker 1
start_worker 2
W="127.0.0.1:${WPORT[1]},127.0.0.1:${WPORT[2]}"
# (30% loss waits for many deadlines and NACK round trips: fewer chunks)
for run in 0.05:6 0.3:3; do
    rate=${run%:*} out=$TMP/p${run%:*}.out err=$TMP/p${run%:*}.err
    if HEARTH_LOSSY_DROP=11:$rate timeout 300 "$BIN" perplexity -m "$M" -f "$TEXT" -c 64 --chunks "${run#*:}" -b 1 \
        --workers "$W" --tp-shares equal --lossy > "$out" 2> "$err"; then ok; else bad "$rate: $(tail -1 "$err")"; fi
    grep -q "left" "$err" && bad "$rate: a worker left: $(grep -m1 left "$err")" || ok
    grep -q "^lossy: 3 devices to the end; their sums agree " "$out" && ok \
        || bad "$rate: $(grep '^lossy: .* devices' "$out" || echo 'no lossy summary')"
    # the last column of the workers' rows of the per-device lossy table: NACKs
    nacks=$(awk '/^lossy  *sent/{t=1; next} t && /^127\.0\.0\.1:/{s+=$NF} t && /^head/{t=0} END{print s+0}' "$err")
    [[ $nacks -gt 0 ]] && ok || bad "$rate: no NACK counted ($nacks)"
    # at 30% a worker's whole partial of a pass's last all-reduce is often lost (one datagram and its copy:
    # 9%): the pass's end waited for it to come late or to ask for a sum (hc_ar_lossy_settle)
    settles=$(sed -n 's/.*; \([0-9]*\) pass ends waited for a worker behind.*/\1/p' "$out")
    if [[ $rate == 0.3 ]]; then [[ ${settles:-0} -gt 0 ]] && ok || bad "$rate: no pass end waited (${settles:-none})"; fi
done
echo "test-lossy-lag: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
