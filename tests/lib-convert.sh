# Shared by the converter's tests (test-convert.sh, test-convert-qwen.sh), after lib-cli.sh: PY, a
# python3 with numpy (exit 77, skipped, without one), SRC (tests/), and logits_match.
PY=""
for p in /usr/bin/python3 python3; do
    if "$p" -c 'import numpy' 2>/dev/null; then PY=$p; break; fi
done
[[ -n "$PY" ]] || { echo "no python3 with numpy (apt-get install python3-numpy); skipping" >&2; exit 77; }
SRC=$(cd "$(dirname "$0")" && pwd)

# logits_match DIR GGUF IDS DESC: hearth's logits of IDS on GGUF against the reference pass on DIR
logits_match() {
    local dir=$1 gguf=$2 ids=$3 desc=$4
    "$PY" "$SRC/hf-forward.py" "$dir" "$ids" "$TMP/ref.f32" || { bad "$desc: reference pass failed"; return; }
    "$BIN" eval -m "$gguf" --tokens "$ids" --logits "$TMP/got.f32" --kv-type f32 --force 2> "$TMP/err" ||
        { bad "$desc: hearth eval failed: $(cat "$TMP/err")"; return; }
    local r
    r=$("$PY" - "$TMP/ref.f32" "$TMP/got.f32" "$ids" <<'PY'
import sys, numpy as np
n = len(sys.argv[3].split(","))
a = np.fromfile(sys.argv[1], "<f4").reshape(n, -1).astype(np.float64)
b = np.fromfile(sys.argv[2], "<f4").reshape(n, -1).astype(np.float64)
rel = (np.abs(a - b).max(1) / np.abs(a).max(1)).max()
print(f"{rel:.3g}", "ok" if rel <= 1e-4 and (a.argmax(1) == b.argmax(1)).all() else "bad")
PY
)
    [[ $r == *" ok" ]] && ok || bad "$desc: logits differ from the reference (largest relative difference $r)"
    echo "  $desc: largest relative difference ${r% *}" >&2
}

