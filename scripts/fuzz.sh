#!/usr/bin/env bash
# Builds every libFuzzer harness tests/fuzz-NAME.c with clang, ASan and UBSan, seeds it and runs it
# for SECONDS (default 30) each. A crash, sanitizer report, leak or failed check fails the script; the
# input that did it is left in OUT/NAME-crashes/. docs/hardening.md has the harnesses and how to
# reproduce a finding.
#
# A harness says how it is built and seeded in comment lines of its own (all optional):
#   // fuzz-sources: GLOB...      library sources it links (default: every src/*/*.c but src/cli and
#                                 serve/http.c; the quant kernels are the generic ones)
#   // fuzz-libs: -lX...          libraries beyond the default set (sodium, jansson, pcre2-8, pthread, m)
#   // fuzz-max-len: N            longest input tried (default 4096)
#   // fuzz-seed-test: TEST ENV   BUILD_DIR/TEST writes seed files into the folder the variable ENV names
#   // fuzz-dict: FILE            a libFuzzer dictionary (tokens the input format is made of)
# Seeds also come from the committed corpora tests/fuzz-corpus/NAME/ (and tests/corpus/NAME/,
# tests/data/NAME/, where the first harnesses of other work keep theirs). The harness runs with
# HEARTH_SHARED set (../shared by default), so it may load models or vocabularies at start-up.
#
# usage: scripts/fuzz.sh [-t SECONDS] [-b BUILD_DIR (default build)] [-o OUT (default BUILD_DIR/fuzz)]
#                        [-j JOBS (parallel builds, default 2)] [NAME...]   (default: every harness)
# Runs from anywhere; needs clang (Debian's `clang` package brings libFuzzer) and ../shared.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=30 build=build out="" jobs=2
while getopts "t:b:o:j:" opt; do
  case $opt in
    t) secs=$OPTARG ;;
    b) build=$OPTARG ;;
    o) out=$OPTARG ;;
    j) jobs=$OPTARG ;;
    *) echo "usage: $0 [-t SECONDS] [-b BUILD_DIR] [-o OUT] [-j JOBS] [NAME...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
out=${out:-$build/fuzz}
command -v clang >/dev/null || { echo "fuzz.sh: clang not found (apt-get install clang)" >&2; exit 2; }
export HEARTH_SHARED="${HEARTH_SHARED:-$PWD/../shared}"
mkdir -p "$out"

names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in tests/fuzz-*.c; do names+=("$(basename "$f" .c)"); done
fi

flags=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Isrc)
default_libs=(-Wl,--as-needed -lsodium -ljansson -lpcre2-8 -lmicrohttpd -lglpk -lpthread -lm)

# directive FILE KEY: the value of "// fuzz-KEY: value" in FILE ("" if none)
directive() { sed -n "s|^// fuzz-$2: *||p" "$1" | head -1; }

build_one() { # NAME
  local name=$1 src=tests/$1.c srcs libs
  srcs=$(directive "$src" sources)
  if [ -z "$srcs" ]; then
    srcs=$(ls src/*/*.c | grep -v -e '^src/cli/' -e '^src/serve/http.c$')
  else
    srcs=$(eval "ls $srcs")   # the globs, expanded here
  fi
  libs=$(directive "$src" libs)
  # shellcheck disable=SC2086
  clang "${flags[@]}" "$src" $srcs $libs "${default_libs[@]}" -o "$out/$name" 2>"$out/$name.build.log" || {
    cat "$out/$name.build.log" >&2
    echo "fuzz.sh: $name does not build" >&2
    return 1
  }
}

# builds in parallel (a harness's build is one clang process over its sources)
echo "== build: ${names[*]}"
pids=()
for name in "${names[@]}"; do
  [ -f "tests/$name.c" ] || { echo "fuzz.sh: no tests/$name.c" >&2; exit 2; }
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.2; done
  build_one "$name" & pids+=($!)
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
[ $failed -eq 0 ] || exit 1

run() { # NAME
  local name=$1 src=tests/$1.c max_len seed dict
  max_len=$(directive "$src" max-len)
  dict=$(directive "$src" dict)
  seed=$(directive "$src" seed-test)
  rm -rf "$out/$name-corpus" && mkdir -p "$out/$name-corpus" "$out/$name-crashes"
  if [ -n "$seed" ]; then
    local test=${seed% *} env=${seed#* }
    [ -x "$build/$test" ] || { echo "fuzz.sh: $build/$test not built (cmake --build $build)" >&2; return 1; }
    env "$env=$out/$name-corpus" "$build/$test" >/dev/null
  fi
  for d in "tests/fuzz-corpus/$name" "tests/corpus/$name" "tests/data/$name"; do
    if [ -d "$d" ]; then cp "$d"/* "$out/$name-corpus/" 2>/dev/null || true; fi
  done
  echo "== $name: $(ls "$out/$name-corpus" | wc -l) seeds, ${secs}s"
  "$out/$name" -max_total_time="$secs" -max_len="${max_len:-4096}" -print_final_stats=1 \
 ${dict:+-dict="$dict"} \
    -artifact_prefix="$out/$name-crashes/" "$out/$name-corpus" 2>"$out/$name.log" || {
    tail -40 "$out/$name.log" >&2
    echo "fuzz.sh: $name found a bug; the input is in $out/$name-crashes/" >&2
    return 1
  }
  local units secs_run
  units=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$name.log")
  secs_run=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$out/$name.log")
  echo "  $units execs in ${secs_run:-?} s ($(( units / (${secs_run:-1} > 0 ? ${secs_run:-1} : 1) )) /s)," \
       "$(sed -n 's/^stat::peak_rss_mb: *//p' "$out/$name.log") MB peak, $(ls "$out/$name-corpus" | wc -l) in the corpus"
}

status=0
for name in "${names[@]}"; do run "$name" || status=1; done
exit $status
