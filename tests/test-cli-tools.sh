#!/usr/bin/env bash
# Tests of `hearth info`, `hearth synth`, `hearth quantize` and `hearth bench`: shapes and types of synthesized and
# quantized files (read back through `info --json`), determinism, refusals (overwrite, IN == OUT,
# oversized vocabulary), usage errors, and — when `hearth eval` is there — that a Q8_0 quantization
# of an F32 file gives nearly the same logits.
# Env: HEARTH_BIN (the hearth binary), HEARTH_SHARED (the shared/ folder with models/).
set -u

BIN=${HEARTH_BIN:-}
SHARED=${HEARTH_SHARED:-../shared}
VOCAB="$SHARED/models/stories260K.gguf"
if [[ -z "$BIN" || ! -x "$BIN" ]]; then
    echo "HEARTH_BIN is not set to the hearth binary; skipping" >&2
    exit 77
fi
if [[ ! -f "$VOCAB" ]]; then
    echo "$VOCAB not found (set HEARTH_SHARED); skipping" >&2
    exit 77
fi
if ! command -v python3 > /dev/null; then
    echo "python3 not found; skipping" >&2
    exit 77
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
not() { ! "$@"; }
check() { # check DESC COMMAND...: passes if the command succeeds
    local desc=$1
    shift
    if "$@"; then ok; else bad "$desc"; fi
}

# jcheck FILE.json PYTHON-EXPR: the expression sees d (the info object) and t (tensors by name)
jcheck() {
    python3 - "$1" "$2" << 'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
t = {x["name"]: x for x in d["tensors"]}
ok = eval("(" + sys.argv[2] + "\n)")
if not ok:
    print("  json check failed: " + sys.argv[2], file=sys.stderr)
sys.exit(0 if ok else 1)
EOF
}

# expect_rc RC DESC COMMAND...: exit status RC and, for errors, a "hearth" message on stderr
expect_rc() {
    local want=$1 desc=$2
    shift 2
    "$@" > "$TMP/out.txt" 2> "$TMP/err.txt"
    local rc=$?
    if [[ $rc -ne $want ]]; then
        bad "$desc: exit $rc, expected $want"
        sed 's/^/  | /' "$TMP/err.txt" >&2
        return
    fi
    if [[ $want -ne 0 ]] && ! grep -q "hearth" "$TMP/err.txt"; then
        bad "$desc: no error message"
        return
    fi
    ok
}

synth() { "$BIN" synth --vocab-from "$VOCAB" "$@" > /dev/null 2>> "$TMP/synth.log"; }
info_json() { "$BIN" info --json "$1" > "$2" 2>> "$TMP/info.log"; }

# ---- synth each type, read it back -------------------------------------------------------------
SHAPE_OK='d["architecture"] == "llama" and d["n_tensors"] == 21 and d["hparams"]["n_embd"] == 256
 and d["hparams"]["n_layer"] == 2 and d["hparams"]["n_head"] == 4 and d["hparams"]["n_head_kv"] == 2
 and d["hparams"]["head_dim"] == 64 and d["hparams"]["n_ff"] == 512 and d["hparams"]["n_vocab"] == 512
 and not d["hparams"]["tied_output"]
 and t["token_embd.weight"]["shape"] == [256, 512] and t["output.weight"]["shape"] == [256, 512]
 and t["blk.0.attn_q.weight"]["shape"] == [256, 256] and t["blk.1.attn_k.weight"]["shape"] == [256, 128]
 and t["blk.0.attn_output.weight"]["shape"] == [256, 256] and t["blk.0.ffn_gate.weight"]["shape"] == [256, 512]
 and t["blk.1.ffn_down.weight"]["shape"] == [512, 256] and t["blk.0.attn_norm.weight"]["shape"] == [256]
 and all(x["type"] == "F32" for x in d["tensors"] if len(x["shape"]) == 1)
 and d["n_bytes"] == sum(x["bytes"] for x in d["tensors"])
 and d["memory"]["n_ctx"] == 2048 and d["memory"]["kv_cache"] == 2 * 2 * 2048 * 2 * 64 * 2
 and d["memory"]["total"] == d["memory"]["weights"] + d["memory"]["kv_cache"] + d["memory"]["scratch"]
 and d["memory"]["weights"] == d["n_bytes"] and d["memory"]["scratch"] > 0'
for T in F32 F16 Q4_0 Q8_0 Q4_K Q6_K Q4_K_M; do
    f="$TMP/test-$T.gguf"
    if ! synth --shape test --type "$T" -o "$f"; then
        bad "synth test $T"
        continue
    fi
    ok
    if ! info_json "$f" "$TMP/$T.json"; then
        bad "info --json test-$T"
        continue
    fi
    check "test-$T shapes" jcheck "$TMP/$T.json" "$SHAPE_OK"
    if [[ $T == Q4_K_M ]]; then
        check "test-$T recipe" jcheck "$TMP/$T.json" 't["output.weight"]["type"] == "Q6_K"
            and t["token_embd.weight"]["type"] == "Q4_K" and t["blk.0.attn_v.weight"]["type"] == "Q4_K"
            and t["blk.1.attn_v.weight"]["type"] == "Q6_K" and t["blk.0.ffn_down.weight"]["type"] == "Q4_K"
            and t["blk.1.ffn_down.weight"]["type"] == "Q6_K" and t["blk.1.ffn_up.weight"]["type"] == "Q4_K"
            and d["file_type"] == 15'
    else
        check "test-$T types" jcheck "$TMP/$T.json" \
            "all(x['type'] == '$T' for x in d['tensors'] if len(x['shape']) == 2)"
    fi
done

# text output names the essentials
if "$BIN" info "$TMP/test-Q4_0.gguf" > "$TMP/info.txt" 2>&1; then
    check "info text" grep -q "KV cache" "$TMP/info.txt"
    check "info text types" grep -q "Q4_0" "$TMP/info.txt"
else
    bad "info text"
fi

# qwen2 (q/k/v biases) and qwen3 (q/k norms)
if synth --shape test-qwen2 -o "$TMP/q2.gguf" && info_json "$TMP/q2.gguf" "$TMP/q2.json"; then
    check "qwen2 biases" jcheck "$TMP/q2.json" 'd["architecture"] == "qwen2" and d["hparams"]["qkv_bias"]
        and t["blk.0.attn_q.bias"]["shape"] == [256] and t["blk.1.attn_v.bias"]["shape"] == [128]
        and t["blk.1.attn_v.bias"]["type"] == "F32"'
else
    bad "synth test-qwen2"
fi
if synth --shape test-qwen3 --type Q8_0 -o "$TMP/q3.gguf" && info_json "$TMP/q3.gguf" "$TMP/q3.json"; then
    check "qwen3 q/k norms" jcheck "$TMP/q3.json" 'd["architecture"] == "qwen3" and d["hparams"]["qk_norm"]
        and t["blk.0.attn_q_norm.weight"]["shape"] == [64] and t["blk.1.attn_k_norm.weight"]["type"] == "F32"'
else
    bad "synth test-qwen3"
fi

# determinism: same seed -> same bytes whatever the thread count; another seed -> other bytes
synth --shape test --type Q4_K -t 1 -o "$TMP/d1.gguf" && synth --shape test --type Q4_K -t 2 -o "$TMP/d2.gguf" &&
    synth --shape test --type Q4_K --seed 7 -o "$TMP/d3.gguf"
check "synth deterministic across thread counts" cmp -s "$TMP/d1.gguf" "$TMP/d2.gguf"
check "synth seed changes the weights" not cmp -s "$TMP/d1.gguf" "$TMP/d3.gguf"

# custom shape: vocabulary padding, fallback for rows that are not a block multiple
expect_rc 0 "synth custom padded vocab" "$BIN" synth --shape custom --n-embd 96 --n-layer 1 --n-head 3 --n-ff 160 \
    --n-vocab 1000 --type Q4_K --vocab-from "$VOCAB" -o "$TMP/custom.gguf"
check "padding is reported" grep -q "PAD" "$TMP/err.txt"
check "fallback is reported" grep -q "instead of Q4_K" "$TMP/err.txt"
if info_json "$TMP/custom.gguf" "$TMP/custom.json"; then
    check "custom shape" jcheck "$TMP/custom.json" 'd["hparams"]["n_vocab"] == 1000 and d["hparams"]["n_embd"] == 96
        and d["hparams"]["head_dim"] == 32 and t["token_embd.weight"]["shape"] == [96, 1000]
        and t["blk.0.attn_q.weight"]["type"] == "Q5_0" and t["blk.0.ffn_down.weight"]["type"] == "Q5_0"'
else
    bad "info custom"
fi
expect_rc 1 "vocabulary larger than n_vocab refused" "$BIN" synth --shape test --n-vocab 100 \
    --vocab-from "$VOCAB" -o "$TMP/small-vocab.gguf"
check "no file after a refusal" test ! -e "$TMP/small-vocab.gguf"

# a real shape with one layer (and a smaller vocabulary, to stay fast under sanitizers)
expect_rc 0 "synth llama-3.2-1b --layers 1" "$BIN" synth --shape llama-3.2-1b --layers 1 --n-vocab 2048 \
    --type Q4_0 --vocab-from "$VOCAB" -o "$TMP/big.gguf"
if info_json "$TMP/big.gguf" "$TMP/big.json"; then
    check "llama-3.2-1b shape" jcheck "$TMP/big.json" 'd["hparams"]["n_vocab"] == 2048
        and d["hparams"]["tied_output"] and "output.weight" not in t and d["hparams"]["rope_base"] == 500000
        and t["token_embd.weight"]["shape"] == [2048, 2048] and t["blk.0.ffn_up.weight"]["shape"] == [2048, 8192]
        and t["blk.0.attn_k.weight"]["shape"] == [2048, 512]'
else
    bad "info llama-3.2-1b"
fi
rm -f "$TMP/big.gguf"

# default output name
(cd "$TMP" && "$BIN" synth --shape test --type Q8_0 --vocab-from "$VOCAB" > /dev/null 2>&1)
check "default output name" test -f "$TMP/test-Q8_0.gguf"

# ---- quantize -----------------------------------------------------------------------------------
F32="$TMP/test-F32.gguf"
for T in Q8_0 Q4_K; do
    if "$BIN" quantize "$F32" "$TMP/qz-$T.gguf" "$T" > /dev/null 2> "$TMP/err.txt" &&
        info_json "$TMP/qz-$T.gguf" "$TMP/qz-$T.json"; then
        check "quantize $T types" jcheck "$TMP/qz-$T.json" "$SHAPE_OK and
            all(x['type'] == '$T' for x in d['tensors'] if len(x['shape']) == 2)"
        check "quantize $T says 1-D tensors are copied" grep -q "copied as they are" "$TMP/err.txt"
    else
        bad "quantize $T"
    fi
done
# quantizing F32 gives the bytes synth writes for that type directly
check "quantize Q8_0 == synth Q8_0" cmp -s "$TMP/qz-Q8_0.gguf" "$TMP/test-Q8_0.gguf"
expect_rc 0 "quantize recipe --keep-embd" "$BIN" quantize "$F32" "$TMP/qz-mix.gguf" q4_k_m --keep-embd -t 1
if info_json "$TMP/qz-mix.gguf" "$TMP/qz-mix.json"; then
    check "quantize recipe types" jcheck "$TMP/qz-mix.json" 't["token_embd.weight"]["type"] == "F32"
        and t["output.weight"]["type"] == "Q6_K" and t["blk.1.ffn_down.weight"]["type"] == "Q6_K"
        and t["blk.0.ffn_down.weight"]["type"] == "Q4_K"'
fi
expect_rc 0 "quantize of a quantized file copies" "$BIN" quantize "$TMP/qz-Q8_0.gguf" "$TMP/qz-again.gguf" Q4_0
check "already-quantized tensors are reported" grep -q "already-quantized" "$TMP/err.txt"

# refusals: existing OUT (file unchanged), IN == OUT
before=$(cksum < "$TMP/qz-Q4_K.gguf")
expect_rc 1 "quantize refuses to overwrite" "$BIN" quantize "$F32" "$TMP/qz-Q4_K.gguf" Q8_0
check "quantize refusal left the file unchanged" test "$before" = "$(cksum < "$TMP/qz-Q4_K.gguf")"
expect_rc 1 "quantize refuses IN == OUT" "$BIN" quantize "$F32" "$F32" Q8_0 --force
before=$(cksum < "$TMP/test-F16.gguf")
expect_rc 1 "synth refuses to overwrite" "$BIN" synth --shape test --type Q4_0 --vocab-from "$VOCAB" \
    -o "$TMP/test-F16.gguf"
check "synth refusal left the file unchanged" test "$before" = "$(cksum < "$TMP/test-F16.gguf")"
expect_rc 0 "synth --force overwrites" "$BIN" synth --shape test --type Q4_0 --vocab-from "$VOCAB" \
    -o "$TMP/test-F16.gguf" --force
check "synth --force changed the file" test "$before" != "$(cksum < "$TMP/test-F16.gguf")"
expect_rc 0 "quantize --force overwrites" "$BIN" quantize "$F32" "$TMP/qz-Q4_K.gguf" Q8_0 --force
check "quantize --force wrote the new type" cmp -s "$TMP/qz-Q4_K.gguf" "$TMP/test-Q8_0.gguf"

# ---- usage and input errors ----------------------------------------------------------------------
expect_rc 2 "synth unknown flag" "$BIN" synth --shape test --bogus
expect_rc 2 "synth without --shape" "$BIN" synth --type Q4_0
expect_rc 2 "synth unknown shape" "$BIN" synth --shape llama-9000
expect_rc 2 "synth unknown type" "$BIN" synth --shape test --type Q9_9
expect_rc 2 "synth bad number" "$BIN" synth --shape test --layers abc
expect_rc 2 "synth flag without value" "$BIN" synth --shape
expect_rc 2 "synth custom without sizes" "$BIN" synth --shape custom --n-embd 64
expect_rc 2 "synth inconsistent heads" "$BIN" synth --shape test --n-head 4 --n-head-kv 3 --vocab-from "$VOCAB" \
    -o "$TMP/never.gguf"
expect_rc 1 "synth missing vocab file" "$BIN" synth --shape test --vocab-from "$TMP/none.gguf" -o "$TMP/never.gguf"
expect_rc 2 "info unknown flag" "$BIN" info --bogus "$F32"
expect_rc 2 "info without a model" "$BIN" info
expect_rc 2 "info bad -c" "$BIN" info -c 0 "$F32"
expect_rc 2 "quantize missing args" "$BIN" quantize "$F32" "$TMP/x.gguf"
expect_rc 2 "quantize unknown type" "$BIN" quantize "$F32" "$TMP/x.gguf" Q7_0
expect_rc 2 "quantize unknown flag" "$BIN" quantize "$F32" "$TMP/x.gguf" Q8_0 --bogus
expect_rc 1 "quantize missing input" "$BIN" quantize "$TMP/none.gguf" "$TMP/x.gguf" Q8_0
check "no file left by failed runs" test ! -e "$TMP/never.gguf" -a ! -e "$TMP/x.gguf"
echo "this is not a model" > "$TMP/not.gguf"
expect_rc 1 "info on a non-GGUF file" "$BIN" info "$TMP/not.gguf"
python3 - "$F32" "$TMP/mamba.gguf" << 'EOF'
import sys
f = bytearray(open(sys.argv[1], "rb").read())
i = f.find(b"llama", f.find(b"general.architecture"))
f[i:i + 5] = b"mamba"
open(sys.argv[2], "wb").write(f)
EOF
expect_rc 1 "info on an unsupported architecture" "$BIN" info "$TMP/mamba.gguf"
check "the message names the architecture" grep -q "mamba" "$TMP/err.txt"
expect_rc 1 "info on a missing file" "$BIN" info "$TMP/none.gguf"
expect_rc 1 "quantize a non-GGUF file" "$BIN" quantize "$TMP/not.gguf" "$TMP/x.gguf" Q8_0
expect_rc 0 "info -c" "$BIN" info -c 128 --json "$F32"
check "info -c sets n_ctx" jcheck "$TMP/out.txt" 'd["memory"]["n_ctx"] == 128
    and d["memory"]["kv_cache"] == 2 * 2 * 128 * 2 * 64 * 2'

for c in info synth quantize run eval bench; do
    expect_rc 0 "$c --help" "$BIN" "$c" --help
    check "$c --help prints usage" grep -q "usage" "$TMP/out.txt"
done

# ---- bench: JSON, and --roofline streams exactly the weights a token reads ------------------------
expect_rc 0 "info --json of stories260K" "$BIN" info --json "$VOCAB"
cp "$TMP/out.txt" "$TMP/info.json"
expect_rc 0 "bench --roofline --json" "$BIN" bench -m "$VOCAB" -t 1,2 -p 8 -n 4 -r 1 --roofline --json
check "bench --roofline: decode_bytes are every tensor but the embedding (the head when tied)" python3 - "$TMP/out.txt" "$TMP/info.json" << 'EOF'
import json, sys
runs = json.load(open(sys.argv[1]))
info = json.load(open(sys.argv[2]))
want = sum(t["bytes"] for t in info["tensors"])
if not info["hparams"]["tied_output"]:
    want -= next(t["bytes"] for t in info["tensors"] if t["name"] == "token_embd.weight")
tg = [r for r in runs if r["test"] == "tg4"]
pp = [r for r in runs if r["test"] == "pp8"]
ok = len(tg) == 2 and len(pp) == 2 and all("of_roofline" not in r for r in pp)
ok = ok and all(r["decode_bytes"] == want and r["roofline_tok_per_s"] > 0 and 0 < r["of_roofline"] < 10
                and abs(r["stream_gb_per_s"] - r["roofline_tok_per_s"] * want / 1e9) < 1e-3 * r["stream_gb_per_s"]
                for r in tg)
if not ok:
    print("  bench --roofline output: %s (want decode_bytes %d)" % (runs, want), file=sys.stderr)
sys.exit(0 if ok else 1)
EOF
# -d: each test after that many tokens of context (positions depth .. depth + n - 1, so a context
# sized for the test alone would refuse them); the roofline only where nothing but weights is read
expect_rc 0 "bench -d" "$BIN" bench -m "$VOCAB" -t 1 -p 8 -n 4 -d 0,600 -b 256 -r 1 --roofline --json
check "bench -d: one row per test and depth, n_depth given, the roofline at depth 0 only" python3 - "$TMP/out.txt" << 'EOF'
import json, sys
runs = json.load(open(sys.argv[1]))
got = sorted((r["test"], r["n_depth"], "of_roofline" in r) for r in runs)
want = [("pp8", 0, False), ("pp8", 600, False), ("tg4", 0, True), ("tg4", 600, False)]
if got != want or not all(r["tok_per_s"] > 0 for r in runs):
    print("  bench -d output: %s, want %s" % (got, want), file=sys.stderr)
    sys.exit(1)
EOF
expect_rc 0 "bench -d table" "$BIN" bench -m "$VOCAB" -t 1 -p 0 -n 2 -d 16 -r 1
check "the table names the depth as llama-bench does" grep -q "tg2 @ d16" "$TMP/out.txt"
expect_rc 2 "bench -d with a negative depth" "$BIN" bench -m "$VOCAB" -p 0 -n 2 -d -5
# a context whose KV cache cannot fit the memory there is: refused before it is allocated, not
# met by the OOM killer partway through (TESTBED_MEM_LIMIT stands for a small device's memory)
TESTBED_MEM_LIMIT=1M expect_rc 1 "bench -d past the memory" "$BIN" bench -m "$VOCAB" -p 0 -n 4 -d 60000 -r 1
check "the message gives the context's need and the memory" grep -q "KV cache and scratch need 40.0 MiB, more than the 1.0 MiB" "$TMP/err.txt"
TESTBED_MEM_LIMIT=1M expect_rc 1 "run -c past the memory" "$BIN" run -m "$VOCAB" -p hi -n 2 -c 60000
check "run says why" grep -q "use a shorter context" "$TMP/err.txt"
TESTBED_MEM_LIMIT=1M expect_rc 1 "eval of more tokens than the memory holds" "$BIN" eval -m "$VOCAB" --tokens "$(python3 -c 'print(",".join(["5"] * 20000))')" --logits "$TMP/big.f32"
check "eval says why" grep -q "use a shorter context" "$TMP/err.txt"
check "eval wrote no logits" test ! -e "$TMP/big.f32"
expect_rc 1 "bench --roofline refuses weights that stream" "$BIN" bench -m "$VOCAB" -p 0 -n 4 -r 1 --roofline --mem-budget 50%
check "the message says why" grep -q "resident" "$TMP/err.txt"

# ---- logits: Q8_0 of an F32 file stays close (needs `hearth eval`) --------------------------------
if "$BIN" eval --help > /dev/null 2>&1; then
    toks=1,400,23,99,7,300,12,5,250,31
    if "$BIN" eval -m "$F32" --tokens $toks --logits "$TMP/f32.logits" > /dev/null 2>&1 &&
        "$BIN" eval -m "$TMP/qz-Q8_0.gguf" --tokens $toks --logits "$TMP/q8.logits" > /dev/null 2>&1; then
        check "Q8_0 logits within 5% relative RMS of F32" python3 - "$TMP/f32.logits" "$TMP/q8.logits" << 'EOF'
import math, struct, sys
a, b = (open(p, "rb").read() for p in sys.argv[1:3])
x = struct.unpack("<%df" % (len(a) // 4), a)
y = struct.unpack("<%df" % (len(b) // 4), b)
assert len(x) == len(y) == 10 * 512
rel = math.sqrt(sum((p - q) ** 2 for p, q in zip(x, y)) / sum(p * p for p in x))
print("  Q8_0 vs F32 relative RMS: %.4f" % rel, file=sys.stderr)
sys.exit(0 if rel < 0.05 else 1)
EOF
    else
        bad "eval of the synthetic files"
    fi
fi

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
