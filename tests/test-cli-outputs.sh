#!/usr/bin/env bash
# --force and what the output path is: `eval --logits`, `synth -o` and `quantize` replace a regular
# file atomically, but write through a symbolic link, a FIFO or a device without replacing it by a
# regular file, and fail (non-zero exit, a message) on every write error (/dev/full behind a link).
# Env: HEARTH_BIN (the hearth binary), HEARTH_SHARED (the shared/ folder with models/).
set -u
source "$(dirname "$0")/lib-cli.sh"
if [[ ! -w /dev/full ]]; then echo "/dev/full is not writable here; skipping" >&2; exit 77; fi
READER=
cleanup() { [[ -n "$READER" ]] && kill -9 "$READER" 2> /dev/null; wait 2> /dev/null; rm -rf "$TMP"; }

# each command writes its output to the path given last
ev() { timeout 60 "$BIN" eval -m "$M" --tokens 1,2,3 --force --logits "$1"; }
sy() { timeout 60 "$BIN" synth --vocab-from "$M" --shape test --force -o "$1"; }
qu() { timeout 60 "$BIN" quantize --force "$M" "$1" q8_0; }

for cmd in ev sy qu; do
    # a regular file: replaced, and no .tmp left
    echo old > "$TMP/reg"
    if $cmd "$TMP/reg" > /dev/null 2> "$TMP/err" && [[ -f "$TMP/reg" && $(stat -c %s "$TMP/reg") -gt 4 ]] &&
        [[ ! -e "$TMP/reg.tmp" ]]; then ok; else bad "$cmd: regular file not replaced: $(tail -1 "$TMP/err")"; fi

    # a link to a regular file: the target gets the data, the link stays a link
    echo old > "$TMP/target"
    ln -sfn "$TMP/target" "$TMP/link"
    if $cmd "$TMP/link" > /dev/null 2> "$TMP/err" && [[ -L "$TMP/link" && $(stat -c %s "$TMP/target") -gt 4 ]]; then ok
    else bad "$cmd: a symbolic link was replaced or its target not written: $(tail -1 "$TMP/err")"; fi

    # a link to /dev/full: the write fails, the command fails, the link stays
    ln -sfn /dev/full "$TMP/full"
    $cmd "$TMP/full" > /dev/null 2> "$TMP/err"
    rc=$?
    if [[ $rc -ne 0 ]] && grep -q "hearth" "$TMP/err"; then ok; else bad "$cmd: writing to /dev/full exited $rc"; fi
    if [[ -L "$TMP/full" ]]; then ok; else bad "$cmd: the link to /dev/full was replaced by a regular file"; fi
    [[ -e "$TMP/full.tmp" ]] && bad "$cmd: $TMP/full.tmp left behind"

    # a FIFO: its reader gets every byte, it stays a FIFO
    rm -f "$TMP/fifo"
    mkfifo "$TMP/fifo"
    (timeout 20 cat "$TMP/fifo" | wc -c > "$TMP/fifo.n") &
    READER=$!
    $cmd "$TMP/fifo" > /dev/null 2> "$TMP/err"
    rc=$?
    wait "$READER"
    READER=
    if [[ $rc -eq 0 && -p "$TMP/fifo" && $(cat "$TMP/fifo.n") -gt 4 ]]; then ok
    else bad "$cmd: FIFO: exit $rc, $(cat "$TMP/fifo.n" 2> /dev/null) bytes read, $(stat -c %F "$TMP/fifo")"; fi
done

echo "test-cli-outputs: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
