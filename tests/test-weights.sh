#!/usr/bin/env bash
# test-weights: the ways of holding the weights give the same numbers. `hearth eval` writes the
# logits of every position (a prompt batch) and `hearth run --temp 0` a greedy text (decode, one
# token at a time) with the weights loaded into memory and packed for the kernels (the default),
# loaded in the file's layout (--no-repack) and run from the file mapping (--mmap); all must be
# bit-identical. Models: the shared synth Q4_0 (untied output head), Q4_K_M and Q5_K_M (K-quants,
# packed where the table is AVX-512's) and Q8_0 (qwen2; packed where the table is AVX-512's), and
# one-layer Llama-3.2-1B-shape Q4_0 and Q8_0 models with a tied head written here, whose token
# embedding is then packed too (lookups unpack a row). The log must say what was loaded/packed.
set -u
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok: $*"; }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
skip() { echo "SKIPPED: $*"; exit 77; }

BIN=${HEARTH_BIN:-}
[ -n "$BIN" ] && [ -x "$BIN" ] || skip "HEARTH_BIN is not set to the hearth binary"
SHARED=${HEARTH_SHARED:-$(dirname "$0")/../../shared}
[ -f "$SHARED/models/stories260K.gguf" ] || skip "no $SHARED/models (set HEARTH_SHARED)"
TMP=$(mktemp -d /tmp/hearth-weights-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

for t in Q4_0 Q8_0; do
    "$BIN" synth --shape llama-3.2-1b --layers 1 --type $t --n-vocab 512 --vocab-from "$SHARED/models/stories260K.gguf" \
        -o "$TMP/tied-$t.gguf" >"$TMP/synth.log" 2>&1 || { cat "$TMP/synth.log"; bad "synth $t"; }
done
# the AVX2 table has Q4_0's packed kernel, the AVX-512 one Q4_K's, Q5_K's, Q6_K's and Q8_0's too
# (docs/quant.md); the generic and NEON ones have none
simd=$("$BIN" eval -m "$SHARED/models/synth/synth-llama-Q4_0.gguf" --tokens 1 --logits "$TMP/x.f32" --force 2>&1 |
    grep -o 'for the [a-z0-9]* kernels' | head -n1 | awk '{print $3}')

TOKS=1,17,42,99,200,311,5,6,7,8,9,10,11,12,13,14,15,16,250,480
for model in "$SHARED/models/synth/synth-llama-Q4_0.gguf" "$SHARED/models/synth/synth-llama-Q4_K_M.gguf" \
    "$SHARED/models/synth/synth-llama-Q5_K_M.gguf" "$SHARED/models/synth/synth-qwen2-Q8_0.gguf" "$TMP/tied-Q4_0.gguf" \
    "$TMP/tied-Q8_0.gguf"; do
    name=$(basename "$model")
    for mode in default --no-repack --mmap; do
        flags=()
        [ "$mode" = default ] || flags=("$mode")
        "$BIN" eval -m "$model" --tokens "$TOKS" --logits "$TMP/$mode.f32" --force -t 2 "${flags[@]}" \
            >/dev/null 2>"$TMP/$mode.err" || { cat "$TMP/$mode.err"; bad "$name eval $mode"; }
        "$BIN" run -m "$model" -p "Once upon a time" -n 12 --temp 0 --ignore-eos -c 64 -t 2 "${flags[@]}" \
            >"$TMP/$mode.txt" 2>"$TMP/$mode.run.err" || { cat "$TMP/$mode.run.err"; bad "$name run $mode"; }
    done
    for mode in --no-repack --mmap; do
        cmp -s "$TMP/default.f32" "$TMP/$mode.f32" && ok "$name: eval logits with $mode = default's" ||
            bad "$name: eval logits with $mode differ from the default's"
        cmp -s "$TMP/default.txt" "$TMP/$mode.txt" && [ -s "$TMP/default.txt" ] &&
            ok "$name: greedy text with $mode = default's" || bad "$name: greedy text with $mode differs"
    done
    grep -q "loaded into memory" "$TMP/--mmap.err" && bad "$name: --mmap loaded the weights" ||
        ok "$name: --mmap leaves the weights mapped"
    grep -q "loaded into memory (0.0 MiB of it packed" "$TMP/--no-repack.err" &&
        ok "$name: --no-repack loads without packing" || bad "$name: --no-repack: $(cat "$TMP/--no-repack.err")"
    line=$(grep "loaded into memory" "$TMP/default.err")
    case "$name" in
    *Q4_0*|*Q4_K*) # Q4_0's and Q4_K's layouts are in both tables (Q5_K's and Q8_0's in AVX-512's only)
        if [ "$simd" = avx2 ] || [ "$simd" = avx512 ]; then
            echo "$line" | grep -q "(0.0 MiB of it packed" && bad "$name: nothing packed: $line" ||
                ok "$name: packed by default ($line)"
        else
            echo "  (no packed kernel in this table: the packing checks do not apply)"
        fi ;;
    *Q5_K*|*Q8_0*)
        if [ "$simd" = avx512 ]; then
            echo "$line" | grep -q "(0.0 MiB of it packed" && bad "$name: nothing packed: $line" ||
                ok "$name: packed by default ($line)"
        else
            echo "$line" | grep -q "(0.0 MiB of it packed" && ok "$name: copied, no layout for it in the $simd table" ||
                bad "$name: packed without a packed kernel: $line"
        fi ;;
    *) echo "$line" | grep -q "(0.0 MiB of it packed" && ok "$name: copied, nothing to pack" ||
        bad "$name: packed a type without a layout: $line" ;;
    esac
done
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
