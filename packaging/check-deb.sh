#!/usr/bin/env bash
# Checks a hearth .deb (CI's packaging stage): its control data declares the libraries the binary
# needs; unpacked into an empty directory tree, the binary runs (`hearth --version`) and the man
# page and config files are there; the systemd units pass `systemd-analyze verify` against that
# tree; and where systemd runs the machine (PID 1), the package is installed and the worker unit
# started and stopped. Usage: check-deb.sh PACKAGE.deb
set -euo pipefail
deb=$(realpath "$1")
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
fail() { echo "check-deb: $*" >&2; exit 1; }

depends=$(dpkg-deb -f "$deb" Depends)
for lib in libc6 libjansson4 libpcre2-8; do
    [[ $depends == *"$lib"* ]] || fail "Depends lacks $lib: $depends"
done
dpkg-deb -x "$deb" "$tree"
for f in usr/bin/hearth usr/share/man/man1/hearth.1 etc/hearth/worker.conf etc/hearth/serve.conf \
         usr/lib/systemd/system/hearth-worker.service usr/lib/systemd/system/hearth-serve.service; do
    [[ -e "$tree/$f" ]] || fail "the package lacks /$f"
done
version=$("$tree/usr/bin/hearth" --version) || fail "hearth --version failed"
[[ $version =~ ^hearth\ [0-9]+\.[0-9]+\.[0-9]+\ \(commit\ [0-9a-f]+(-dirty)?\)$|\(commit\ unknown\)$ ]] ||
    fail "unexpected --version: $version"
echo "check-deb: $version; Depends: $depends"
grep -q "hearth convert" "$tree/usr/share/man/man1/hearth.1" || fail "the man page lacks hearth convert"
man -l "$tree/usr/share/man/man1/hearth.1" > /dev/null 2>&1 || ! command -v man > /dev/null || fail "man cannot read hearth.1"

# The units: systemd-analyze verify checks their syntax and options and that ExecStart's binary is
# executable, so each is verified as a copy whose paths point into the unpacked tree (the host has
# no /usr/bin/hearth). Its man page is checked above (--man=no: not installed on the host).
if command -v systemd-analyze > /dev/null; then
    mkdir -p "$tree/verify"
    for u in hearth-worker hearth-serve; do
        sed -e "s|/usr/bin/hearth|$tree/usr/bin/hearth|" -e "s|/etc/hearth/|$tree/etc/hearth/|" \
            "$tree/usr/lib/systemd/system/$u.service" > "$tree/verify/$u.service"
        out=$(systemd-analyze verify --man=no "$tree/verify/$u.service" 2>&1) ||
            fail "systemd-analyze verify $u.service: $out"
        # warnings about other units of the host are not ours; any about this one are
        if grep -q "$u.service" <<< "$out"; then fail "systemd-analyze verify $u.service: $out"; fi
    done
    echo "check-deb: systemd-analyze verify: both units clean"
else
    echo "check-deb: no systemd-analyze here; units not verified" >&2
fi

# A machine whose PID 1 is systemd: install, start the worker, see it listening, stop it.
if [[ -d /run/systemd/system && $(id -u) -eq 0 ]]; then
    dpkg -i "$deb"
    systemctl start hearth-worker
    sleep 2
    systemctl is-active --quiet hearth-worker || { journalctl -u hearth-worker --no-pager | tail -20; fail "hearth-worker did not start"; }
    systemctl stop hearth-worker
    dpkg -r hearth
    echo "check-deb: hearth-worker started and stopped under systemd"
else
    echo "check-deb: systemd is not PID 1 here: the worker unit was verified, not started"
fi
