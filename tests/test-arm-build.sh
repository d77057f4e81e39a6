#!/bin/bash
# test-arm-build — the AArch64 kernels (src/quant/arch/arm/*.c) and the dispatch table compile
# warning-free with the cross compiler, both for baseline ARMv8-A NEON and with the dot-product
# extension.  Where qemu-aarch64 and the AArch64 C library are installed, test-quant is also built
# for AArch64 and run under emulation (NEON kernels, the dotprod variant and HEARTH_NO_SIMD=1), so
# the NEON code is checked against the reference kernels, not only compiled.
# Needs gcc-aarch64-linux-gnu (skipped, exit 77, without it); qemu-user-static is optional.
set -u
src=${HEARTH_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
cc=aarch64-linux-gnu-gcc
if ! command -v "$cc" >/dev/null 2>&1; then
    echo "SKIPPED: $cc not found (Debian package gcc-aarch64-linux-gnu)"
    exit 77
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }

flags=(-std=c11 -O2 -Wall -Wextra -Werror "-I$src/src" -DHEARTH_ARCH_ARM=1)

# 1. every ARM kernel file and the table, as the brief for this target says they must build
for f in "$src"/src/quant/arch/arm/*.c "$src/src/quant/quant.c"; do
    [ -e "$f" ] || continue
    if "$cc" "${flags[@]}" -c "$f" -o "$tmp/$(basename "$f" .c).o" 2>"$tmp/err"; then
        ok "compile ${f#"$src"/}"
    else
        bad "compile ${f#"$src"/}"
        cat "$tmp/err"
    fi
done
# 2. the kernel files again with SDOT available (the __ARM_FEATURE_DOTPROD paths)
for f in "$src"/src/quant/arch/arm/*.c; do
    [ -e "$f" ] || continue
    if "$cc" "${flags[@]}" -march=armv8.2-a+dotprod -c "$f" -o "$tmp/dp-$(basename "$f" .c).o" 2>"$tmp/err"; then
        ok "compile ${f#"$src"/} (+dotprod)"
    else
        bad "compile ${f#"$src"/} (+dotprod)"
        cat "$tmp/err"
    fi
done

# 3. run test-quant under qemu, if it is there
qemu=""
for q in qemu-aarch64-static qemu-aarch64; do
    if command -v "$q" >/dev/null 2>&1; then qemu=$q; break; fi
done
if [ -z "$qemu" ]; then
    echo "note: qemu-aarch64 not found (Debian package qemu-user-static): NEON kernels compiled, not run"
else
    # the same sources the CMake build links into test-quant (modules base quant)
    lib=("$src"/src/base/*.c "$src"/src/quant/*.c "$src"/src/quant/arch/arm/*.c)
    run_flags=(-std=gnu11 -O2 -static "-I$src/src" "-I$src/tests" -DHEARTH_ARCH_ARM=1)
    for variant in neon dotprod; do
        extra=()
        [ "$variant" = dotprod ] && extra=(-march=armv8.2-a+dotprod)
        exe="$tmp/test-quant-$variant"
        if ! "$cc" "${run_flags[@]}" "${extra[@]}" "$src/tests/test-quant.c" "${lib[@]}" -lm -lpthread \
            -o "$exe" 2>"$tmp/err"; then
            if grep -q "cannot find -lc\|cannot find crt1.o" "$tmp/err"; then
                echo "note: no static AArch64 C library (libc6-dev-arm64-cross): not run"
                break
            fi
            bad "link test-quant ($variant)"
            cat "$tmp/err"
            continue
        fi
        # qemu's default CPU model ("max") has the dot-product extension
        if "$qemu" "$exe" --no-reexec >"$tmp/out" 2>&1; then
            ok "test-quant under $qemu ($variant): $(tail -n 1 "$tmp/out")"
        else
            bad "test-quant under $qemu ($variant)"
            cat "$tmp/out"
        fi
        if [ "$variant" = neon ]; then
            if HEARTH_NO_SIMD=1 "$qemu" "$exe" --no-reexec >"$tmp/out" 2>&1; then
                ok "test-quant under $qemu (HEARTH_NO_SIMD=1): $(tail -n 1 "$tmp/out")"
            else
                bad "test-quant under $qemu (HEARTH_NO_SIMD=1)"
                cat "$tmp/out"
            fi
        fi
    done
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
