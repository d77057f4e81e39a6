#!/usr/bin/env bash
# hearth serve's web chat (src/serve/web/index.html) in headless Chromium, driven by puppeteer-core
# (tests/serve/web.mjs): load /, send a message, see the answer stream in; the markdown renderer; Stop.
# HEARTH_SERVE_SHOT=FILE keeps the screenshot (docs/serve.png was made so).
# Env: HEARTH_BIN, HEARTH_SHARED, HEARTH_BUILD.
set -u
source "$(dirname "$0")/lib-serve.sh"
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
[[ -n "$CHROMIUM" ]] || { echo "chromium not found (Debian package chromium); skipping"; exit 77; }

serve_start W -np 2 -c 2048 -t 1
URL="$W_URL" CHROMIUM="$CHROMIUM" SHOT="${HEARTH_SERVE_SHOT:-$TMP/serve.png}" SLOW=$SLOW timeout $((300 * SLOW)) \
    node "$JS/web.mjs" && ok || bad "web.mjs (above)"
serve_stop W
echo "test-serve-web: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
