#!/usr/bin/env bash
# `hearth convert` on the byte-level BPE, Qwen and Llama 3.1 paths, which no real checkpoint in
# shared/ covers: tests/make-hf-checkpoint.py writes random-weight Qwen2 (q/k/v biases, tied), Qwen3
# (q/k norms, head size 24 with n_embd 64 / 4 heads) and Llama (Llama 3.1 rope scaling, untied)
# checkpoints in F16 whose tokenizer.json is llama.cpp's GPT-2 vocabulary and merges. Checked: logits against tests/hf-forward.py's numpy pass to 1e-4 of
# the largest logit; the converted tokenizer against llama.cpp's own vectors for that vocabulary
# (ggml-vocab-gpt-2.gguf.inp/.out); the metadata (pre-tokenizer, EOS, chat template, head size).
# Env: HEARTH_BIN, HEARTH_SHARED. Needs python3 with numpy.
source "$(dirname "$0")/lib-cli.sh"
VOC="$SHARED/tokenizers/ggml-vocab-gpt-2.gguf"
[[ -f "$VOC" && -f "$VOC.inp" ]] || { echo "$VOC not found; skipping" >&2; exit 77; }
source "$(dirname "$0")/lib-convert.sh"

# 20 positions: Llama 3.1's rope scaling (llama3, an original context of 64) slows the low
# frequencies, which a few positions would hardly show (without rope_freqs: 0.75 of the largest logit)
ids=15496,995,11,703,389,345,30,12,13,14,15,16,17,18,19,20,21,22,23,24
for arch in qwen2 qwen3 llama3; do
    "$PY" "$SRC/make-hf-checkpoint.py" $arch "$VOC" "$TMP/$arch" || { bad "$arch: making the checkpoint failed"; continue; }
    "$BIN" convert "$TMP/$arch" "$TMP/$arch.gguf" --type f32 > "$TMP/out" 2>&1 || { bad "$arch: $(cat "$TMP/out")"; continue; }
    want=$arch; [[ $arch == llama3 ]] && want=llama
    grep -q "wrote .*: $want, " "$TMP/out" && ok || bad "$arch: $(cat "$TMP/out")"
    logits_match "$TMP/$arch" "$TMP/$arch.gguf" "$ids" "$arch logits"
    "$BIN" info --json "$TMP/$arch.gguf" > "$TMP/info.json" 2> "$TMP/err" || bad "$arch: info: $(cat "$TMP/err")"
    if [[ $arch == llama3 ]]; then grep -q '"rope_freqs.weight"' "$TMP/info.json" && ok || bad "llama3: no rope_freqs.weight"; fi
done

# the byte-level tokenizer against llama.cpp's vectors for the same vocabulary
"$PY" - "$VOC.inp" "$VOC.out" > "$TMP/vectors" <<'PY'
import sys
inp = open(sys.argv[1], encoding="utf-8").read().split("\n__ggml_vocab_test__\n")
out = open(sys.argv[2]).read().split("\n")
for t, o in zip(inp, out):
    sys.stdout.buffer.write(t.encode() + b"\0" + ("[" + ", ".join(o.split()) + "]").encode() + b"\0")
PY
mismatch=0
count=0
while IFS= read -r -d '' text && IFS= read -r -d '' want; do
    count=$((count + 1))
    got=$(printf '%s' "$text" | "$BIN" tokenize -m "$TMP/qwen2.gguf" --stdin --ids 2>&1)
    if [[ "$got" != "$want" ]]; then
        mismatch=$((mismatch + 1))
        [[ $mismatch -le 3 ]] && echo "  '$text': llama.cpp $want, hearth $got" >&2
    fi
done < "$TMP/vectors"
[[ $mismatch -eq 0 && $count -gt 40 ]] && ok || bad "tokenizer: $mismatch of $count llama.cpp vectors differ"

# metadata of the converted files: llama.cpp's keys with the values the checkpoint implies
"$PY" - "$SRC" "$TMP/qwen2.gguf" "$TMP/qwen3.gguf" <<'PY' && ok || bad "metadata of the converted files"
import importlib.util, sys
spec = importlib.util.spec_from_file_location("m", sys.argv[1] + "/make-hf-checkpoint.py")
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
q2, q3 = m.read_gguf_vocab(sys.argv[2]), m.read_gguf_vocab(sys.argv[3])
want = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.eos_token_id": 50256,
        "general.architecture": "qwen2", "qwen2.attention.head_count_kv": 2, "qwen2.rope.freq_base": 1e6}
bad = {k: q2.get(k) for k, v in want.items() if q2.get(k) != v}
bad.update({k: q3.get(k) for k, v in {"qwen3.attention.key_length": 24, "qwen3.attention.value_length": 24,
                                       "qwen3.embedding_length": 64}.items() if q3.get(k) != v})
if "<|" not in q2.get("tokenizer.chat_template", ""):
    bad["tokenizer.chat_template"] = q2.get("tokenizer.chat_template")
if len(q2["tokenizer.ggml.merges"]) != 50000:
    bad["merges"] = len(q2["tokenizer.ggml.merges"])
print(bad or "metadata ok", file=sys.stderr)
sys.exit(1 if bad else 0)
PY

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
