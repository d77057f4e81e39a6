#!/bin/bash
# quota-probe — how a CFS CPU quota treats a device that idles part of a token (docs/planner.md,
# "CPU quotas"; docs/benchmarks.md, "CPU quotas in the cost model"). On a testbed profile (default
# home4), the head on d0 runs the model alone and as the head of two pipelines with a worker on d1;
# per token (the difference of a 33-token and a 3-token run, so load and prefill drop out) it prints the
# wall time, d0's CPU time (/usr/bin/time) and throttled time (its cgroup's cpu.stat), and d1's CPU
# and throttled time. Needs root (the testbed).
#
#   sudo bench/quota-probe.sh [MODEL.gguf]      env: BUILD (default build), PROFILE (home4),
#                                               INSTANCE (qp), PLANS ("15,1 8,8"), RUNS (2)
set -u
cd "$(dirname "$0")/.."
M=${1:-/tmp/hearth-bench-models/llama-3.2-1b-Q4_0.gguf}
B=${BUILD:-build}; B=$(cd "$B" && pwd)
PROFILE=${PROFILE:-home4}; INST=${INSTANCE:-qp}; PLANS=${PLANS:-"15,1 8,8"}; RUNS=${RUNS:-2}
TB="tools/testbed --instance $INST"
CG=/sys/fs/cgroup/cpu/hearth-testbed/$INST
WORK=$(mktemp -d)
cleanup() { $TB kill d1 >/dev/null 2>&1; wait; $TB down >/dev/null 2>&1; rm -rf "$WORK"; }
trap cleanup EXIT
[ -f "$M" ] || { echo "quota-probe: no model $M" >&2; exit 1; }
$TB down >/dev/null 2>&1
$TB up "$PROFILE" --linkem "$B/linkem" >/dev/null || { echo "quota-probe: testbed up $PROFILE failed" >&2; exit 1; }
[ -f "$CG/d0/cpu.stat" ] || { echo "quota-probe: no cgroup v1 cpu.stat at $CG (cgroup v2 is not handled)" >&2; exit 1; }
A1=$($TB addr d1)
$TB exec d1 -- "$B/hearth" worker --listen 0.0.0.0:7070 --insecure --cache "$WORK/cache" -t 1 >/dev/null 2>"$WORK/worker.log" &
sleep 1
WPID=$(pgrep -f "hearth worker --listen 0.0.0.0:7070 --insecure --cache $WORK" | head -1)
[ -n "$WPID" ] || { echo "quota-probe: the worker did not start: $(cat "$WORK/worker.log")" >&2; exit 1; }
thr() { awk '/^throttled_time/{print $2; exit}' "$CG/$1/cpu.stat"; }
nthr() { awk '/^nr_throttled/{print $2; exit}' "$CG/$1/cpu.stat"; }
wcpu() { awk '{print $14 + $15}' "/proc/$WPID/stat"; }   # clock ticks (USER_HZ 100)
# one run of n tokens: "gen_ms d0_cpu_s d0_throttled_ns d0_throttles d1_cpu_ticks d1_throttled_ns"
one() {
    local n=$1; shift
    local t0 c0 w0 u0 t1 c1 w1 u1 err gen cpu
    t0=$(thr d0); c0=$(nthr d0); w0=$(wcpu); u0=$(thr d1)
    err=$($TB exec d0 -- /usr/bin/time -f "TIME %U %S" "$B/hearth" run -m "$M" -p "Once upon a time" --temp 0 \
          --ignore-eos -t 1 -c 256 -n "$n" "$@" 2>&1 >/dev/null)
    t1=$(thr d0); c1=$(nthr d0); w1=$(wcpu); u1=$(thr d1)
    gen=$(echo "$err" | sed -n 's/.*generation: *[0-9]* tokens in *\([0-9.]*\) ms.*/\1/p' | head -1)
    cpu=$(echo "$err" | awk '/^TIME/{print $2 + $3}')
    [ -n "$gen" ] && [ -n "$cpu" ] || { echo "quota-probe: hearth run failed: $(echo "$err" | tail -3)" >&2; exit 1; }
    echo "$gen $cpu $((t1 - t0)) $((c1 - c0)) $((w1 - w0)) $((u1 - u0))"
}
probe() {
    local name=$1; shift
    one 2 "$@" >/dev/null   # warm-up: the worker's slice cache
    for ((r = 0; r < RUNS; r++)); do
        local s l
        s=$(one 3 "$@"); l=$(one 33 "$@")
        python3 - "$name" "$s" "$l" <<'PY'
import sys
name, s, l = sys.argv[1], list(map(float, sys.argv[2].split())), list(map(float, sys.argv[3].split()))
d = [b - a for a, b in zip(s, l)]
t = 30
print(f"{name:10s} wall {d[0] / t:6.1f} ms/token | d0 cpu {d[1] * 1000 / t:5.1f} throttled {d[2] / 1e6 / t:5.1f} "
      f"({d[3] / t:4.1f} times) | d1 cpu {d[4] * 10 / t:5.1f} throttled {d[5] / 1e6 / t:5.1f}")
PY
    done
}
echo "quota-probe: $PROFILE, $(basename "$M"), per token ($RUNS runs each)"
probe single
for w in $PLANS; do probe "pp $w" --workers "$A1:7070" --pp --layer-windows "$w"; done
