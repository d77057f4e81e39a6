#!/usr/bin/env bash
# outputs.sh BIN OUTDIR: writes what a refactor must leave bit-identical — the logits of every shared
# model's reference tokens (eval, 1 and 2 threads; weights loaded and packed, from the mapping, in the
# file's layout) and greedy text (one device, and tensor-parallel / pipeline over two loopback
# workers) — and OUTDIR/SUMS, one md5 per output. Compare two builds with `diff A/SUMS B/SUMS`.
set -euo pipefail
BIN=$(realpath "$1"); OUT=$2
SHARED=${HEARTH_SHARED:-$(dirname "$0")/../../shared}
mkdir -p "$OUT"
toks() { python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["tokens"])))' "$1"; }
for j in "$SHARED"/reference/synth/*.json "$SHARED"/reference/stories260K/public-1.json; do
    name=$(basename "$j" .json)
    model="$SHARED/models/synth/$name.gguf"
    [[ -f $model ]] || model="$SHARED/models/stories260K.gguf"
    t=$(toks "$j")
    for th in 1 2; do
        for w in "" --mmap --no-repack; do
            "$BIN" eval -m "$model" --tokens "$t" -t $th $w --logits "$OUT/$name.t$th${w}.f32" 2>/dev/null
        done
    done
    "$BIN" run -m "$model" -p "Once upon a time" --temp 0 -n 32 -t 2 2>/dev/null > "$OUT/$name.run.txt"
done
# two loopback workers: tensor parallel and pipeline on stories260K and one quantized synth model
WP=(); PIDS=()
trap 'kill ${PIDS[@]} 2>/dev/null; rm -rf "$OUT/cache"' EXIT
for i in 0 1; do
    "$BIN" worker --listen 127.0.0.1:0 --cache "$OUT/cache/$i" -t 1 > "$OUT/w$i.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 100); do grep -q listening "$OUT/w$i.log" && break; sleep 0.05; done
    WP+=("127.0.0.1:$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' "$OUT/w$i.log" | head -1)")
done
W="${WP[0]},${WP[1]}"
export XDG_CACHE_HOME=$OUT/cache/xdg   # the head's own slice file (its share)
for model in "$SHARED/models/stories260K.gguf" "$SHARED/models/synth/synth-llama-Q4_K_M-mix.gguf"; do
    name=$(basename "$model" .gguf)
    "$BIN" run -m "$model" -p "Once upon a time" --temp 0 -n 32 -t 1 --workers "$W" --tp-shares equal 2>/dev/null > "$OUT/$name.tp.txt"
    "$BIN" run -m "$model" -p "Once upon a time" --temp 0 -n 32 -t 1 --workers "$W" --pp 2>/dev/null > "$OUT/$name.pp.txt"
done
rm -f "$OUT"/w*.log
(cd "$OUT" && md5sum *.f32 *.txt | sort -k2 > SUMS)
wc -l < "$OUT/SUMS"
