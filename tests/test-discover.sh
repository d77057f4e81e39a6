#!/bin/bash
# test-discover — discovery (docs/discovery.md) end to end: `hearth worker --announce`, `hearth workers`
# and `--workers auto`, with workers of two cluster keys.
#   loopback (any user): multicast on lo alone (--discover-iface lo, a random group port, so nothing
#   leaves the machine and concurrent runs do not meet): `hearth workers --json` lists all three with
#   the right key marks; run --workers auto uses exactly the two of its key and gives the one-device
#   greedy text; the default key path works; chat, serve and plan take auto too; no key / a key nobody
#   holds / a bad group are clear errors; junk sent to the group is counted by the workers, which keep
#   answering and exit 0 on SIGTERM.
#   testbed (root, network namespaces): the same across a bridge — 4 devices, workers of key A on d1
#   and d2, of key B on d3; d0 finds exactly d1 and d2 and runs tensor parallel over them.
source "$(dirname "$0")/lib-cluster.sh"
SRC=${HEARTH_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
BUILD=${HEARTH_BUILD:-$SRC/build}
MODEL=$SHARED/models/stories260K.gguf
export XDG_CONFIG_HOME=$TMP/config   # no default key unless a test makes one
GPORT=$(( 20000 + ($$ * 7 + $(date +%s)) % 40000 ))
GROUP=239.255.72.82:$GPORT
# a long window: on a loaded machine a worker's announcer thread may wait for a core (the default is 1 s)
DMS=2000
LO=(--discover-iface lo --discover-group "$GROUP")
jq_py() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$1" "$2"; }
check() { local d=$1; shift; if "$@"; then ok; else bad "$d"; fi; }

"$BIN" keygen -o "$TMP/ka" > /dev/null && "$BIN" keygen -o "$TMP/kb" > /dev/null && "$BIN" keygen -o "$TMP/kc" > /dev/null \
    || { echo "keygen failed"; exit 1; }
run -m "$MODEL" > "$TMP/ref.txt" 2> /dev/null || { echo "the one-device run failed"; exit 1; }

# ---- loopback -----------------------------------------------------------------------------------------
start_worker 1 0 --announce --key "$TMP/ka" --name kitchen "${LO[@]}"
start_worker 2 0 --announce --key "$TMP/ka" --name attic "${LO[@]}"
start_worker 3 0 --announce --key "$TMP/kb" --name neighbour "${LO[@]}"
check "worker 1 says it announces on lo" grep -q "announcing 'kitchen' on $GROUP via lo" "$TMP/w1.log"

# junk at the group: counted by every worker, which goes on answering
python3 - "$GPORT" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
g = ("239.255.72.82", int(sys.argv[1]))
for p in (b"HRDS\x01\x00\x02\x00" + b"\xff" * 30, b"x" * 700, b"HRDS\x09\x00\x01\x00", b""):
    s.sendto(p, g)
EOF

"$BIN" workers --key "$TMP/ka" --json "${LO[@]}" --discover-ms $DMS > "$TMP/ws.json" 2> "$TMP/ws.err"
check "hearth workers --json exits 0: $(tail -1 "$TMP/ws.err")" test $? = 0
n=$(jq_py "$TMP/ws.json" "len(d['workers'])")
check "hearth workers lists 3 workers (got $n)" test "$n" = 3
mine=$(jq_py "$TMP/ws.json" "','.join(sorted(w['address'] for w in d['workers'] if w['same_key']))")
want=$(python3 -c "import sys; print(','.join(sorted(sys.argv[1:])))" "127.0.0.1:${WPORT[1]}" "127.0.0.1:${WPORT[2]}")
check "the workers of key A are marked same_key ($mine, want $want)" test "$mine" = "$want"
other=$(jq_py "$TMP/ws.json" "[(w['address'], w['name'], w['threads']) for w in d['workers'] if not w['same_key']]")
check "the worker of key B is listed as another key ($other)" test "$other" = "[('127.0.0.1:${WPORT[3]}', 'neighbour', 1)]"
mem=$(jq_py "$TMP/ws.json" "min(w['mem_budget_bytes'] for w in d['workers'])")
check "each worker announces a memory budget ($mem)" test "$mem" -gt 0
"$BIN" workers --key "$TMP/ka" "${LO[@]}" --discover-ms $DMS > "$TMP/ws.txt" 2> /dev/null
check "hearth workers (text) names the three" grep -q "kitchen.*this cluster" "$TMP/ws.txt"
grep -q "attic.*this cluster" "$TMP/ws.txt" && grep -q "neighbour.*other" "$TMP/ws.txt"
check "hearth workers (text) marks the keys" test $? = 0

# --workers auto: exactly the workers of the key, the one-device text
run -m "$MODEL" --workers auto --key "$TMP/ka" --tp-shares equal "${LO[@]}" --discover-ms $DMS > "$TMP/auto.txt" 2> "$TMP/auto.err"
check "run --workers auto exits 0: $(tail -2 "$TMP/auto.err")" test $? = 0
check "run --workers auto: the one-device greedy text" cmp -s "$TMP/ref.txt" "$TMP/auto.txt"
used=$(sed -n 's/^tp: device [12] (\(.*\)): share.*/\1/p' "$TMP/auto.err" | sort | paste -sd,)
check "run --workers auto used exactly the workers of its key ($used, want $want)" test "$used" = "$want"
check "run --workers auto logs what it found" grep -q -- "--workers auto: 2 workers of key id" "$TMP/auto.err"

# with the key at the default path (B's): only the neighbour is this cluster
mkdir -p "$TMP/config/hearth" && cp "$TMP/kb" "$TMP/config/hearth/cluster.key"
"$BIN" workers --json "${LO[@]}" --discover-ms $DMS > "$TMP/wsb.json" 2> "$TMP/wsb.err"
mine=$(jq_py "$TMP/wsb.json" "[w['name'] for w in d['workers'] if w['same_key']]")
check "hearth workers with the default key marks the worker of that key alone ($mine)" test "$mine" = "['neighbour']"
rm -f "$TMP/config/hearth/cluster.key"

# errors
run -m "$MODEL" --workers auto --key "$TMP/kc" "${LO[@]}" --discover-ms $DMS > /dev/null 2> "$TMP/nokey.err"
rc=$?
check "auto with a key no worker holds: exit 1 ($rc)" test $rc = 1
check "... saying nobody of this key answered" grep -q "no worker of this cluster's key.*3 answered with other keys" "$TMP/nokey.err"
for cmd in chat serve plan; do   # the other commands that take --workers resolve auto the same way
    "$BIN" $cmd -m "$MODEL" --workers auto --key "$TMP/kc" "${LO[@]}" --discover-ms 200 < /dev/null > /dev/null 2> "$TMP/$cmd.err"
    rc=$?
    check "$cmd --workers auto with a key no worker holds: exit 1 ($rc) with the reason" \
        sh -c "test $rc = 1 && grep -q 'hearth $cmd: --workers auto: no worker of this cluster' '$TMP/$cmd.err'"
done
run -m "$MODEL" --workers auto "${LO[@]}" > /dev/null 2> "$TMP/nofile.err"
rc=$?
check "auto without any key: exit 1 ($rc)" test $rc = 1
check "... pointing at hearth keygen" grep -q "hearth keygen" "$TMP/nofile.err"
run -m "$MODEL" --workers auto --key "$TMP/ka" --discover-group 10.1.2.3:7072 > /dev/null 2> "$TMP/grp.err"
check "a group that is not multicast: exit 1 with the reason" sh -c "test $? = 1 && grep -q 'multicast' '$TMP/grp.err'"
run -m "$MODEL" --workers auto --discover-ms 5 > /dev/null 2>&1
check "--discover-ms below its range is a usage error" test $? = 2
timeout 20 "$BIN" worker --listen 127.0.0.1:0 --announce "${LO[@]}" --sessions 1 > /dev/null 2> "$TMP/wnokey.err"
check "worker --announce without a key exits 1 naming the key" sh -c "test $? = 1 && grep -q 'cluster key' '$TMP/wnokey.err'"

for i in 1 2 3; do stop_worker $i; done
check "worker 1 counted the junk packets" grep -qE "ignored [1-9][0-9]* malformed, [1-9][0-9]* oversize, [1-9][0-9]* of another version" "$TMP/w1.log"

# ---- testbed ------------------------------------------------------------------------------------------
if [[ $(id -u) != 0 ]] || ! command -v ip > /dev/null || [[ ! -x $BUILD/linkem ]]; then
    echo "testbed part skipped: needs root, ip and $BUILD/linkem"
else
    INST=dc$(( $$ % 100000 ))
    TB=("$SRC/tools/testbed" --instance "$INST")
    export HEARTH_LINKEM=$BUILD/linkem
    tb_down() { "${TB[@]}" down > /dev/null 2>&1; }
    trap 'tb_down; cleanup' EXIT
    if ! "${TB[@]}" up pair2 --set devices=4 > "$TMP/up.out" 2>&1; then
        bad "testbed up: $(tail -3 "$TMP/up.out")"
    else
        for i in 1 2 3; do
            key=$TMP/ka; [[ $i = 3 ]] && key=$TMP/kb
            : > "$TMP/tb$i.out"
            "${TB[@]}" exec d$i -- "$BIN" worker --listen 0.0.0.0:7070 --announce --key "$key" --name tb$i -t 1 \
                --cache "$TMP/tbc$i" > "$TMP/tb$i.out" 2> "$TMP/tb$i.log" &
        done
        for _ in $(seq 100); do
            [[ $(cat "$TMP"/tb[123].out | grep -c listening) = 3 ]] && break
            sleep 0.05
        done
        "${TB[@]}" exec d0 -- "$BIN" workers --key "$TMP/ka" --json --discover-ms $DMS > "$TMP/tws.json" 2> "$TMP/tws.err"
        check "testbed: hearth workers exits 0: $(tail -1 "$TMP/tws.err")" test $? = 0
        got=$(jq_py "$TMP/tws.json" "' '.join('%s=%s' % (w['address'], w['same_key']) for w in d['workers'])")
        check "testbed: d0 lists the three workers with their keys ($got)" \
            test "$got" = "10.77.0.2:7070=True 10.77.0.3:7070=True 10.77.0.4:7070=False"
        "${TB[@]}" exec d0 -- "$BIN" run -m "$MODEL" -p "$PROMPT" --temp 0 -n 24 -t 1 --key "$TMP/ka" --workers auto \
            --discover-ms $DMS --tp-shares equal > "$TMP/tauto.txt" 2> "$TMP/tauto.err"
        check "testbed: run --workers auto exits 0: $(tail -2 "$TMP/tauto.err")" test $? = 0
        check "testbed: run --workers auto gives the one-device greedy text" cmp -s "$TMP/ref.txt" "$TMP/tauto.txt"
        used=$(sed -n 's/^tp: device [12] (\(.*\)): share.*/\1/p' "$TMP/tauto.err" | sort | paste -sd,)
        check "testbed: run --workers auto used d1 and d2 alone ($used)" test "$used" = "10.77.0.2:7070,10.77.0.3:7070"
    fi
    "${TB[@]}" kill all > /dev/null 2>&1
    wait
    tb_down
fi

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
