#!/usr/bin/env bash
# Installs the Debian 12 packages hearth builds and tests with (needs root or sudo).
set -euo pipefail
pkgs=(build-essential cmake pkg-config libjansson-dev libpcre2-dev libglpk-dev libmicrohttpd-dev
      libsodium-dev  # cluster key, Noise handshake and encrypted links (src/net)
      nodejs chromium  # hearth serve's tests: the openai npm client, the web page in headless Chromium
      gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static iproute2 nftables iputils-ping gnuplot-nox python3
      clang libclang-rt-dev  # clang + compiler-rt: libFuzzer for scripts/fuzz.sh
      python3-numpy  # tests/hf-forward.py: the reference forward pass of a converted checkpoint
      dpkg-dev file systemd)  # the .deb (cpack -G DEB with dpkg-shlibdeps) and its units (systemd-analyze verify)
# Debian's npm, unless a nodejs that carries its own (NodeSource's) is there: the two conflict
command -v npm >/dev/null 2>&1 || pkgs+=(npm)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi
