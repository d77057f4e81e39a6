#!/usr/bin/env bash
# Importance-aware placement of unit groups in the real runtime (issue 28, docs/lossy.md, "Placement
# in the runtime"): `hearth worker` processes on loopback and heads with `--importance FILE`.
# - the text equals the one-device run's with 2 and 3 devices, with --link-loss ordering the workers,
#   over TCP and --lossy (nothing dropped), on stories260K (F32) and a Q8_0 synth model (column slices
#   gathered block by block);
# - the placement moves groups: the head's log shows the placement, and a worker whose link is lossy
#   gets other groups than with every link equal (other slices: weight bytes are sent again);
# - the slice cache: the same placement again sends 0 bytes; another placement (reversed importance)
#   gets slice files of its own, and the contiguous run still finds its own (0 bytes);
# - a malformed or mismatched importance file (not JSON, another model, wrong layer count, a row too
#   short) and impossible flags are clear errors, never a crash.
# Env: HEARTH_BIN, HEARTH_SHARED.
set -u

source "$(dirname "$0")/lib-cluster.sh"
command -v python3 > /dev/null || { echo "python3 not found; skipping" >&2; exit 77; }

for i in 1 2; do start_worker $i; done
S=$SHARED/models
TEXT=$SHARED/text/stories.txt
[[ -f $TEXT ]] || { echo "$TEXT not found; skipping" >&2; exit 77; }
SMALL=$S/stories260K.gguf
Q8=$S/synth/synth-llama-Q8_0.gguf

"$BIN" calibrate -m "$SMALL" -f "$TEXT" -c 128 --chunks 4 -o "$TMP/imp.json" 2> "$TMP/cal.err" \
    || bad "calibrate stories260K: $(tail -2 "$TMP/cal.err")"
"$BIN" calibrate -m "$Q8" -f "$TEXT" -c 128 --chunks 1 -o "$TMP/imp-q8.json" 2> "$TMP/cal.err" \
    || bad "calibrate synth Q8_0: $(tail -2 "$TMP/cal.err")"
# the same groups ranked the other way round: another placement
python3 - "$TMP/imp.json" "$TMP/rev.json" << 'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for b in ("attention", "ffn"):
    d[b]["importance"] = [[max(r) - x for x in r] for r in d[b]["importance"]]
json.dump(d, open(sys.argv[2], "w"))
EOF

placement() { sed -n 's/.*placed by importance (placement \([0-9a-f]*\)).*/\1/p' "$1" | tail -1; }

# ---- the one-device text, with 2 and 3 devices -------------------------------------------------------
for model in "$SMALL" "$Q8"; do
    imp=$TMP/imp.json
    [[ $model == "$Q8" ]] && imp=$TMP/imp-q8.json
    run -m "$model" > "$TMP/ref.txt" 2> /dev/null || bad "single-device run of $(basename "$model")"
    check_same "$model" "$(workers 1)" --tp-shares equal --importance "$imp"
    check_same "$model" "$(workers 1 2)" --tp-shares equal --importance "$imp"
    check_same "$model" "$(workers 1 2)" --tp-shares 1,2,1 --importance "$imp" --link-loss 0,5
    check_same "$model" "$(workers 1 2)" --importance "$imp" --link-loss 5 --lossy --lossy-deadline 3000
    grep -q "placed by importance" "$TMP/cl.err" && ok || bad "$(basename "$model"): no placement in the log"
done

# ---- the placement follows the links' loss; the slice cache keeps placements apart --------------------
W=$(workers 1 2)
files() { find "$TMP/c1" "$TMP/c2" "$XDG_CACHE_HOME" -name '*.gguf' | sort; }
run -m "$SMALL" > "$TMP/ref.txt" 2> /dev/null
check_same "$SMALL" "$W" --tp-shares equal
check_same "$SMALL" "$W" --tp-shares equal --importance "$TMP/imp.json"
cp "$TMP/cl.err" "$TMP/p1.err"
check_same "$SMALL" "$W" --tp-shares equal --importance "$TMP/imp.json"
[[ $(sent "$TMP/cl.err") == 0 ]] && ok || bad "the same placement again sent $(sent "$TMP/cl.err") weight bytes"
[[ $(placement "$TMP/cl.err") == $(placement "$TMP/p1.err") ]] && ok || bad "the same placement got another hash"
files > "$TMP/files1"
# worker 1's link lossy: it gets the least important groups, which other slices hold
check_same "$SMALL" "$W" --tp-shares equal --importance "$TMP/imp.json" --link-loss 5,0
[[ $(sent "$TMP/cl.err") -gt 0 ]] && ok || bad "a lossy worker 1 got the very same slices"
[[ $(placement "$TMP/cl.err") != "$(placement "$TMP/p1.err")" ]] && ok || bad "--link-loss did not change the placement"
check_same "$SMALL" "$W" --tp-shares equal --importance "$TMP/rev.json"
cp "$TMP/cl.err" "$TMP/p2.err"
[[ $(sent "$TMP/p2.err") -gt 0 ]] && ok || bad "the reversed placement found its slices in the cache"
[[ $(placement "$TMP/p2.err") != "$(placement "$TMP/p1.err")" ]] && ok || bad "two placements, one hash"
files > "$TMP/files2"
[[ $(comm -13 "$TMP/files1" "$TMP/files2" | wc -l) -ge 3 ]] && ok \
    || bad "the other placements did not get slice files of their own: $(comm -13 "$TMP/files1" "$TMP/files2")"
# each placement's files are still there and found again
check_same "$SMALL" "$W" --tp-shares equal
[[ $(sent "$TMP/cl.err") == 0 ]] && ok || bad "the contiguous run sent $(sent "$TMP/cl.err") bytes after placements"
check_same "$SMALL" "$W" --tp-shares equal --importance "$TMP/imp.json"
[[ $(sent "$TMP/cl.err") == 0 ]] && ok || bad "the first placement sent $(sent "$TMP/cl.err") bytes the third time"
if grep -q "rewriting" "$TMP/cl.err" "$TMP/w1.log" "$TMP/w2.log"; then bad "a slice file was rewritten"; else ok; fi

# ---- malformed and mismatched files, impossible flags: clear errors ----------------------------------
refuse() { # refuse WHAT PATTERN ARGS...: the head exits 1 (2: a flag's value) with PATTERN in its message
    local what=$1 pat=$2
    shift 2
    run -m "$SMALL" "$@" > /dev/null 2> "$TMP/r.err"
    local rc=$?
    if [[ $rc == 1 || $rc == 2 ]] && grep -q -- "$pat" "$TMP/r.err"; then ok
    else bad "$what: exit $rc, not '$pat': $(tail -2 "$TMP/r.err")"; fi
}
echo '{"format":"hearth-importance",' > "$TMP/cut.json"
python3 - "$TMP/imp.json" "$TMP" << 'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
e = dict(d, n_layer=d["n_layer"] - 1)
e["attention"] = dict(d["attention"], importance=d["attention"]["importance"][1:])
e["ffn"] = dict(d["ffn"], importance=d["ffn"]["importance"][1:])
json.dump(e, open(sys.argv[2] + "/layers.json", "w"))
e = dict(d)
e["ffn"] = dict(d["ffn"], importance=[r[:-1] for r in d["ffn"]["importance"]])
json.dump(e, open(sys.argv[2] + "/short.json", "w"))
EOF
refuse "a cut JSON file" "cut.json" --workers "$W" --importance "$TMP/cut.json"
refuse "another model's file" "measured on the model" --workers "$W" --importance "$TMP/imp-q8.json"
refuse "a file of 4 layers" "4 layers" --workers "$W" --importance "$TMP/layers.json"
refuse "a row too short" "not 172 numbers" --workers "$W" --importance "$TMP/short.json"
refuse "a missing file" "nothere.json" --workers "$W" --importance "$TMP/nothere.json"
refuse "--importance on one device" "--workers" --importance "$TMP/imp.json"
refuse "--link-loss without --importance" "--importance" --workers "$W" --link-loss 5
refuse "3 losses for 2 workers" "3 values for 2 workers" --workers "$W" --importance "$TMP/imp.json" --link-loss 1,2,3
refuse "a loss over 100%" "percentages" --workers "$W" --importance "$TMP/imp.json" --link-loss 101

for i in 1 2; do stop_worker $i; done
echo "test-place: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
