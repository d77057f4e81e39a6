#!/bin/bash
# test-testbed — the emulated cluster does what its profile says, and `down` leaves nothing behind.
#   linkem: --help, bad flags, a TCP relay's RTT and rate, a UDP relay's loss, clean SIGTERM exit;
#   testbed: up pair2 (2 devices, 100 Mbit/s, RTT 4 ms), exec inside a device (netns + cgroups, exit
#   status), RTT / throughput / CPU / memory cap against the profile, loss via nftables, a failed `up`
#   cleans up, and `down` leaves no namespace, cgroup, nft table, state or process.
# Needs root and network namespaces; otherwise prints "SKIPPED: reason" and exits 77.
# Env: HEARTH_SRC (source dir), HEARTH_BUILD (build dir with linkem).
set -u
SRC=${HEARTH_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
BUILD=${HEARTH_BUILD:-$SRC/build}
LINKEM=$BUILD/linkem
INST=ci$(( $$ % 1000000 ))
TB=("$SRC/tools/testbed" --instance "$INST")
export HEARTH_LINKEM=$LINKEM
TMP=$(mktemp -d /tmp/test-testbed.XXXXXX)
PASS=0
FAIL=0
BG=()

ok()  { PASS=$((PASS + 1)); echo "ok   - $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL - $*"; }
# check DESCRIPTION CMD...: passes when CMD succeeds
check() { local d=$1; shift; if "$@"; then ok "$d"; else bad "$d"; fi; }
# within VALUE LO HI
within() { python3 -c "import sys; v,lo,hi=map(float,sys.argv[1:]); sys.exit(0 if lo<=v<=hi else 1)" "$1" "$2" "$3"; }
jget() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$1" "$2"; }

cleanup() {
    for p in "${BG[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    "${TB[@]}" down >/dev/null 2>&1
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- can this machine do it at all? --------------------------------------------------------------
if [ "$(id -u)" != 0 ]; then echo "SKIPPED: needs root (network namespaces, cgroups)"; exit 77; fi
for t in ip nft python3 ping; do
    command -v $t >/dev/null || { echo "SKIPPED: $t is not installed"; exit 77; }
done
if ! ip netns add "hbprobe$INST" 2>"$TMP/ns.err"; then
    echo "SKIPPED: cannot create network namespaces: $(cat "$TMP/ns.err")"; exit 77
fi
ip netns del "hbprobe$INST"
if [ ! -x "$LINKEM" ]; then echo "FAIL - $LINKEM is not built"; echo "0 passed, 1 failed"; exit 1; fi
T0=$(date +%s)

# ---- linkem on its own --------------------------------------------------------------------------
"$LINKEM" --help >"$TMP/help" 2>&1
check "linkem --help exits 0" test $? = 0
grep -q "linkem tun" "$TMP/help" && grep -q -- "--up-delay" "$TMP/help" && grep -q -- "--node" "$TMP/help"
check "linkem --help lists tun, relay, --node and --up-delay" test $? = 0
"$LINKEM" relay --tcp 7000=127.0.0.1:7001 --delay 3xs >/dev/null 2>"$TMP/err"; rc=$?
check "linkem: bad delay value exits 2 with a message" test $rc = 2 -a -s "$TMP/err"
"$LINKEM" frobnicate >/dev/null 2>&1
check "linkem: unknown mode exits 2" test $? = 2
"$LINKEM" relay --delay 1ms >/dev/null 2>&1
check "linkem: relay without a mapping exits 2" test $? = 2
"$LINKEM" tun --name x --bogus 1 >/dev/null 2>&1
check "linkem: unknown option exits 2" test $? = 2

# a TCP echo + bulk sink, a UDP counter: the far ends of the relay
cat >"$TMP/peer.py" <<'EOF'
import socket, sys, threading, time, json
mode, a = sys.argv[1], sys.argv[2:]
if mode == "server":          # TCP echo on port a[0], UDP counter on port a[1]
    t = socket.create_server(("127.0.0.1", int(a[0])))
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", int(a[1])))
    def udp():
        while True:
            d, peer = u.recvfrom(2048); u.sendto(d, peer)
    threading.Thread(target=udp, daemon=True).start()
    def serve(c):
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            d = c.recv(1 << 20)
            if not d: break
            if d[:1] == b"p": c.sendall(d)
        c.close()
    print("ready", flush=True)
    while True:
        c, _ = t.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
elif mode == "rtt":
    c = socket.create_connection(("127.0.0.1", int(a[0]))); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    r = []
    for i in range(20):
        t = time.perf_counter(); c.sendall(b"p" * 64); n = 0
        while n < 64: n += len(c.recv(64))
        r.append((time.perf_counter() - t) * 1e3)
    print(min(r))   # the relay's delay is a floor; load only adds to it (medians of 6.4 ms seen under ctest -j2)
elif mode == "bulk":          # seconds a[1]; prints Mbit/s the relay let through (sender side, after the first 0.5 s)
    c = socket.create_connection(("127.0.0.1", int(a[0]))); buf = b"x" * 65536
    end = time.monotonic() + float(a[1]); mark = None; sent = 0
    while time.monotonic() < end:
        c.sendall(buf)
        if mark is None and time.monotonic() > end - float(a[1]) + 0.5: mark = (time.monotonic(), sent)
        sent += len(buf)
    print((sent - mark[1]) * 8 / (time.monotonic() - mark[0]) / 1e6)
elif mode == "udp":           # count a[1]: prints the fraction that came back
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1.0)
    n = int(a[1]); got = [0]
    s.connect(("127.0.0.1", int(a[0])))
    def reader():             # read while sending: a full receive buffer would look like loss
        try:
            while True: s.recv(64); got[0] += 1
        except socket.timeout: pass
    r = threading.Thread(target=reader); r.start()
    for i in range(n):
        s.send(b"x" * 32)
        if i % 20 == 19: time.sleep(0.002)
    r.join()
    print(got[0] / n)
EOF
P=$(( 20000 + $$ % 20000 ))
python3 "$TMP/peer.py" server $((P + 1)) $((P + 3)) >"$TMP/server.out" 2>&1 &
BG+=($!)
"$LINKEM" relay --tcp 127.0.0.1:$P=127.0.0.1:$((P + 1)) --udp 127.0.0.1:$((P + 2))=127.0.0.1:$((P + 3)) \
    --up-delay 2ms --down-delay 3ms --rate 50mbit --up-loss 20 --seed 7 --ready-file "$TMP/relay.ready" \
    --stats 2>"$TMP/relay.err" &
LPID=$!
BG+=($LPID)
for i in $(seq 50); do [ -s "$TMP/relay.ready" ] && grep -q ready "$TMP/server.out" && break; sleep 0.1; done
rtt=$(python3 "$TMP/peer.py" rtt $P)
check "linkem relay: fastest of 20 TCP round trips $rtt ms for 2 ms up + 3 ms down (4.8-5.6)" within "$rtt" 4.8 5.6
mbit=$(python3 "$TMP/peer.py" bulk $P 2)
check "linkem relay: $mbit Mbit/s through a 50 Mbit/s relay (±10%)" within "$mbit" 45 55
frac=$(python3 "$TMP/peer.py" udp $((P + 2)) 2000)
check "linkem relay: UDP with 20% up-loss returns $frac of datagrams (0.74-0.86)" within "$frac" 0.74 0.86
kill -TERM $LPID; wait $LPID; rc=$?
check "linkem exits 0 on SIGTERM" test $rc = 0
check "linkem --stats reports on exit" grep -q "flows accepted" "$TMP/relay.err"

# ---- the testbed ------------------------------------------------------------------------------------
"${TB[@]}" up pair2 >"$TMP/up.out" 2>&1
rc=$?
check "testbed up pair2" test $rc = 0
[ $rc = 0 ] || cat "$TMP/up.out"
check "addr d1 is 10.77.0.2" test "$("${TB[@]}" addr d1)" = 10.77.0.2
"${TB[@]}" status --json >"$TMP/status.json"
check "status: linkem running" test "$(jget "$TMP/status.json" "d['linkem']['alive']")" = True
LINKEM_PID=$(jget "$TMP/status.json" "d['linkem']['pid']")
"${TB[@]}" exec d1 -- ip -4 -o addr show dev eth0 >"$TMP/addr.out" 2>&1
check "exec runs inside the device's namespace" grep -q "10.77.0.2/32" "$TMP/addr.out"
"${TB[@]}" exec d0 -- cat /proc/self/cgroup >"$TMP/cg.out" 2>&1
check "exec runs inside the device's cgroups" grep -q "hearth-testbed/$INST/d0" "$TMP/cg.out"
"${TB[@]}" exec d0 -- sh -c 'exit 3'
check "exec passes the command's exit status" test $? = 3
"${TB[@]}" exec d1 -- sh -c 'echo $$ > '"$TMP"'/sleeper.pid; exec sleep 300' &
BG+=($!)
for i in $(seq 50); do [ -s "$TMP/sleeper.pid" ] && break; sleep 0.1; done
SLEEPER=$(cat "$TMP/sleeper.pid" 2>/dev/null)
check "a background command runs in d1" test -n "$SLEEPER"

"${TB[@]}" measure --only rtt,tput --pairs star --seconds 2 --json "$TMP/m.json" >"$TMP/m.out" 2>&1
check "measure rtt,tput ran" test $? = 0
rtt=$(jget "$TMP/m.json" "d['rtt'][0]['ping_median_ms']")
# the delay is a userspace relay: on a loaded machine its wake-ups add to the RTT (4.47 ms seen once
# in CI), never take from it, so the band is -0.3 / +1.0 ms around the configured 4 ms
check "RTT d0->d1: ping median $rtt ms for configured 4 ms (-0.3/+1.0)" within "$rtt" 3.7 5.0
tcp=$(jget "$TMP/m.json" "d['rtt'][0]['tcp_median_ms']")
# the echo server is Python in a device capped at half a core: when the CFS quota throttles it, a
# round trip waits out the rest of the period, and on a busy machine that moved the median to 11.7 ms
# once in CI (3.7-5.0 otherwise); the ping check above holds the configured delay, this one that TCP
# goes through the relay with it (never below the delay) and is not wildly off
check "RTT d0->d1: TCP echo median $tcp ms (3.7-15: Python at half a core, CFS-throttled at times)" within "$tcp" 3.7 15
wire=$(jget "$TMP/m.json" "d['tput'][0]['wire_bps'] / 1e6")
check "throughput d0->d1: $wire Mbit/s for configured 100 (±10%)" within "$wire" 90 110
"${TB[@]}" measure --only cpu,mem --pairs star --seconds 2 --json "$TMP/c.json" >"$TMP/c.out" 2>&1
check "measure cpu,mem ran" test $? = 0
cpu=$(jget "$TMP/c.json" "d['cpu'][0]['meas']")
check "CPU d0: busy loop got $cpu cores for configured 0.5 (±15%)" within "$cpu" 0.425 0.575
peak=$(jget "$TMP/c.json" "d['mem'][0]['peak'] / 2**20")
check "memory d0: cgroup peak $peak MiB at the 256 MiB limit (±10%)" within "$peak" 230 282
check "memory d0: the allocation past the limit was OOM-killed" test "$(jget "$TMP/c.json" "d['mem'][0]['killed']")" = True

"${TB[@]}" down >"$TMP/down.out" 2>&1
check "down" test $? = 0
sleep 0.2
leftover_ns=$(ip netns list | grep -c "hb-$INST-")
check "down: no namespace left" test "$leftover_ns" = 0
check "down: no cgroup left" test -z "$(ls -d /sys/fs/cgroup/*/hearth-testbed/$INST /sys/fs/cgroup/hearth-testbed/$INST 2>/dev/null)"
check "down: the relay is gone" test ! -e "/proc/$LINKEM_PID/exe"
check "down: the command left running in d1 is gone" test -n "$SLEEPER" -a ! -e "/proc/${SLEEPER:-0}/exe"
check "down: no state left" test ! -e "/run/hearth-testbed/$INST"
check "down: no nft table on the host" sh -c '! nft list tables | grep -q hearth_testbed'

# loss: nftables drop in the sender's namespace
"${TB[@]}" up pair2 --set d0.loss=20 --set delay=0 >/dev/null 2>&1
check "up pair2 with 20% loss on d0" test $? = 0
ip netns exec "hb-$INST-d0" nft list table ip hearth_testbed >/dev/null 2>&1
check "the loss rule is an nft table inside d0's namespace" test $? = 0
"${TB[@]}" measure --only loss --pairs star --loss-count 5000 --json "$TMP/l.json" >/dev/null 2>&1
loss=$(jget "$TMP/l.json" "d['loss'][0]['meas_pct']")
check "loss d0->d1: $loss% of 5000 datagrams for configured 20% (17-23)" within "$loss" 17 23
"${TB[@]}" down >/dev/null 2>&1
check "down after the loss run: no namespace left" test "$(ip netns list | grep -c "hb-$INST-")" = 0

# a failed up removes what it created
HEARTH_TESTBED_FAULT=6 "${TB[@]}" up pair2 >/dev/null 2>"$TMP/fault.err"
check "an up that fails half-way exits non-zero" test $? != 0
check "a failed up leaves no namespace" test "$(ip netns list | grep -c "hb-$INST-")" = 0
check "a failed up leaves no cgroup" test -z "$(ls -d /sys/fs/cgroup/*/hearth-testbed/$INST 2>/dev/null)"
check "a failed up leaves no state" test ! -e "/run/hearth-testbed/$INST"
sleep 0.2
# [l]inkem: the pattern must not match the command line of the shell that runs pgrep
check "a failed up leaves no relay" sh -c "! pgrep -f '[l]inkem tun --name hbt0 .*hearth-testbed/$INST/' >/dev/null"

if command -v setpriv >/dev/null; then
    # the checkout may sit in a directory only root can enter (mktemp -d): give the unprivileged user
    # its own readable copy of the script (it imports nothing from the checkout)
    pub=$(mktemp -d)
    chmod 755 "$pub"
    install -m 755 "$SRC/tools/testbed" "$pub/testbed"
    setpriv --reuid=65534 --regid=65534 --clear-groups "$pub/testbed" --instance "$INST" up pair2 \
        >/dev/null 2>"$TMP/nonroot.err"
    rc=$?
    rm -rf "$pub"
    check "without root, up says so and stops" test $rc != 0 -a -n "$(grep 'needs root' "$TMP/nonroot.err")"
fi

echo "# $(( $(date +%s) - T0 )) s"
echo "$PASS passed, $FAIL failed"
[ $FAIL = 0 ]
