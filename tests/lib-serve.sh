# Shared by hearth serve's tests (test-serve.sh, test-serve-web.sh): lib-cli.sh's setup, node and the npm
# packages of tests/serve/package.json (installed once into the build folder from its lock file, so a
# rebuilt tree needs the registry only once), and starting / stopping servers.
source "$(dirname "$0")/lib-cli.sh"
SERVE_DIR="$(cd "$(dirname "$0")" && pwd)/serve"
command -v node > /dev/null || { echo "node not found (Debian package nodejs); skipping"; exit 77; }
command -v npm > /dev/null || { echo "npm not found (Debian package npm); skipping"; exit 77; }
NPM_DIR="${HEARTH_NPM_DIR:-${HEARTH_BUILD:-$TMP}/serve-npm}"
if ! cmp -s "$SERVE_DIR/package-lock.json" "$NPM_DIR/package-lock.json" || [[ ! -d "$NPM_DIR/node_modules/openai" ]]; then
    rm -rf "$NPM_DIR" && mkdir -p "$NPM_DIR"
    cp "$SERVE_DIR/package.json" "$SERVE_DIR/package-lock.json" "$NPM_DIR/"
    if ! (cd "$NPM_DIR" && timeout 300 npm ci --no-audit --no-fund --loglevel=error > npm.log 2>&1); then
        cat "$NPM_DIR/npm.log" >&2
        rm -rf "$NPM_DIR"
        echo "npm could not install tests/serve/package.json's packages (no registry?); skipping"
        exit 77
    fi
fi
# ES modules find packages beside them (not through NODE_PATH): the scripts run from the npm folder
cp "$SERVE_DIR"/*.mjs "$NPM_DIR/"
JS="$NPM_DIR"
# a sanitized build is several times slower
SLOW=1
[[ "${HEARTH_SANITIZED:-}" == "ON" || "${HEARTH_SANITIZED:-}" == "1" ]] && SLOW=4

# serve_start NAME ARGS...: starts `hearth serve -m $M --port 0 ARGS` in the background, waits until it is
# ready; sets NAME_URL and NAME_PID. Its stderr is $TMP/NAME.err.
serve_start() {
    local name=$1; shift
    "$BIN" serve -m "$M" --port 0 "$@" 2> "$TMP/$name.err" &
    local pid=$! url=""
    for _ in $(seq 1 $((300 * SLOW))); do
        url=$(grep -o 'listening on http://[^ ]*' "$TMP/$name.err" | head -1 | sed 's/listening on //')
        [[ -n "$url" ]] && grep -q "ready" "$TMP/$name.err" && break
        kill -0 $pid 2> /dev/null || break
        sleep 0.1
    done
    if ! grep -q "ready" "$TMP/$name.err"; then
        echo "hearth serve $name did not start:" >&2
        cat "$TMP/$name.err" >&2
        kill $pid 2> /dev/null
        exit 1
    fi
    printf -v "${name}_URL" '%s' "$url"
    printf -v "${name}_PID" '%s' "$pid"
}

# serve_stop NAME: SIGTERM, then the server must exit 0 within 20 s with no sanitizer report
serve_stop() {
    local name=$1 pidvar="${1}_PID"
    local pid=${!pidvar}
    kill -TERM "$pid" 2> /dev/null
    local rc=0
    for _ in $(seq 1 $((200 * SLOW))); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2> /dev/null; then
        bad "hearth serve $name did not stop on SIGTERM"
        kill -KILL "$pid"
    fi
    wait "$pid" || rc=$?
    [[ $rc -eq 0 ]] && ok || bad "hearth serve $name exited $rc"
    if grep -q "Sanitizer\|runtime error" "$TMP/$name.err"; then
        bad "hearth serve $name: sanitizer report"
        cat "$TMP/$name.err" >&2
    fi
}
