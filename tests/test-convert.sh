#!/usr/bin/env bash
# Tests of `hearth convert` on a real trained checkpoint (../shared/models/tinystories-656k-hf:
# Llama architecture, GQA, tied embeddings, F32 safetensors):
# - the converted GGUF's logits (F32 weights, F32 KV cache) equal a reference forward pass that
#   tests/hf-forward.py computes in numpy from the safetensors, in Hugging Face's own layout, to
#   1e-4 of the largest logit, on several prompts; so do those of BF16 and sharded copies of it;
# - its tokenizer gives tests/hf-bpe.py's ids (an independent reading of tokenizer.json) for fixed
#   and random texts;
# - sharded and single-file checkpoints convert to the same bytes; F16, BF16 and Q8_0 outputs load
#   and generate;
# - malformed checkpoints (missing tensor, wrong shape, truncated safetensors, unknown
#   architecture, no tokenizer, unknown --type) are refused with a clear message and leave no file.
# Env: HEARTH_BIN, HEARTH_SHARED. Needs python3 with numpy (Debian python3-numpy).
source "$(dirname "$0")/lib-cli.sh"
HF="$SHARED/models/tinystories-656k-hf"
[[ -d "$HF" ]] || { echo "$HF not found; skipping" >&2; exit 77; }
source "$(dirname "$0")/lib-convert.sh"

# refused DESC DIR [ARGS] PATTERN: convert fails (exit 1 or 2), says PATTERN, leaves no output file
refused() {
    local desc=$1 dir=$2 pattern=${*: -1}
    local args=("${@:3:$#-3}")
    rm -f "$TMP/bad.gguf"*
    "$BIN" convert "$dir" "$TMP/bad.gguf" "${args[@]}" > /dev/null 2> "$TMP/err"
    local rc=$?
    if [[ $rc -ne 1 && $rc -ne 2 ]] || grep -q "Sanitizer" "$TMP/err"; then bad "$desc: exit $rc $(cat "$TMP/err")"
    elif ! grep -q "hearth convert: .*$pattern" "$TMP/err"; then bad "$desc: message lacks '$pattern': $(cat "$TMP/err")"
    elif compgen -G "$TMP/bad.gguf*" > /dev/null; then bad "$desc: left $(ls "$TMP"/bad.gguf*)"
    else ok; fi
}

# ---- F32: logits and tokenizer -------------------------------------------------------------------
"$BIN" convert "$HF" "$TMP/f32.gguf" --type f32 > "$TMP/out" 2>&1 || bad "convert --type f32: $(cat "$TMP/out")"
grep -q "wrote .*llama, 20 tensors" "$TMP/out" && ok || bad "convert's summary: $(cat "$TMP/out")"
texts=("Once upon a time" "Tom and Lily went to the park. They saw a big dog!" "The end.")
for t in "${texts[@]}"; do
    ids=$("$PY" "$SRC/hf-bpe.py" "$HF" "$t" | tr -d '[] ')
    logits_match "$HF" "$TMP/f32.gguf" "$ids" "logits of '$t'"
done

# tokenizer: fixed texts, then random ones (vocabulary words and characters)
"$PY" - "$HF" > "$TMP/texts.json" <<'PY'
import json, random, sys
tok = json.load(open(sys.argv[1] + "/tokenizer.json"))
chars = sorted({c for t in tok["model"]["vocab"] for c in t if len(c) == 1 and c != "\u2581"} | {" "})
words = [t.replace("\u2581", " ") for t in tok["model"]["vocab"] if "<" not in t]
rnd = random.Random(31)
texts = ["Hello world", "  two  spaces", "tab\tand\nnewline", "Lily's mom said, \"No!\"", "1 2 3 42 100", ""]
for i in range(120):
    if i % 2:
        texts.append("".join(rnd.choice(chars) for _ in range(rnd.randint(1, 30))))
    else:
        texts.append("".join(rnd.choice(words) for _ in range(rnd.randint(1, 8))))
print(json.dumps([t for t in texts if "<|" not in t and "<unk>" not in t]))
PY
mismatch=0
n_texts=0
while IFS= read -r -d '' t; do
    n_texts=$((n_texts + 1))
    want=$("$PY" "$SRC/hf-bpe.py" "$HF" "$t")
    got=$("$BIN" tokenize -m "$TMP/f32.gguf" -p "$t" --ids --no-escape 2>&1)
    if [[ "$want" != "$got" ]]; then
        mismatch=$((mismatch + 1))
        [[ $mismatch -le 3 ]] && echo "  '$t': tokenizer.json $want, hearth $got" >&2
    fi
done < <("$PY" -c 'import json,sys; sys.stdout.write("".join(t + "\0" for t in json.load(open(sys.argv[1]))))' "$TMP/texts.json")
[[ $mismatch -eq 0 && $n_texts -gt 100 ]] && ok || bad "tokenizer: $mismatch of $n_texts texts tokenized differently"

# metadata: llama.cpp's keys
"$BIN" info -m "$TMP/f32.gguf" > "$TMP/info" 2>&1 || "$BIN" info "$TMP/f32.gguf" > "$TMP/info" 2>&1
grep -q "llama" "$TMP/info" && ok || bad "hearth info on the converted file: $(cat "$TMP/info")"

# ---- other types ---------------------------------------------------------------------------------
for ty in auto bf16 q8_0; do
    "$BIN" convert "$HF" "$TMP/$ty.gguf" --type "$ty" > /dev/null 2> "$TMP/err" || bad "--type $ty: $(cat "$TMP/err")"
    out=$("$BIN" run -m "$TMP/$ty.gguf" -p "Once upon a time" -n 12 --temp 0 2> "$TMP/err")
    [[ $out == "Once upon a time, "* ]] && ok || bad "--type $ty: generation '$out' $(cat "$TMP/err")"
done

# ---- sharded and BF16 checkpoints ----------------------------------------------------------------
mkdir -p "$TMP/shard/tinystories-656k-hf" "$TMP/bf16"
"$PY" - "$HF" "$TMP/shard/tinystories-656k-hf" "$TMP/bf16" <<'PY'
import json, os, shutil, struct, sys
import numpy as np
src, shard, bf = sys.argv[1:4]
raw = open(src + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
data = raw[8 + n:]
names = [k for k in head if k != "__metadata__"]

def write(path, tensors):  # tensors: name -> (dtype, shape, bytes)
    h, off, blobs = {}, 0, []
    for k, (dt, shape, b) in tensors.items():
        h[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    hb = json.dumps(h).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))

def t(k):
    b, e = head[k]["data_offsets"]
    return (head[k]["dtype"], head[k]["shape"], data[b:e])

half = len(names) // 2
parts = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
for fn, ks in parts.items():
    write(f"{shard}/{fn}", {k: t(k) for k in ks})
json.dump({"metadata": {}, "weight_map": {k: fn for fn, ks in parts.items() for k in ks}},
          open(shard + "/model.safetensors.index.json", "w"))
def to_bf16(k):
    dt, shape, b = t(k)
    u = np.frombuffer(b, "<u4")
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")  # round to nearest even
    return ("BF16", shape, r.tobytes())
write(bf + "/model.safetensors", {k: to_bf16(k) for k in names})
for d in (shard, bf):
    for f in os.listdir(src):
        if not f.startswith("model."):
            shutil.copy(src + "/" + f, d)
PY
"$BIN" convert "$TMP/shard/tinystories-656k-hf" "$TMP/shard.gguf" --type f32 > /dev/null 2> "$TMP/err" || bad "sharded: $(cat "$TMP/err")"
cmp -s "$TMP/shard.gguf" "$TMP/f32.gguf" && ok || bad "a sharded checkpoint converts to other bytes than the single file"
"$BIN" convert "$TMP/bf16" "$TMP/bf16-f32.gguf" --type f32 > /dev/null 2> "$TMP/err" || bad "bf16 checkpoint: $(cat "$TMP/err")"
logits_match "$TMP/bf16" "$TMP/bf16-f32.gguf" "1,80,147,201,282,57" "BF16 checkpoint"

# ---- refusals ------------------------------------------------------------------------------------
mk() {  # mk NAME: a copy of the checkpoint to break
    rm -rf "$TMP/$1" && mkdir "$TMP/$1" && cp "$HF"/* "$TMP/$1/" && chmod u+w "$TMP/$1"/*
}
mk noarch && sed -i 's/LlamaForCausalLM/GPT2LMHeadModel/' "$TMP/noarch/config.json"
refused "unknown architecture" "$TMP/noarch" "unknown architecture 'GPT2LMHeadModel'"
mk shape && sed -i 's/"intermediate_size": 384/"intermediate_size": 380/' "$TMP/shape/config.json"
refused "wrong shape" "$TMP/shape" "has shape \[384, 128\]; config.json implies \[380, 128\]"
mk layers && sed -i 's/"num_hidden_layers": 2/"num_hidden_layers": 3/' "$TMP/layers/config.json"
refused "missing tensor" "$TMP/layers" "tensor 'model.layers.2.input_layernorm.weight' is missing"
mk extra && sed -i 's/"num_hidden_layers": 2/"num_hidden_layers": 1/' "$TMP/extra/config.json"
refused "unexplained tensor" "$TMP/extra" "has no place in a llama model"
mk trunc && truncate -s -100 "$TMP/trunc/model.safetensors"
refused "truncated safetensors" "$TMP/trunc" "is truncated"
mk tiny && truncate -s 5 "$TMP/tiny/model.safetensors"
refused "a 5-byte safetensors" "$TMP/tiny" "is truncated"
mk notok && rm "$TMP/notok/tokenizer.json"
refused "no tokenizer.json" "$TMP/notok" "tokenizer.json"
mk nost && rm "$TMP/nost/model.safetensors"
refused "no weights" "$TMP/nost" "no model.safetensors"
# hostile safetensors headers: each a copy whose header says something its data cannot be
for case in offsets dtype hugeheader notjson negative; do
    mk "h-$case"
    "$PY" - "$TMP/h-$case/model.safetensors" $case <<'PY'
import json, struct, sys
path, case = sys.argv[1:3]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h, data = json.loads(raw[8:8 + n]), raw[8 + n:]
t = h["model.norm.weight"]
if case == "offsets": t["data_offsets"][1] += 4
if case == "dtype": t["dtype"] = "I64"
if case == "negative": t["shape"] = [-128]
hb = json.dumps(h).encode() if case != "notjson" else b"[1, 2" + b" " * 8
if case == "hugeheader":
    open(path, "wb").write(struct.pack("<Q", 1 << 62) + raw[8:])
else:
    open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + data)
PY
done
refused "data_offsets that disagree with the shape" "$TMP/h-offsets" "data_offsets span 516 bytes, its shape needs 512"
refused "an I64 tensor" "$TMP/h-dtype" "only F32, F16 and BF16"
refused "a header longer than the file" "$TMP/h-hugeheader" "is truncated or not safetensors"
refused "a header that is not JSON" "$TMP/h-notjson" "not a JSON object"
refused "a negative dimension" "$TMP/h-negative" "bad shape"
mk nomerges && "$PY" -c 'import json,sys; p=sys.argv[1]; t=json.load(open(p)); del t["model"]["merges"]; json.dump(t, open(p, "w"))' \
    "$TMP/nomerges/tokenizer.json"
refused "tokenizer.json without merges" "$TMP/nomerges" "no vocab or no merges"
refused "unknown --type" "$HF" --type q4_0 "one of f32, f16, bf16, q8_0, auto"
refused "not a directory" "$TMP/nope" "not a directory"
# an existing output is kept unless --force
echo keep > "$TMP/exists.gguf"
"$BIN" convert "$HF" "$TMP/exists.gguf" > /dev/null 2>&1 && bad "overwrote an existing file" || ok
[[ $(cat "$TMP/exists.gguf") == keep ]] && ok || bad "the existing file was changed"
"$BIN" convert "$HF" "$TMP/exists.gguf" --force > /dev/null 2>&1 && ok || bad "--force did not overwrite"

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
