#!/usr/bin/env bash
# hearth serve through the official openai npm client (tests/serve/api.mjs): answers equal to `hearth run
# --temp 0`, 8 concurrent streams, aborts, errors, the API key, a full queue; then hostile HTTP
# (malformed requests, a huge body, too many connections, slowloris) gets errors and the server lives;
# and on a cluster's head, tensor parallel and pipelined, 4 slots.
# Env: HEARTH_BIN, HEARTH_SHARED, HEARTH_BUILD (npm packages are installed under it).
set -u
source "$(dirname "$0")/lib-serve.sh"

serve_start A -np 4 -c 2048 -t 1 --api-key sekrit --queue 16
serve_start B -np 1 -c 32768 -t 1 --queue 1 --sse-ping 0.3  # a long context: its requests run long enough to fill the queue
BIN="$BIN" MODEL="$M" URL_A="$A_URL" URL_B="$B_URL" KEY=sekrit SLOW=$SLOW timeout $((600 * SLOW)) \
    node "$JS/api.mjs" && ok || bad "api.mjs (above)"

# hostile HTTP against B: each must get an error or a closed connection, never take the server down
H="${B_URL#http://}"
host=${H%:*} port=${H##*:}
python3 - "$host" "$port" <<'PY' && ok || bad "hostile HTTP (above)"
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
def talk(data, timeout=10):
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        while True:
            try:
                d = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not d: break
            out += d
            if b"\r\n\r\n" in out and (b"Content-Length" not in out or out.endswith(b"}") or out.endswith(b"\n")): break
        return out
    finally:
        s.close()
fails = 0
def expect(name, data, codes):
    global fails
    r = talk(data)
    status = r.split(b" ", 2)[1].decode() if r.startswith(b"HTTP/") else "closed"
    if status not in codes:
        fails += 1
        print(f"FAIL hostile {name}: {status} {r[:200]!r}", file=sys.stderr)
expect("garbage", b"\x00\x01\x02garbage\r\n\r\n", {"400", "closed"})
expect("no method", b" / HTTP/1.1\r\n\r\n", {"400", "closed"})
expect("bad version", b"GET / HTTP/9.9\r\nHost: x\r\n\r\n", {"505", "400", "closed"})
expect("huge header", b"GET /health HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 200000 + b"\r\n\r\n", {"431", "413", "400", "closed"})
expect("huge body announced", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n", {"413"})
expect("huge body sent", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
       (b"100000\r\n" + b"a" * 0x100000 + b"\r\n") * 9 + b"0\r\n\r\n", {"413", "closed"})
expect("bad chunk", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", {"400", "closed"})
expect("unknown path", b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", {"404"})
expect("body not JSON", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\n{{{", {"400"})
expect("bad UTF-8", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\nConnection: close\r\n\r\n{\"prompt\":\"\xff\xfe\"}", {"400"})
# slowloris: many connections that never finish their headers; the server still answers
idle = []
for _ in range(150):
    try:
        s = socket.create_connection((host, port), timeout=5)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        idle.append(s)
    except OSError:
        break
for s in idle: s.close()
time.sleep(0.5)
expect("after slowloris", b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", {"200"})
sys.exit(1 if fails else 0)
PY
curl -sf "$B_URL/health" > /dev/null && ok || bad "server B does not answer after the hostile requests"

serve_stop A
serve_stop B

# a step holds every generating slot's token: a smaller -b is refused at start, not on every request
out=$(timeout $((60 * SLOW)) "$BIN" serve -m "$M" --port 0 -np 4 -b 2 -t 1 2>&1)
rc=$?
[[ $rc -eq 1 && "$out" == *"fewer tokens a step than the 4 slots"* ]] && ok || bad "-np 4 -b 2: rc $rc: $out"

# on a cluster's head, two workers on loopback: tensor parallel, a pipeline, a micro-batched pipeline,
# tensor parallel with the lossy all-reduce;
# 4 slots, 8 concurrent streams each equal to run's text on one device, a prefix copied on every device,
# the links' bytes in /metrics (tests/serve/cluster.mjs)
WPIDS=()
WADDR=""
cleanup() {
    for pid in "${WPIDS[@]}"; do kill "$pid" 2> /dev/null; done
    rm -rf "$TMP"
}
for i in 1 2; do
    "$BIN" worker --listen 127.0.0.1:0 --cache "$TMP/wc$i" -t 1 > "$TMP/w$i.out" 2> "$TMP/w$i.err" &
    WPIDS+=($!)
    for _ in $(seq 100); do grep -q 'listening' "$TMP/w$i.out" && break; sleep 0.05; done
    port=$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' "$TMP/w$i.out" | head -1)
    [[ -n "$port" ]] && WADDR+="${WADDR:+,}127.0.0.1:$port" || bad "worker $i did not start: $(cat "$TMP/w$i.err")"
done
if [[ ${WADDR//[^,]/} == "," ]]; then
    # --lossy: decoding steps of up to 4 sequences over UDP; nothing is lost on loopback (a deadline long
    # enough for a sanitized worker), so the streams are exactly the one-device text too
    for plan in "--tp-shares equal" "--pp" "--pp --pp-micro 4" "--tp-shares equal --lossy --lossy-deadline 5000"; do
        # shellcheck disable=SC2086
        serve_start C -np 4 -c 2048 -t 1 --workers "$WADDR" $plan --cache "$TMP/hc"
        BIN="$BIN" MODEL="$M" URL="$C_URL" DEVICES=3 SLOW=$SLOW timeout $((600 * SLOW)) node "$JS/cluster.mjs" &&
            ok || bad "cluster.mjs with $plan (above)"
        if [[ $plan == *--lossy* ]]; then
            # its counters in /metrics: a row per device, nothing lost on loopback
            lost=$(python3 -c "import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1] + '/metrics').read().decode())" \
                "$C_URL" | grep '^hearth:cluster_lossy_datagrams_lost_total{' | awk '{print $2}' | tr '\n' ' ')
            [[ "$lost" == "0 0 0 " ]] && ok || bad "lossy serve: datagrams lost per device in /metrics: '$lost'"
        fi
        serve_stop C
    done
fi
for pid in "${WPIDS[@]}"; do kill "$pid" 2> /dev/null; wait "$pid" 2> /dev/null; done
echo "test-serve: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
