# Shared by the one-machine command tests (test-cli-inputs.sh, -outputs.sh, -sanity.sh): reads
# HEARTH_BIN and HEARTH_SHARED, exits 77 (skipped) without them, sets M to the small shared model,
# makes $TMP and removes it on exit (a test may redefine cleanup, calling rm itself), and counts.
BIN=${HEARTH_BIN:-}
SHARED=${HEARTH_SHARED:-../shared}
M="$SHARED/models/stories260K.gguf"
if [[ -z "$BIN" || ! -x "$BIN" ]]; then echo "HEARTH_BIN is not set to the hearth binary; skipping" >&2; exit 77; fi
if [[ ! -f "$M" ]]; then echo "$M not found (set HEARTH_SHARED); skipping" >&2; exit 77; fi

TMP=$(mktemp -d)
cleanup() { rm -rf "$TMP"; }
trap cleanup EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
