#!/usr/bin/env bash
# The worker's slice cache bound end to end (docs/model.md, "The slice cache's bound"), loopback only:
# - `--cache-max` that holds one share: a second plan's share evicts the first one's file (least
#   recently used), the cache stays under the bound, and every run gives the one-device text; the
#   first plan again re-sends its share.
# - `--cache-max` below one share: the head fails with the worker's reason, and no file is left.
# - The head's own slice cache (`run --cache-max`): a bound that holds one share evicts the older one;
#   a bound below its share is a clear error and leaves nothing; the default stays within twice the model
#   file; --cache-max without --workers is a usage error.
# - A cache on a small tmpfs that is nearly full (root only; skipped otherwise): the head fails
#   saying there is no room on the disk, no half-written file is left, and once there is room again
#   the same worker serves the plan.
# Env: HEARTH_BIN, HEARTH_SHARED (see lib-cluster.sh).
set -u
source "$(dirname "$0")/lib-cluster.sh"
M="$SHARED/models/stories260K.gguf"

run -m "$M" > "$TMP/ref.txt" 2> /dev/null || { echo "one-device run failed"; exit 1; }
files() { find "$1" -type f 2> /dev/null | sort; }
bytes() { find "$1" -type f -name '*.gguf' -printf '%s\n' 2> /dev/null | awk '{s += $1} END {print s + 0}'; }

# one share fits, two do not (stories260K: a worker's share is ~0.5 MiB either way)
start_worker 1 0 --cache-max 900K
check_same "$M" "$(workers 1)" --tp-shares equal
first=$(files "$TMP/c1")
[[ $(echo "$first" | grep -c '\.gguf$') -eq 1 ]] && ok || bad "tp: expected one slice file, got: $first"
check_same "$M" "$(workers 1)" --pp
second=$(files "$TMP/c1")
[[ $(echo "$second" | grep -c '\.gguf$') -eq 1 && "$second" != "$first" ]] && ok ||
    bad "pp: the tp share's file was not evicted: $second"
[[ $(bytes "$TMP/c1") -le $((900 * 1024)) ]] && ok || bad "the cache holds $(bytes "$TMP/c1") bytes, over 900K"
grep -q "evicted" "$TMP/w1.log" && ok || bad "the worker did not log the eviction"
check_same "$M" "$(workers 1)" --tp-shares equal
s=$(sent "$TMP/cl.err")
[[ -n "$s" && "$s" -gt 0 ]] && ok || bad "the evicted share was not re-sent ($s bytes)"
# a share kept is used again without sending
check_same "$M" "$(workers 1)" --tp-shares equal
s=$(sent "$TMP/cl.err")
[[ "$s" == 0 ]] && ok || bad "a cached share was sent again ($s bytes)"
stop_worker 1

# a bound below one share: a clear error from the head, nothing written
start_worker 2 0 --cache-max 100K
if run -m "$M" --workers "$(workers 2)" --tp-shares equal > /dev/null 2> "$TMP/e.err"; then
    bad "a share over --cache-max was accepted"
else
    grep -q "worker 1 at .*more than the cache may hold (--cache-max 100.0 KiB)" "$TMP/e.err" && ok ||
        bad "no clear error for a share over --cache-max: $(tail -2 "$TMP/e.err")"
fi
[[ -z "$(files "$TMP/c2" | grep '\.gguf')" ]] && ok || bad "files left in the cache: $(files "$TMP/c2")"
stop_worker 2

# ---- the head's own slice cache (run --cache DIR --cache-max SIZE): the same bound --------------------
# stories260K: the head's share is 0.5-0.9 MiB for these shares; 1200K holds one of them, never two
start_worker 4
hfiles() { files "$TMP/hc" | grep -c '\.gguf$'; }
check_same "$M" "$(workers 4)" --tp-shares 1,1 --cache "$TMP/hc" --cache-max 1200K
check_same "$M" "$(workers 4)" --tp-shares 1,3 --cache "$TMP/hc" --cache-max 1200K
[[ $(hfiles) -eq 1 && $(bytes "$TMP/hc") -le $((1200 * 1024)) ]] && ok ||
    bad "the head's cache holds $(hfiles) files, $(bytes "$TMP/hc") bytes, over 1200K"
grep -q "slice cache: evicted $TMP/hc/" "$TMP/cl.err" && grep -q "tp: head: evicted" "$TMP/cl.err" && ok ||
    bad "the head did not log the eviction: $(grep -i evict "$TMP/cl.err")"
# a bound below the head's share: a clear error, nothing written
if run -m "$M" --workers "$(workers 4)" --tp-shares 1,2 --cache "$TMP/hc2" --cache-max 100K > /dev/null 2> "$TMP/e.err"; then
    bad "a head share over --cache-max was accepted"
else
    grep -q "the head's slice file .*more than the cache may hold (--cache-max 100.0 KiB)$" "$TMP/e.err" && ok ||
        bad "no clear error for a head share over --cache-max: $(tail -2 "$TMP/e.err")"
fi
[[ -z "$(files "$TMP/hc2" | grep '\.gguf')" ]] && ok || bad "files left in the head's cache: $(files "$TMP/hc2")"
# the default bound: twice the model file (the disk here has far more room); five shares of 0.5-0.9 MiB
# would take more than that, so the oldest go
for s in 1,1 1,3 3,1 2,1 1,2; do check_same "$M" "$(workers 4)" --tp-shares $s --cache "$TMP/hc3"; done
model_bytes=$(stat -c %s "$M")
[[ $(bytes "$TMP/hc3") -le $((2 * model_bytes)) && $(files "$TMP/hc3" | grep -c '\.gguf$') -ge 2 ]] && ok ||
    bad "the head's default bound: $(bytes "$TMP/hc3") bytes in $(files "$TMP/hc3" | wc -l) files, model $model_bytes"
"$BIN" run -m "$M" -p hi -n 1 --cache-max 1M > /dev/null 2> "$TMP/u.err"
[[ $? -eq 2 ]] && grep -q -- "--cache-max needs --workers" "$TMP/u.err" && ok || bad "run --cache-max without --workers"
stop_worker 4

# a nearly full disk: a 4 MiB tmpfs (0.2 MiB margin) with 3.5 MiB taken
mkdir -p "$TMP/small"
if [[ $(id -u) -eq 0 ]] && mount -t tmpfs -o size=4m tmpfs "$TMP/small" 2> /dev/null; then
    trap 'umount "$TMP/small" 2> /dev/null; cleanup' EXIT
    head -c $((3584 * 1024)) /dev/urandom > "$TMP/small/filler"
    mkdir -p "$TMP/small/c"
    "$BIN" worker --listen 127.0.0.1:0 --cache "$TMP/small/c" -t 1 > "$TMP/w3.out" 2> "$TMP/w3.log" &
    WPID[3]=$!
    for _ in $(seq 100); do grep -q listening "$TMP/w3.out" && break; sleep 0.05; done
    WPORT[3]=$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' "$TMP/w3.out" | head -1)
    if run -m "$M" --workers "$(workers 3)" --tp-shares equal > /dev/null 2> "$TMP/d.err"; then
        bad "a share that does not fit the disk was accepted"
    else
        grep -q "worker 1 at .*no room on the disk of .* kept free" "$TMP/d.err" && ok ||
            bad "no clear error for a full disk: $(tail -2 "$TMP/d.err")"
    fi
    [[ "$(files "$TMP/small/c")" == "" ]] && ok || bad "a full disk left files: $(files "$TMP/small/c")"
    # the head's cache on that disk, default bound: half of (0.5 MiB free - 0.2 MiB margin), below its share
    if run -m "$M" --workers "$(workers 3)" --tp-shares 1,2 --cache "$TMP/small/hc" > /dev/null 2> "$TMP/d.err"; then
        bad "a head share over half the disk's room was accepted"
    else
        grep -q "the head's slice file .*more than the cache may hold .*the head's default bound" "$TMP/d.err" && ok ||
            bad "no clear error for the head's default bound on a full disk: $(tail -2 "$TMP/d.err")"
    fi
    rm "$TMP/small/filler"
    check_same "$M" "$(workers 3)" --tp-shares equal
    check_same "$M" "$(workers 3)" --tp-shares 1,2 --cache "$TMP/small/hc"
    stop_worker 3
    umount "$TMP/small"
else
    echo "test-cache-max: cannot mount a tmpfs (not root?): the full-disk case is skipped"
fi

echo "test-cache-max: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
