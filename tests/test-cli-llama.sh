#!/usr/bin/env bash
# llama.cpp's conventions in the hearth command: escapes in -p processed by default (run echoes the
# prompt it was given), --no-escape; llama.cpp's GPU flags refused on every command that runs a
# model, with the reason; `hearth --version` (version and the commit baked in at configure time);
# the man page made from --help lists every command; the load progress bar on a TTY only. Env: HEARTH_BIN, HEARTH_SHARED, HEARTH_SRC.
source "$(dirname "$0")/lib-cli.sh"

# run echoes its prompt: with escapes processed it is the typed text with a real tab
got=$("$BIN" run -m "$M" -p 'a\tb\x41\\' -n 0 2> /dev/null | od -An -c | tr -s ' ')
[[ $got == " a \t b A \\ \n" ]] && ok || bad "run -p escapes: '$got'"
got=$("$BIN" run -m "$M" -p 'a\tb' -n 0 --no-escape 2> /dev/null)
[[ $got == 'a\tb' ]] && ok || bad "run --no-escape: '$got'"

for cmd in run chat eval bench worker; do
    for flag in -ngl --n-gpu-layers --tensor-split -mg; do
        "$BIN" $cmd $flag 1 > /dev/null 2> "$TMP/err"
        rc=$?
        [[ $rc -eq 2 ]] && grep -q "hearth $cmd: $flag: not supported: " "$TMP/err" && ok ||
            bad "$cmd $flag: exit $rc, $(cat "$TMP/err")"
    done
done
"$BIN" run -m "$M" -p x -fa > /dev/null 2> "$TMP/err"
[[ $? -eq 2 ]] && grep -q "one kernel" "$TMP/err" && ok || bad "run -fa: $(cat "$TMP/err")"
"$BIN" run -m "$M" -p x -cnv > /dev/null 2> "$TMP/err"
[[ $? -eq 2 ]] && grep -q "hearth chat" "$TMP/err" && ok || bad "run -cnv: $(cat "$TMP/err")"
"$BIN" run --help | grep -q -- "-ngl, --gpu-layers, --n-gpu-layers" && ok || bad "run --help lacks the refused flags"

v=$("$BIN" --version)
[[ $v =~ ^hearth\ [0-9]+\.[0-9]+\.[0-9]+\ \(commit\ ([0-9a-f]{12}(-dirty)?|unknown)\)$ ]] && ok || bad "--version: '$v'"
# the commit is the source tree's (at configure time: HEAD may have moved since, so a prefix check
# against any commit of the history)
if [[ -n "${HEARTH_SRC:-}" ]] && git -C "$HEARTH_SRC" rev-parse HEAD > /dev/null 2>&1 && [[ $v != *unknown* ]]; then
    c=${v##*commit }; c=${c%)}; c=${c%-dirty}
    git -C "$HEARTH_SRC" cat-file -e "$c^{commit}" 2> /dev/null && ok || bad "--version names commit $c, not in the tree's history"
fi

if [[ -n "${HEARTH_SRC:-}" ]]; then
    bash "$HEARTH_SRC/packaging/gen-man.sh" "$BIN" "$TMP/hearth.1" 0
    for cmd in $("$BIN" --help | sed -n 's/^  \([a-z][a-z-]*\)  .*/\1/p'); do
        grep -q "^.SH \"hearth $cmd\"" "$TMP/hearth.1" && ok || bad "the man page lacks hearth $cmd"
    done
    grep -q -- "--no-escape" "$TMP/hearth.1" && ok || bad "the man page lacks the flags"
fi

# progress bars: loading the weights draws one on a terminal (script(1) gives run a pty), never in a pipe
if command -v script > /dev/null; then
    script -qec "$BIN run -m $M -p Once -n 1" /dev/null > "$TMP/tty" 2>&1
    grep -q 'load  *\[#*\] 100%' "$TMP/tty" && ok || bad "no load progress bar on a TTY: $(head -c 300 "$TMP/tty")"
    "$BIN" run -m "$M" -p Once -n 1 2>&1 | grep -q '\] *[0-9]*%' && bad "a progress bar in a pipe" || ok
else
    echo "skip: no script(1) for the TTY check"
fi

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
