#!/usr/bin/env bash
# lossy-study.sh BIN MODEL [CTX [CHUNKS]] (env RANK: --sim-rank of the lowrank and protect rows; PROTECT: --sim-protect): the quality table of
# docs/lossy.md for one model — perplexity and KL
# divergence against the lossless run of tests/data/lossy-text.txt when tensor parallelism over 4
# devices (head + 3 workers, equal shares) loses all-reduce datagrams, at 1/2/5/10% loss, for each
# placement of the unit groups. Importance is calibrated on a different text (../shared/text/stories.txt).
set -euo pipefail
BIN=$1; M=$2; CTX=${3:-256}; CHUNKS=${4:-}
SRC=$(dirname "$0")/..
SHARED=${HEARTH_SHARED:-$SRC/../shared}
T=$SRC/tests/data/lossy-text.txt
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
"$BIN" calibrate -m "$M" -f "$SHARED/text/stories.txt" -c 128 -o "$TMP/imp.json" 2> /dev/null
"$BIN" perplexity -m "$M" -f "$T" -c "$CTX" ${CHUNKS:+--chunks $CHUNKS} --kl-divergence-base "$TMP/base.kld" > "$TMP/base.out" 2> /dev/null
base=$(sed -n 's/Final estimate: PPL = \([0-9.]*\).*/\1/p' "$TMP/base.out")
echo "model $(basename "$M"), -c $CTX${CHUNKS:+, $CHUNKS chunks}${RANK:+, lowrank rank $RANK}, lossless PPL $base"
echo
echo "| lossy workers | loss | placement | PPL | PPL / lossless | mean KLD | same top |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for who in all one; do
    for p in 1 2 5 10; do
        loss=$p; [[ $who == one ]] && loss=0,0,$p
        for pl in importance random oracle per-token prev-token lowrank protect contiguous; do
            "$BIN" perplexity -m "$M" --kl-divergence-base "$TMP/base.kld" --kl-divergence --sim-devices 4 \
                --sim-loss "$loss" --sim-placement "$pl" --importance "$TMP/imp.json" ${RANK:+--sim-rank $RANK} ${PROTECT:+--sim-protect $PROTECT} \
                > "$TMP/o" 2> /dev/null
            awk -v who="$who" -v p="$p" -v pl="$pl" '
                /^Mean PPL\(Q\) /{ppl=$4} /^Mean PPL\(Q\)\/PPL/{r=$4} /^Mean    KLD/{k=$3} /^Same top p/{t=$4}
                END{printf "| %s | %s%% | %s | %.4f | %.4f | %.5f | %.2f%% |\n", who, p, pl, ppl, r, k, t}' "$TMP/o"
        done
    done
done
