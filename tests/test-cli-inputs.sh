#!/usr/bin/env bash
# Inputs without limits: `run -f` and `tokenize -f` refuse what is neither a regular file nor a pipe
# (a directory, /dev/zero) and read no more than a bound (run: what the context can hold; tokenize:
# a fixed limit), so an endless pipe ends in an error within seconds instead of the OOM killer.
# Env: HEARTH_BIN (the hearth binary), HEARTH_SHARED (the shared/ folder with models/).
set -u
source "$(dirname "$0")/lib-cli.sh"
# the address space is capped (not under the sanitizers, which reserve terabytes) so that a reader
# without a bound fails here rather than taking the machine's memory
limit() {
    if [[ "${HEARTH_SANITIZED:-}" != ON ]]; then ulimit -v 4000000; fi
    timeout 30 "$@"
}

# expect_err DESC PATTERN COMMAND...: a non-zero exit whose message matches PATTERN
expect_err() {
    local desc=$1 pat=$2
    shift 2
    "$@" > "$TMP/out" 2> "$TMP/err"
    local rc=$?
    if [[ $rc -ne 0 && $rc -ne 124 ]] && grep -q "$pat" "$TMP/err"; then ok
    else bad "$desc: exit $rc, $(grep -v '^weights' "$TMP/err" | tail -1)"; fi
}

for cmd in run tokenize; do
    expect_err "$cmd -f DIRECTORY" "not a regular file or a pipe" limit "$BIN" $cmd -m "$M" -f "$TMP"
    expect_err "$cmd -f /dev/zero" "not a regular file or a pipe" limit "$BIN" $cmd -m "$M" -f /dev/zero
done
# an endless pipe: stopped at the bound
expect_err "run -f endless pipe" "context of 256 tokens" \
    limit bash -c "yes 'Once upon a time' | \"$BIN\" run -m \"$M\" -c 256 -n 2 -f /dev/stdin"
expect_err "tokenize --stdin endless pipe" "more than" \
    limit bash -c "yes 'Once upon a time' | \"$BIN\" tokenize -m \"$M\" --stdin"
# a file larger than the context can take
head -c 200000 /dev/zero | tr '\0' 'a' > "$TMP/big.txt"
expect_err "run -f big file, -c 256" "context of 256 tokens" limit "$BIN" run -m "$M" -c 256 -n 2 -f "$TMP/big.txt"
# a pipe and a regular file within the bounds still work
echo "Once upon a time" > "$TMP/p.txt"
if limit "$BIN" run -m "$M" -n 4 --temp 0 -f "$TMP/p.txt" > "$TMP/a" 2> /dev/null &&
    limit "$BIN" run -m "$M" -n 4 --temp 0 -f /dev/stdin < "$TMP/p.txt" > "$TMP/b" 2> /dev/null &&
    cmp -s "$TMP/a" "$TMP/b" && [[ -s "$TMP/a" ]]; then ok; else bad "run -f FILE and -f PIPE differ or failed"; fi
if [[ $(limit "$BIN" tokenize -m "$M" --ids -f "$TMP/p.txt" 2> /dev/null) == \[*\] ]]; then ok
else bad "tokenize -f FILE failed"; fi

echo "test-cli-inputs: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
