#!/usr/bin/env bash
# Untrusted text reaches logs escaped: a HELLO device name and a BYE reason holding a newline, a
# carriage return, ANSI escapes and a UTF-8 C1 control must appear in the worker's log as \xNN, so a
# peer can neither forge a log line nor drive the terminal; and a head printing a worker's ERROR
# escapes it too (checked through hr_escape in test-base). Loopback only.
# Env: HEARTH_BIN, HEARTH_SHARED (see lib-cluster.sh).
set -u
source "$(dirname "$0")/lib-cluster.sh"
command -v python3 > /dev/null || { echo "python3 not found; skipping"; exit 77; }
HC="python3 $(dirname "$0")/hostile-client.py"

start_worker 1
EVIL='evil\nworker: head 6.6.6.6 (forged) connected\r\x1b[31mred\x1b[0m\xc2\x9b2J'
ans=$($HC "${WPORT[1]}" hello "$EVIL")
[[ $ans == HELLO_ACK ]] && ok || bad "the worker answered '$ans' to a HELLO"
sleep 0.3
stop_worker 1
log="$TMP/w1.log"
if grep -q "6.6.6.6" "$log" && ! grep -q "^worker: head 6.6.6.6" "$log"; then ok
else bad "a forged log line (or none at all): $(grep -n 6.6.6.6 "$log")"; fi
if LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$log"; then bad "control characters in the log: $(cat -A "$log" | grep 6.6.6.6)"; else ok; fi
if LC_ALL=C grep -q $'\xc2\x9b' "$log"; then bad "a C1 control (CSI) in the log"; else ok; fi
n=$(grep -c 'evil\\x0aworker: head 6.6.6.6 (forged) connected\\x0d\\x1b\[31mred' "$log")
[[ $n -eq 2 ]] && ok || bad "the device name and the BYE reason are not both in the log escaped ($n): $(cat -A "$log")"

echo "test-worker-escape: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
