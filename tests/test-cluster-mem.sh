#!/usr/bin/env bash
# The memory check of a cluster run: with a context too large for the memory there is, a tensor-
# parallel or pipeline head refuses before committing its KV cache (as one device does), and a worker
# refuses its share when the plan arrives, before any weight is sent. TESTBED_MEM_LIMIT stands in
# for a small machine. Loopback only; every process started is stopped.
# Env: HEARTH_BIN, HEARTH_SHARED (see lib-cluster.sh).
set -u
source "$(dirname "$0")/lib-cluster.sh"
M="$SHARED/models/stories260K.gguf"
BIG_CTX=(-c 400000 -n 2 -p hi -t 1)  # about 128 MiB of KV cache per half: more than 64 MiB

run -m "$M" > "$TMP/ref.txt" 2> /dev/null || { echo "one-device run failed"; exit 1; }

# a worker with 64 MiB: it refuses its share, and nothing was sent to it
TESTBED_MEM_LIMIT=64M start_worker 1
for mode in "--tp-shares equal" --pp; do  # a plan flag: the planner would choose one device
    "$BIN" run -m "$M" "${BIG_CTX[@]}" $mode --workers "$(workers 1)" > /dev/null 2> "$TMP/h.err"
    rc=$?
    if [[ $rc -ne 0 ]] && grep -q "worker 1 at .*more than the 64.0 MiB" "$TMP/h.err"; then ok
    else bad "worker with 64 MiB, -c 400000 $mode: exit $rc: $(tail -1 "$TMP/h.err")"; fi
    n=$(find "$TMP/c1" -type f -name '*.gguf' 2> /dev/null | wc -l)
    if [[ $n -eq 0 ]]; then ok; else bad "$mode: $n slice files were sent to a worker that cannot hold the context"; fi
done
check_same "$M" "$(workers 1)"   # an ordinary context still works
stop_worker 1

# a head with 64 MiB: it refuses before committing its share (the worker has room)
start_worker 2
for mode in "--tp-shares equal" --pp; do  # a plan flag: the planner would choose one device
    TESTBED_MEM_LIMIT=64M "$BIN" run -m "$M" "${BIG_CTX[@]}" $mode --workers "$(workers 2)" > /dev/null 2> "$TMP/h.err"
    rc=$?
    if [[ $rc -ne 0 ]] && grep -q "more than the 64.0 MiB" "$TMP/h.err" && ! grep -q "worker 2 at" "$TMP/h.err"; then ok
    else bad "head with 64 MiB, -c 400000 $mode: exit $rc: $(tail -1 "$TMP/h.err")"; fi
done
stop_worker 2

echo "test-cluster-mem: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
