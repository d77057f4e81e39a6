#!/usr/bin/env bash
# A bounded battery of hostile clients against one worker on loopback — idle connections, a slow
# sender, HELLO then silence, an oversized, a truncated and a wrongly-tagged frame, control characters
# in a device name, rapid connect/close — all at once, each ending by itself within seconds. Then a
# real head must get the one-device text within 10 s, and the worker's memory (RSS) must not have
# grown by more than 64 MiB. Everything started is stopped (lib-cluster.sh).
# Env: HEARTH_BIN, HEARTH_SHARED (see lib-cluster.sh).
set -u
source "$(dirname "$0")/lib-cluster.sh"
command -v python3 > /dev/null || { echo "python3 not found; skipping"; exit 77; }
HC="timeout 20 python3 $(dirname "$0")/hostile-client.py"
M="$SHARED/models/stories260K.gguf"
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

run -m "$M" > "$TMP/ref.txt" 2> /dev/null || { echo "one-device run failed"; exit 1; }
start_worker 1 0 --setup-timeout 2
check_same "$M" "$(workers 1)" --tp-shares equal   # the worker's own set-up done, so that RSS compares like with like
rss0=$(rss_kib "${WPID[1]}")

P=${WPORT[1]}
declare -a BPIDS=()
$HC "$P" idle 8 5 > /dev/null & BPIDS+=($!)
$HC "$P" slow 5 > /dev/null & BPIDS+=($!)
$HC "$P" hello-silent 5 > /dev/null & BPIDS+=($!)
$HC "$P" oversized > "$TMP/oversized.out" & BPIDS+=($!)
$HC "$P" truncated > /dev/null & BPIDS+=($!)
$HC "$P" magic > "$TMP/magic.out" & BPIDS+=($!)
$HC "$P" raw "$(head -c 4096 /dev/urandom | od -An -tx1 | tr -d ' \n')" 1 > /dev/null & BPIDS+=($!)
$HC "$P" hello 'x\n\r\x1b[2Jforged' > /dev/null & BPIDS+=($!)
$HC "$P" rapid 200 > /dev/null & BPIDS+=($!)
for p in "${BPIDS[@]}"; do wait "$p"; done
kill -0 "${WPID[1]}" 2> /dev/null && ok || bad "the worker died under the battery: $(tail -3 "$TMP/w1.log")"

# what the worker answered to the malformed frames (either ERROR or a plain close is acceptable)
for f in oversized magic; do
    grep -qE "ERROR|closed" "$TMP/$f.out" && ok || bad "$f frame: the worker answered '$(cat "$TMP/$f.out")'"
done

sleep 2.5   # the silent session's --setup-timeout
t0=$(date +%s%N)
check_same "$M" "$(workers 1)" --tp-shares equal
ms=$((($(date +%s%N) - t0) / 1000000))
[[ $ms -lt 10000 ]] && ok || bad "the real head after the battery took $ms ms"
rss1=$(rss_kib "${WPID[1]}")
echo "worker RSS: $rss0 KiB before the battery, $rss1 KiB after; the head took $ms ms"
[[ $((rss1 - rss0)) -lt 65536 ]] && ok || bad "the worker's RSS grew from $rss0 to $rss1 KiB"
LC_ALL=C grep -q $'\x1b' "$TMP/w1.log" && bad "an escape character reached the worker's log" || ok
stop_worker 1

echo "test-hostile: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
