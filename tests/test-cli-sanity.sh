#!/usr/bin/env bash
# Numbers and flags that make no sense: a model whose weights hold NaN gives non-finite logits, which
# `run` and `chat` stop on with an error and `eval` warns about (the file is still written, for
# inspection); -t far above the cores and -c beyond the trained context are warned about.
# Env: HEARTH_BIN (the hearth binary), HEARTH_SHARED (the shared/ folder with models/).
set -u
source "$(dirname "$0")/lib-cli.sh"
command -v python3 > /dev/null || { echo "python3 not found; skipping"; exit 77; }

cp "$M" "$TMP/nan.gguf"
python3 "$(dirname "$0")/gguf-mutate.py" "$TMP/nan.gguf" nan output_norm.weight > /dev/null || { echo "could not damage the model"; exit 1; }

timeout 60 "$BIN" run -m "$TMP/nan.gguf" -p "Once upon a time" -n 8 > /dev/null 2> "$TMP/err"
rc=$?
if [[ $rc -ne 0 && $rc -ne 124 ]] && grep -q "not finite" "$TMP/err"; then ok; else bad "run with NaN logits: exit $rc: $(tail -1 "$TMP/err")"; fi
echo hello | timeout 60 "$BIN" chat -m "$TMP/nan.gguf" -n 8 > /dev/null 2> "$TMP/err"
rc=$?
if [[ $rc -ne 0 && $rc -ne 124 ]] && grep -q "not finite" "$TMP/err"; then ok; else bad "chat with NaN logits: exit $rc: $(tail -1 "$TMP/err")"; fi
timeout 60 "$BIN" eval -m "$TMP/nan.gguf" --tokens 1,2,3 --logits "$TMP/l.f32" > /dev/null 2> "$TMP/err"
rc=$?
if [[ $rc -eq 0 && -s "$TMP/l.f32" ]] && grep -q "warning: .*not finite" "$TMP/err"; then ok
else bad "eval with NaN logits: exit $rc: $(tail -1 "$TMP/err")"; fi
# the sound model: no such warning or error
timeout 60 "$BIN" run -m "$M" -p "Once upon a time" -n 8 > /dev/null 2> "$TMP/err" && ! grep -q "not finite\|warning" "$TMP/err" &&
    ok || bad "a sound run: $(tail -1 "$TMP/err")"

cores=$(nproc)
if [[ $cores -lt 256 ]]; then
    timeout 60 "$BIN" run -m "$M" -p hi -n 2 -t 1024 > /dev/null 2> "$TMP/err"
    grep -q "warning: -t 1024 is far above" "$TMP/err" && ok || bad "-t 1024 on $cores cores: no warning"
fi
train=$("$BIN" info --json "$M" | python3 -c 'import json,sys; print(json.load(sys.stdin)["hparams"]["n_ctx_train"])')
timeout 60 "$BIN" run -m "$M" -p hi -n 2 -c $((train * 8)) > /dev/null 2> "$TMP/err"
grep -q "warning: -c $((train * 8)) is longer than the $train tokens" "$TMP/err" && ok || bad "-c 8x the trained context: no warning"

echo "test-cli-sanity: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
