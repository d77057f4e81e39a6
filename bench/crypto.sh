#!/usr/bin/env bash
# The cost of issue 29's encrypted links (docs/benchmarks.md, "Issue 29: encryption cost"): decode
# ms/token of `hearth run` over two workers, tensor parallel, pipeline and tensor parallel with the lossy
# all-reduce (--lossy: its datagrams sealed with the key, issue 29), with and without the cluster
# key, the two interleaved run by run (the order alternating) so that the machine's drift falls on both;
# medians and the ratio. Then the handshake time per link (tools/netbench, keyed and plaintext workers)
# and the AEAD's cost per frame.
#
# usage: bench/crypto.sh [-m MODEL] [-n TOKENS] [-r REPS] [-b BUILD] [--testbed PROFILE]
#   loopback (default): workers on 127.0.0.1, -t 1 each;
#   --testbed PROFILE (root): `tools/testbed --instance crypto up PROFILE`, head on d0, workers on d1, d2.
set -u
cd "$(dirname "$0")/.."
model=/tmp/crypto-bench/m.gguf n=16 reps=5 build=build profile=""
while [[ $# -gt 0 ]]; do
    case $1 in
        -m) model=$2; shift 2 ;;
        -n) n=$2; shift 2 ;;
        -r) reps=$2; shift 2 ;;
        -b) build=$2; shift 2 ;;
        --testbed) profile=$2; shift 2 ;;
        *) echo "usage: $0 [-m MODEL] [-n TOKENS] [-r REPS] [-b BUILD] [--testbed PROFILE]" >&2; exit 2 ;;
    esac
done
BIN=$PWD/$build/hearth
NETBENCH=$PWD/$build/netbench
W=$(mktemp -d)
export XDG_CONFIG_HOME=$W/cfg XDG_CACHE_HOME=$W/xdg
"$BIN" keygen -o "$W/key" > /dev/null
pids=()
TB=(tools/testbed --instance crypto)
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2> /dev/null; done
    wait 2> /dev/null
    [[ -n "$profile" ]] && "${TB[@]}" down > /dev/null 2>&1
    rm -rf "$W"
}
trap cleanup EXIT

# on DEVICE CMD...: runs CMD on a testbed device, or here
on() {
    local d=$1
    shift
    if [[ -n "$profile" ]]; then "${TB[@]}" exec "$d" -- "$@"; else "$@"; fi
}
if [[ -n "$profile" ]]; then
    "${TB[@]}" up "$profile" > "$W/up.txt" || { cat "$W/up.txt"; exit 1; }
    host1=$("${TB[@]}" addr d1) host2=$("${TB[@]}" addr d2) listen=0.0.0.0
else
    host1=127.0.0.1 host2=127.0.0.1 listen=127.0.0.1
fi
# keyed workers on 7170/7171, plaintext ones on 7180/7181 (--insecure: the testbed's devices listen
# on their own address)
start() { # DEVICE PORT NAME ARGS...
    local d=$1 port=$2 name=$3
    shift 3
    local cmd=("$BIN" worker --listen "$listen:$port" -t 1 --cache "$W/c-$name" "$@")
    if [[ -n "$profile" ]]; then "${TB[@]}" exec "$d" -- "${cmd[@]}" > "$W/$name.out" 2> "$W/$name.log" &
    else "${cmd[@]}" > "$W/$name.out" 2> "$W/$name.log" & fi
    pids+=($!) # (the testbed's own are stopped by its down)
}
start d1 7170 k1 --key "$W/key"
start d2 7171 k2 --key "$W/key"
start d1 7180 p1 --insecure
start d2 7181 p2 --insecure
sleep 2
for f in k1 k2 p1 p2; do grep -q listening "$W/$f.out" || { echo "worker $f did not start: $(cat "$W/$f.log")"; exit 1; }; done
enc_w="$host1:7170,$host2:7171" plain_w="$host1:7180,$host2:7181"

ms_per_token() { sed -n 's/^generation: *\([0-9]*\) tokens in *\([0-9.]*\) ms.*/\2 \1/p' "$1" | awk '{printf "%.3f", $1 / $2}'; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
declare -A T
go() { # MODE KIND
    local mode=$1 kind=$2 args=()
    case $kind in
        tp) args=(--tp-shares equal) ;;
        lossy) args=(--tp-shares equal --lossy) ;;   # the lossy all-reduce: sealed datagrams with the key
        *) args=(--pp) ;;
    esac
    if [[ $mode == enc ]]; then args+=(--workers "$enc_w" --key "$W/key"); else args+=(--workers "$plain_w"); fi
    on d0 "$BIN" run -m "$model" -p "Once upon a time" --temp 0 -n "$n" --ignore-eos -t 1 "${args[@]}" \
        > "$W/out.txt" 2> "$W/err.txt" || { echo "run failed: $(tail -2 "$W/err.txt")"; exit 1; }
    local v
    v=$(ms_per_token "$W/err.txt")
    T[$mode.$kind]+="$v "
    cmp -s "$W/out.txt" "$W/ref.$kind" 2> /dev/null || { [[ -f "$W/ref.$kind" ]] && echo "warning: $mode $kind text differs"; cp "$W/out.txt" "$W/ref.$kind"; }
}
# one unmeasured round: slices into the workers' caches, the head's share file
for kind in tp pp lossy; do go plain $kind; go enc $kind; done
T=()
for ((r = 0; r < reps; r++)); do
    for kind in tp pp lossy; do
        if ((r % 2)); then go enc $kind; go plain $kind; else go plain $kind; go enc $kind; fi
    done
done
echo "model $(basename "$model"), $n tokens per run, $reps runs each, ${profile:-loopback}; ms/token:"
for kind in tp pp lossy; do
    p=$(tr ' ' '\n' <<< "${T[plain.$kind]}" | grep . | median)
    e=$(tr ' ' '\n' <<< "${T[enc.$kind]}" | grep . | median)
    echo "  $kind: plaintext $p (runs: ${T[plain.$kind]}), encrypted $e (runs: ${T[enc.$kind]}), ratio $(awk "BEGIN {printf \"%.3f\", $e / $p}")"
done
if [[ -x "$NETBENCH" ]]; then
    on d0 "$NETBENCH" "$host1:7170" --key "$W/key" -n 20
    on d0 "$NETBENCH" "$host1:7180" -n 20
    "$NETBENCH" --seal
fi
