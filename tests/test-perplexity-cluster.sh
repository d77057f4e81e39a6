#!/usr/bin/env bash
# hearth perplexity on a cluster: stories260K over two loopback workers, tensor parallel and pipeline,
# gives the one-device perplexity (a pipeline: the same bits; tensor parallelism reorders sums: to
# 1e-4) and KL divergence ~0 against the one-device base; with --lossy the lossy all-reduce's counters
# at the end.
. "$(dirname "$0")/lib-cluster.sh"
M="$SHARED/models/stories260K.gguf"
TEXT="$(dirname "$0")/data/lossy-text.txt"
start_worker 1
start_worker 2
W="127.0.0.1:${WPORT[1]},127.0.0.1:${WPORT[2]}"
final() { sed -n 's/Final estimate: PPL = \([0-9.]*\) +\/- \([0-9.]*\)/\1 \2/p' "$1"; }
"$BIN" perplexity -m "$M" -f "$TEXT" -c 128 --chunks 3 --kl-divergence-base "$TMP/base.kld" > "$TMP/one.out" \
    2> "$TMP/one.err" && ok || bad "one device: $(tail -1 "$TMP/one.err")"
timeout 300 "$BIN" perplexity -m "$M" -f "$TEXT" -c 128 --chunks 3 --workers "$W" --tp-shares equal > "$TMP/tp.out" \
    2> "$TMP/tp.err" && ok || bad "tensor parallel: $(tail -1 "$TMP/tp.err")"
timeout 300 "$BIN" perplexity -m "$M" -f "$TEXT" -c 128 --chunks 3 --workers "$W" --pp > "$TMP/pp.out" \
    2> "$TMP/pp.err" && ok || bad "pipeline: $(tail -1 "$TMP/pp.err")"
read -r p1 u1 <<< "$(final "$TMP/one.out")"
read -r pt ut <<< "$(final "$TMP/tp.out")"
read -r pp up <<< "$(final "$TMP/pp.out")"
[[ -n $p1 && "$p1 $u1" == "$pp $up" ]] && ok || bad "pipeline PPL $pp +/- $up, one device $p1 +/- $u1"
python3 -c "import sys; sys.exit(0 if abs($pt - $p1) <= 1e-4 * $p1 else 1)" 2> /dev/null \
    && ok || bad "tensor-parallel PPL $pt, one device $p1"
timeout 300 "$BIN" perplexity -m "$M" --kl-divergence-base "$TMP/base.kld" --kl-divergence --workers "$W" \
    --tp-shares equal > "$TMP/kl.out" 2> "$TMP/kl.err" && ok || bad "TP against the base: $(tail -1 "$TMP/kl.err")"
k=$(awk '/^Mean    KLD:/{print $3}' "$TMP/kl.out")
python3 -c "import sys; sys.exit(0 if abs(float('$k')) < 1e-4 else 1)" 2> /dev/null \
    && ok || bad "tensor parallel against the one-device base: KLD '$k'"
# --lossy: the lossy all-reduce's counters at the end (as run's --timings / --stats-json give them). One-token
# passes (-b 1) all-reduce twice a layer by datagrams, layer 0 excepted (docs/lossy.md): 2 chunks of 32
# tokens over stories260K's 5 layers make 64 x 2 x 4 = 512, each worker one datagram a partial (64
# elements); loopback without the drop hook loses none
timeout 300 "$BIN" perplexity -m "$M" -f "$TEXT" -c 32 --chunks 2 -b 1 --workers "$W" --tp-shares equal --lossy \
    --lossy-deadline 200 > "$TMP/lossy.out" 2> "$TMP/lossy.err" && ok || bad "lossy: $(tail -1 "$TMP/lossy.err")"
want="lossy: 512 all-reduces merged from datagrams; the workers sent 1024 datagrams (0 dropped before the wire), the head"
want+=" received 1024, lost 0 (0.00%), 0 late; 0 elements lost (at most 0 in one); 0 pass ends waited for a worker"
want+=" behind (0.0 ms)"
grep -qxF "$want" "$TMP/lossy.out" && ok || bad "lossy counters: $(grep '^lossy' "$TMP/lossy.out")"
grep -q "^lossy  *sent  *dropped  *received" "$TMP/lossy.err" && ok || bad "lossy: no per-device table on stderr"
grep -q "^lossy" "$TMP/tp.out" && bad "counters without --lossy: $(grep '^lossy' "$TMP/tp.out")" || ok
"$BIN" perplexity -m "$M" -f "$TEXT" --workers "$W" --sim-loss 5 --sim-placement random > /dev/null 2>&1
[[ $? -eq 2 ]] && ok || bad "--sim-loss with --workers was taken"
"$BIN" perplexity -m "$M" -f "$TEXT" --pp > /dev/null 2>&1
[[ $? -eq 2 ]] && ok || bad "--pp without --workers was taken"
echo "test-perplexity-cluster: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
