#!/usr/bin/env bash
# lossy-runtime-study.sh BIN MODEL: the real runtime's side of docs/lossy.md's quality table — 3 loopback
# workers and a head (4 devices, equal shares) running `hearth perplexity --workers ... --lossy -b 1`
# (one token a pass: every pass a decoding step, so every all-reduce but layer 0's goes over UDP) on
# tests/data/lossy-text.txt, with the HEARTH_LOSSY_DROP test hook dropping the workers' datagrams, for
# the placements importance (calibrated on ../shared/text/stories.txt), random (an importance file of
# random numbers), contiguous (no --importance) and protect (importance, and the head computes each token's
# --lossy-protect PROTECT groups of the lossy workers' FFN shares). KL divergence against the one-device run.
# Env: CTX (256), CHUNKS (8), DEADLINE (--lossy-deadline, 30), RATES (hook drop rates, "0.05 0.224"),
# WHO ("one all": worker 3 only, or all three), SEED (7), PLACEMENTS, PROTECT (10), HEARTH_SHARED.
set -euo pipefail
BIN=$(realpath "$1"); M=$2
CTX=${CTX:-256}; CHUNKS=${CHUNKS:-8}; DEADLINE=${DEADLINE:-30}; RATES=${RATES:-0.05 0.224}; WHO=${WHO:-one all}
SEED=${SEED:-7}; PLACEMENTS=${PLACEMENTS:-importance random contiguous protect}; PROTECT=${PROTECT:-10}
SRC=$(dirname "$0")/..
SHARED=${HEARTH_SHARED:-$SRC/../shared}
T=$SRC/tests/data/lossy-text.txt
TMP=$(mktemp -d)
PIDS=()
trap 'kill "${PIDS[@]}" 2> /dev/null; wait 2> /dev/null; rm -rf "$TMP"' EXIT
export XDG_CACHE_HOME=$TMP/xdg
W=
for i in 1 2 3; do
    "$BIN" worker --listen 127.0.0.1:0 --cache "$TMP/c$i" -t 1 > "$TMP/w$i.out" 2> "$TMP/w$i.log" &
    PIDS+=($!)
    for _ in $(seq 100); do grep -q listening "$TMP/w$i.out" && break; sleep 0.05; done
    W+=${W:+,}127.0.0.1:$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' "$TMP/w$i.out" | head -1)
done
"$BIN" calibrate -m "$M" -f "$SHARED/text/stories.txt" -c 128 -o "$TMP/imp.json" 2> /dev/null
python3 - "$TMP/imp.json" "$TMP/random.json" << 'EOF'
import json, random, sys
d = json.load(open(sys.argv[1]))
r = random.Random(1)
for b in ("attention", "ffn"):
    d[b]["importance"] = [[r.random() for _ in row] for row in d[b]["importance"]]
json.dump(d, open(sys.argv[2], "w"))
EOF
"$BIN" perplexity -m "$M" -f "$T" -c "$CTX" --chunks "$CHUNKS" --kl-divergence-base "$TMP/base.kld" > "$TMP/base.out" 2> /dev/null
base=$(sed -n 's/Final estimate: PPL = \([0-9.]*\).*/\1/p' "$TMP/base.out")
echo "model $(basename "$M"), -c $CTX, $CHUNKS chunks, deadline $DEADLINE ms, lossless PPL $base"
echo
echo "| lossy workers | datagrams dropped | partials lost | placement | PPL | PPL / lossless | mean KLD | same top | s |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for who in $WHO; do
    for rate in $RATES; do
        pct=$(python3 -c "print(round($rate * 100, 1))")
        if [[ $who == one ]]; then devs=3; loss=0,0,$pct; else devs=1+2+3; loss=$pct; fi
        for pl in $PLACEMENTS; do
            imp=()
            [[ $pl != contiguous ]] && imp=(--importance "$TMP/$pl.json" --link-loss "$loss")
            [[ $pl == importance || $pl == protect ]] && imp=(--importance "$TMP/imp.json" --link-loss "$loss")
            [[ $pl == protect ]] && imp+=(--lossy-protect "$PROTECT")
            t0=$(date +%s)
            HEARTH_LOSSY_DROP=$SEED:$rate:0:$devs "$BIN" perplexity -m "$M" --kl-divergence-base "$TMP/base.kld" \
                --kl-divergence -b 1 -t 1 --workers "$W" --tp-shares 1,1,1,1 --lossy --lossy-deadline "$DEADLINE" \
                "${imp[@]}" > "$TMP/o" 2> "$TMP/e"
            t1=$(date +%s)
            if grep -q "left" "$TMP/e"; then echo "| $who | $pct% | | $pl | (a worker left: $(grep left "$TMP/e" | head -1)) |"; continue; fi
            awk -v who="$who" -v p="$pct" -v pl="$pl" -v s=$((t1 - t0)) -v q="$(python3 -c "print(round($rate * $rate * 100, 2))")" '
                /^Mean PPL\(Q\) /{ppl=$4} /^Mean PPL\(Q\)\/PPL/{r=$4} /^Mean    KLD/{k=$3} /^Same top p/{t=$4}
                END{printf "| %s | %s%% | ~%s%% | %s | %.4f | %.4f | %.5f | %.2f%% | %d |\n", who, p, q, pl, ppl, r, k, t, s}' "$TMP/o"
        done
    done
done
