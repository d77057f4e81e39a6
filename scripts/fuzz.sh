#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz-gguf.c, fuzz-net.c, fuzz-discover.c, fuzz-noise.c,
# fuzz-dgram.c) with clang, ASan and UBSan, seeds each from a build's test-gguf / test-net /
# test-discover / test-dgram and from its corpus in tests/data/NAME/ or tests/corpus/NAME/ if there is
# one, and runs each for SECONDS (default 45).
# A crash, sanitizer report or failed check fails the script; the input that did it is left in OUT.
#
# usage: scripts/fuzz.sh [-t SECONDS] [-b BUILD_DIR (default build)] [-o OUT (default BUILD_DIR/fuzz)]
# Runs from anywhere; needs clang (Debian's `clang` package brings libFuzzer) and ../shared.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=45 build=build out=""
while getopts "t:b:o:" opt; do
  case $opt in
    t) secs=$OPTARG ;;
    b) build=$OPTARG ;;
    o) out=$OPTARG ;;
    *) echo "usage: $0 [-t SECONDS] [-b BUILD_DIR] [-o OUT]" >&2; exit 2 ;;
  esac
done
out=${out:-$build/fuzz}
for t in test-gguf test-net test-discover test-dgram; do
  [ -x "$build/$t" ] || { echo "fuzz.sh: $build/$t not built (cmake --build $build)" >&2; exit 2; }
done
command -v clang >/dev/null || { echo "fuzz.sh: clang not found (apt-get install clang)" >&2; exit 2; }
mkdir -p "$out"

flags=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Isrc)
# the sources each harness reaches: the reader and its dependencies, generic kernels only
gguf_src=(tests/fuzz-gguf.c src/gguf/*.c src/base/*.c src/quant/*.c)
net_src=(tests/fuzz-net.c src/net/proto.c src/base/*.c)
discover_src=(tests/fuzz-discover.c src/net/discover.c src/net/proto.c src/net/tcp.c src/net/noise.c src/base/*.c)
noise_src=(tests/fuzz-noise.c src/net/noise.c src/net/proto.c src/base/*.c)
dgram_src=(tests/fuzz-dgram.c src/net/dgram.c src/net/noise.c src/net/proto.c src/base/*.c)

run() { # NAME MAX_LEN SEED_ENV SEED_TEST SOURCES... (SEED_TEST "-": the corpus in tests/corpus/NAME)
  local name=$1 max_len=$2 seed_env=$3 seed_test=$4
  shift 4
  echo "== $name: build"
  clang "${flags[@]}" "$@" -lsodium -lpthread -lm -o "$out/$name"
  rm -rf "$out/$name-corpus" && mkdir -p "$out/$name-corpus" "$out/$name-crashes"
  if [ "$seed_test" != - ]; then
    env "$seed_env=$out/$name-corpus" HEARTH_SHARED="${HEARTH_SHARED:-$PWD/../shared}" \
      "$build/$seed_test" >/dev/null
  fi
  for d in tests/data/$name tests/corpus/$name; do
    if [ -d "$d" ]; then cp "$d"/* "$out/$name-corpus/"; fi
  done
  echo "== $name: $(ls "$out/$name-corpus" | wc -l) seeds, ${secs}s"
  "$out/$name" -max_total_time="$secs" -max_len="$max_len" -print_final_stats=1 \
    -artifact_prefix="$out/$name-crashes/" "$out/$name-corpus" 2>"$out/$name.log" || {
    tail -40 "$out/$name.log" >&2
    echo "fuzz.sh: $name found a bug; the input is in $out/$name-crashes/" >&2
    return 1
  }
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$out/$name.log" | sed "s/^/  /"
}

run fuzz-gguf 65536 HEARTH_GGUF_SEED_DIR test-gguf "${gguf_src[@]}"
run fuzz-net 4096 HEARTH_NET_SEED_DIR test-net "${net_src[@]}"
run fuzz-discover 1024 HEARTH_DISCOVER_SEED_DIR test-discover "${discover_src[@]}"
run fuzz-noise 512 - - "${noise_src[@]}"
run fuzz-dgram 2048 HEARTH_DGRAM_SEED_DIR test-dgram "${dgram_src[@]}"
