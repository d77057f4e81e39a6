#!/usr/bin/env bash
# Hybrid plans (--stages, issue 26) through the command line, on loopback: `hearth worker` processes
# and `hearth run --workers ... --stages 0+1,2 --layer-windows ...` heads — a pipeline whose stages may
# be groups of devices splitting each of the stage's layers by units (tensor parallel, a star
# all-reduce inside the group around its leader: the head, or the worker that is the stage).
# - groups of 2 and 3 devices led by the head or by a worker, equal and uneven shares, 1 to 3 trips
#   round the ring, the default windows: exactly the single-device greedy text on stories260K (5
#   layers), the Q8_0 synth models (2 layers) and a 6-layer synth model (where tensor parallelism
#   already gives it: test-tp.sh);
# - a head that leads a group holds its share of its stage's layers in its own slice file;
# - the slice cache: a second identical run sends 0 weight bytes; a TP share of every layer and a
#   worker-led group's share of the whole model on one worker, in turn, never lose the worker;
# - malformed or impossible --stages and the flags beside it: a clear message and a non-zero exit;
# - SIGKILL of a member of the head's group and of a worker's group mid-generation (--no-recover): the
#   head exits non-zero within 5 s naming it; without --no-recover the answer goes on over the rest
#   with the same text.
# Every process started here is killed on exit (trap), whatever happens.
# Env: HEARTH_BIN (the hearth binary), HEARTH_SHARED (the shared/ folder with models/).
set -u

source "$(dirname "$0")/lib-cluster.sh"

for i in 1 2 3; do start_worker $i; done
S=$SHARED/models

# ---- same tokens as one device ------------------------------------------------------------------------
model=$S/stories260K.gguf
run -m "$model" > "$TMP/ref.txt" 2> /dev/null || bad "single-device run of $model"
check_same "$model" "$(workers 1 2)" --stages 0+1,2                               # default: one even round
check_same "$model" "$(workers 1 2)" --stages 0+1,2 --layer-windows 3,2           # one trip
if grep -q "pp: stage 0 (devices 0-1, tensor parallel): layers 0-2" "$TMP/cl.err" &&
    grep -q "pp: stage 1, device 2 (127.0.0.1:${WPORT[2]}): layers 3-4" "$TMP/cl.err"; then ok
else bad "the hybrid plan's log: $(grep 'pp:' "$TMP/cl.err")"; fi
# the head of a group computes its share from a slice file of its own (as a TP head, as a worker), of its
# stage's layers only: from views of the model its manager held whole blocks and thrashed (session 25)
if grep -q "tp: head: wrote its share ([0-9.]* MiB) to \|tp: head: its share ([0-9.]* MiB) from " "$TMP/cl.err"; then ok
else bad "the hybrid head's own slice: $(grep 'head' "$TMP/cl.err" | head -3)"; fi
check_same "$model" "$(workers 1 2)" --stages 0+1,2 --layer-windows 1,1           # 3 trips
check_same "$model" "$(workers 1 2 3)" --stages 0+1,2,3 --layer-windows 1,1,1     # 2 trips, 3 stages
check_same "$model" "$(workers 1 2 3)" --stages 0+1+2,3 --tp-shares 3,1,2 --layer-windows 2,1
check_same "$model" "$(workers 2 1 3)" --pp --stages 0+1,2,3 --tp-shares 1,3 --layer-windows 1,2,1
# groups led by a worker: it gets the hidden state from the previous stage, its members from it
check_same "$model" "$(workers 1 2 3)" --stages 0,1+2,3 --layer-windows 2,2,1
if grep -q "pp: stage 1 (devices 1-2, tensor parallel): layers 2-3" "$TMP/cl.err" &&
    grep -q "pp: stage 1, device 2 (127.0.0.1:${WPORT[2]}): share 0.500: KV heads \[2, 4)" "$TMP/cl.err"; then ok
else bad "the worker-led group's log: $(grep 'pp:' "$TMP/cl.err")"; fi
check_same "$model" "$(workers 1 2 3)" --stages 0+1,2+3 --layer-windows 1,1        # two groups, 3 trips
check_same "$model" "$(workers 1 2)" --stages 0,1+2 --layer-windows 1,1           # the last stage a group
check_same "$model" "$(workers 3 1 2)" --stages 0,1+2+3 --tp-shares 3,1,2 --layer-windows 1,2
for model in "$S/synth/synth-llama-Q8_0.gguf" "$S/synth/synth-qwen2-Q8_0.gguf" "$S/synth/synth-qwen3-Q8_0.gguf"; do
    run -m "$model" > "$TMP/ref.txt" 2> /dev/null || bad "single-device run of $model"
    check_same "$model" "$(workers 1 2)" --stages 0+1,2 --layer-windows 1,1     # 1 trip
    check_same "$model" "$(workers 1 2 3)" --stages 0+1+2,3 --layer-windows 1,1
    check_same "$model" "$(workers 1 2)" --stages 0,1+2 --layer-windows 1,1
done
six=$TMP/six.gguf
"$BIN" synth --shape custom --arch llama --n-embd 256 --n-layer 6 --n-head 8 --n-head-kv 4 --n-ff 1024 \
    --n-ctx 4096 --type Q8_0 -o "$six" > /dev/null 2>&1 || bad "synth of a 6-layer model"
run -m "$six" > "$TMP/ref.txt" 2> /dev/null || bad "single-device run of $six"
check_same "$six" "$(workers 1 2)" --stages 0+1,2 --layer-windows 1,2             # 2 trips
check_same "$six" "$(workers 1 2 3)" --stages 0+1,2,3 --layer-windows 2,1,1       # the last window cut short
check_same "$six" "$(workers 1 2 3)" --stages 0+1+2,3 --tp-shares 2,1,1 --layer-windows 1,1
check_same "$six" "$(workers 1 2 3)" --stages 0,1+2,3 --layer-windows 1,2,1
check_same "$six" "$(workers 1 2 3)" --stages 0+1,2+3 --tp-shares 1,2,2,1 --layer-windows 2,1

# ---- the slice cache: the second identical run sends nothing ------------------------------------------
model=$S/stories260K.gguf
run -m "$model" --workers "$(workers 3 1)" --stages 0+1,2 --layer-windows 2,1 > /dev/null 2> "$TMP/s1.err" || bad "cache run 1"
run -m "$model" --workers "$(workers 3 1)" --stages 0+1,2 --layer-windows 2,1 > /dev/null 2> "$TMP/s2.err" || bad "cache run 2"
s1=$(sent "$TMP/s1.err")
s2=$(sent "$TMP/s2.err")
if [[ -n "$s1" && "$s1" -gt 0 && "$s2" == 0 ]]; then ok; else bad "weight bytes sent: first run '$s1', second run '$s2' (want > 0, then 0)"; fi

# a worker's share of every layer as a TP device and as a member of a worker-led group given the whole
# model (the head's window 0) are the same tensors, but only the group's file lists its layers (the
# worker's windows come from that list): two cache files, so that neither run finds the other's and
# loses the worker ("does not hold the planned share"; the recovery would hide it in the text)
run -m "$model" > "$TMP/ref.txt" 2> /dev/null || bad "single-device run of $model"
for round in 1 2; do
    for args in "$(workers 3)|--tp-shares 1,1" "$(workers 1 3)|--stages 0,1+2 --layer-windows 0,5"; do
        check_same "$model" "${args%%|*}" ${args#*|}
        if grep -q "warning: worker" "$TMP/cl.err"; then bad "round $round, ${args#*|}: $(grep 'warning: worker' "$TMP/cl.err")"
        else ok; fi
    done
done

# ---- malformed and impossible flags -------------------------------------------------------------------
W2=$(workers 1 2)
expect_error "needs --workers" --stages 0+1,2
expect_error "device numbers joined by +" --workers "$W2" --stages 0+x,2
expect_error "device numbers joined by +" --workers "$W2" --stages 0+1,,2
expect_error "device numbers joined by +" --workers "$W2" --stages "0+1,2,"
expect_error "device 2 where device 1 comes next" --workers "$W2" --stages 0+2,1
expect_error "device 1 where device 2 comes next" --workers "$W2" --stages 0+1,1
expect_error "at least two stages" --workers "$W2" --stages 0+1+2
expect_error "the stages hold 3 devices, the cluster has 4" --workers "$(workers 1 2 3)" --stages 0+1,2
expect_error "the stages hold 4 devices, the cluster has 3" --workers "$W2" --stages 0+1,2,3
expect_error "a worker's group gets no layers" --workers "$W2" --stages 0,1+2 --layer-windows 1,0
expect_error "3 sizes for 2 stages" --workers "$W2" --stages 0+1,2 --layer-windows 1,1,1
expect_error "3 weights for the 2 devices of the stages' groups" --workers "$W2" --stages 0+1,2 --tp-shares 1,1,1
expect_error "not for a hybrid plan" --workers "$W2" --stages 0+1,2 --tp-shares auto
expect_error "by star" --workers "$W2" --stages 0+1,2 --allreduce ring
expect_error "the head's group gets no layers" --workers "$W2" --stages 0+1,2 --layer-windows 0,1
expect_error "stages: device 1 gets no layers" --workers "$W2" --stages 0+1,2 --layer-windows 5,1
expect_error "is for tensor parallelism" --workers "$W2" --stages 0,1,2 --tp-shares 1
expect_error "not --pp" --workers "$W2" --stages 0+1,2 --lossy

# ---- a member of a group killed mid-generation -----------------------------------------------------------
check_kill 1 "$six" "$(workers 1 2 3)" --stages 0+1,2,3 --layer-windows 1,1,1
start_worker 1
check_kill 2 "$six" "$(workers 1 2 3)" --stages 0,1+2,3 --layer-windows 1,1,1    # of a worker's group
start_worker 2
# without --no-recover: the head plans without it and the text is the same. check_recover I STAGES
# WINDOWS: worker I (started here) kills itself at its 20th FORWARD as device 1 (check_recover 4 ...) or
# device 2 (5) of a cluster with workers 2 and 3
run -m "$six" -n 40 > "$TMP/ref.txt" 2> /dev/null || bad "single-device run of $six"
check_recover() {
    local i=$1 stages=$2 windows=$3 list
    HEARTH_TEST_FAULT=kill:forward:20 start_worker "$i"
    if [[ $i == 4 ]]; then list=$(workers 4 2 3); else list=$(workers 2 5 3); fi
    if run -m "$six" -n 40 --workers "$list" --stages "$stages" --layer-windows "$windows" > "$TMP/rec.txt" \
        2> "$TMP/rec.err" && cmp -s "$TMP/ref.txt" "$TMP/rec.txt" &&
        [[ $(grep -c "warning: worker 127.0.0.1:${WPORT[$i]} left" "$TMP/rec.err") -eq 1 ]]; then ok
    else bad "recovery after a member of $stages died: $(grep -i 'left\|hearth run' "$TMP/rec.err" | tail -3)"
        diff "$TMP/ref.txt" "$TMP/rec.txt" >&2
    fi
    grep -q "HEARTH_TEST_FAULT" "$TMP/w$i.log" && ok || bad "the fault did not happen (the recovery test tests nothing)"
    unset "WPID[$i]"
}
check_recover 4 0+1,2,3 1,1,1   # the head's group loses its member: a pipeline of the rest
check_recover 5 0,1+2,3 1,1,1   # a worker's group loses its member: that stage is its leader alone

for i in 1 2 3; do stop_worker $i; done

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
