#!/usr/bin/env bash
# Tests of `hearth tokenize`: the --ids list and the `ID -> 'piece'` lines for known inputs
# (SentencePiece and byte-level BPE vocabulary-only GGUFs, and a model with tensors), BOS
# handling, --parse-special, the prompt sources (-p, -f, --stdin, --escape) and usage errors.
# The expected ids are llama.cpp's (llama-tokenize) for the same files.
# Env: HEARTH_BIN (the hearth binary), HEARTH_SHARED (the shared/ folder).
set -u

BIN=${HEARTH_BIN:-}
SHARED=${HEARTH_SHARED:-../shared}
TOK="$SHARED/tokenizers"
if [[ -z "$BIN" || ! -x "$BIN" ]]; then
    echo "HEARTH_BIN is not set to the hearth binary; skipping" >&2
    exit 77
fi
if [[ ! -f "$TOK/ggml-vocab-gpt-2.gguf" || ! -f "$SHARED/models/stories260K.gguf" ]]; then
    echo "$TOK not found (set HEARTH_SHARED); skipping" >&2
    exit 77
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0

# expect WANT DESC COMMAND...: the command succeeds and prints exactly WANT
expect() {
    local want=$1 desc=$2
    shift 2
    local got
    got=$("$@" 2> "$TMP/err.txt")
    local rc=$?
    if [[ $rc -eq 0 && "$got" == "$want" ]]; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        echo "FAIL: $desc (exit $rc)" >&2
        echo "  want: $want" >&2
        echo "  got:  $got" >&2
        sed 's/^/  | /' "$TMP/err.txt" >&2
    fi
}

# expect_rc RC DESC COMMAND...: exit status RC, and a "hearth tokenize" message on stderr for errors
expect_rc() {
    local want=$1 desc=$2
    shift 2
    "$@" > "$TMP/out.txt" 2> "$TMP/err.txt"
    local rc=$?
    if [[ $rc -eq $want && ($want -eq 0 || -n "$(grep 'hearth tokenize' "$TMP/err.txt")") ]]; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        echo "FAIL: $desc: exit $rc, expected $want" >&2
        sed 's/^/  | /' "$TMP/err.txt" >&2
    fi
}

GPT2="$TOK/ggml-vocab-gpt-2.gguf"
SPM="$TOK/ggml-vocab-llama-spm.gguf"

# --ids: llama-tokenize's bracketed list
expect "[15496, 995]" "gpt-2 --ids" "$BIN" tokenize -m "$GPT2" -p "Hello world" --ids
expect "[1, 15043, 3186]" "llama-spm --ids (BOS added, as the vocabulary asks)" "$BIN" tokenize -m "$SPM" -p "Hello world" --ids
expect "[15043, 3186]" "llama-spm --no-bos" "$BIN" tokenize -m "$SPM" -p "Hello world" --ids --no-bos
expect "[]" "empty text, no BOS" "$BIN" tokenize -m "$GPT2" -p "" --ids
expect "[15496, 11, 331, 6, 439, 0, 1374, 389, 345, 30325, 223, 5633]" "gpt-2 mixed text" \
    "$BIN" tokenize -m "$GPT2" -p "Hello, y'all! How are you 😁 ?" --ids
expect "[100000, 17464, 1843]" "deepseek-llm (BOS from the file)" \
    "$BIN" tokenize -m "$TOK/ggml-vocab-deepseek-llm.gguf" -p "Hello world" --ids

# special tokens only with --parse-special
expect "[64, 50256, 65]" "gpt-2 --parse-special" "$BIN" tokenize -m "$GPT2" -p "a<|endoftext|>b" --ids --parse-special
expect "[64, 27, 91, 437, 1659, 5239, 91, 29, 65]" "gpt-2 control token as text" \
    "$BIN" tokenize -m "$GPT2" -p "a<|endoftext|>b" --ids
expect "[1, 1, 15043, 2]" "llama-spm --parse-special" "$BIN" tokenize -m "$SPM" -p "<s>Hello</s>" --ids --parse-special

# the default output: one `ID -> 'piece'` per line, control tokens showing their text
expect "$(printf "%6d -> '%s'\n" 15496 Hello 995 " world" 50256 "<|endoftext|>")" "gpt-2 pieces" \
    "$BIN" tokenize -m "$GPT2" -p "Hello world<|endoftext|>" --parse-special
expect "$(printf "%6d -> '%s'\n" 1 "<s>" 15043 " Hello")
Total number of tokens: 2" "llama-spm pieces and --show-count" "$BIN" tokenize -m "$SPM" -p "Hello" --show-count

# a model with tensors works the same (only its vocabulary is read)
expect "[1, 403, 407, 261, 378]" "stories260K" "$BIN" tokenize -m "$SHARED/models/stories260K.gguf" -p "Once upon a time" --ids

# prompt sources
printf 'Hello world' > "$TMP/p.txt"
expect "[15496, 995]" "-f FILE" "$BIN" tokenize -m "$GPT2" -f "$TMP/p.txt" --ids
expect "[15496, 995]" "--stdin" bash -c "\"\$0\" tokenize -m \"\$1\" --stdin --ids < \"\$2\"" "$BIN" "$GPT2" "$TMP/p.txt"
# -p text has its escapes processed by default, as llama.cpp's tools do (common's
# string_process_escapes). 'a\nb' under GPT-2: the pre-tokenizer splits it into "a", "\n", "b";
# "\n" is 198 in llama.cpp's vector for "\n" (ggml-vocab-gpt-2.gguf.out), and single printable ASCII
# bytes are GPT-2's first 94 ids in byte order from '!' (33), so 'a' (97) is 64 and 'b' 65.
expect "[64, 198, 65]" "-p 'a\\nb' is a newline" "$BIN" tokenize -m "$GPT2" -p 'a\nb' --ids
expect "[64, 198, 65]" "-e, as llama.cpp spells the default" "$BIN" tokenize -m "$GPT2" -p 'a\nb' --ids -e
expect "[64, 59, 46803]" "--no-escape keeps the backslash" "$BIN" tokenize -m "$GPT2" -p 'a\nb' --ids --no-escape
# llama.cpp's own vectors for "\n =" and "\t\n", typed with escapes
expect "[198, 796]" "gpt-2 '\\n ='" "$BIN" tokenize -m "$GPT2" -p '\n =' --ids
expect "[29871, 13, 353]" "llama-spm '\\n ='" "$BIN" tokenize -m "$SPM" -p '\n =' --ids --no-bos
expect "[29871, 12, 13]" "llama-spm '\\t\\n'" "$BIN" tokenize -m "$SPM" -p '\t\n' --ids --no-bos
expect "[64, 198, 65]" "\\x0a" "$BIN" tokenize -m "$GPT2" -p 'a\x0Ab' --ids
expect "[64, 1, 65]" "\\\" is a quote" "$BIN" tokenize -m "$GPT2" -p 'a\"b' --ids
# a file's text is taken as it is: its backslashes stay
printf 'a\\nb' > "$TMP/esc.txt"
expect "[64, 59, 46803]" "-f text is not unescaped" "$BIN" tokenize -m "$GPT2" -f "$TMP/esc.txt" --ids
expect "[64, 59, 46803]" "--stdin text is not unescaped" bash -c "\"\$0\" tokenize -m \"\$1\" --stdin --ids < \"\$2\"" "$BIN" "$GPT2" "$TMP/esc.txt"

# usage and errors
expect_rc 0 "--help" "$BIN" tokenize --help
if ! grep -q -- "--parse-special" "$TMP/out.txt" || ! grep -q -- "--ids" "$TMP/out.txt"; then
    fail=$((fail + 1)); echo "FAIL: --help does not describe the options" >&2
fi
expect_rc 2 "no model" "$BIN" tokenize -p "x"
expect_rc 2 "no text" "$BIN" tokenize -m "$GPT2"
expect_rc 2 "two text sources" "$BIN" tokenize -m "$GPT2" -p x -f "$TMP/p.txt"
expect_rc 2 "unknown option" "$BIN" tokenize -m "$GPT2" -p x --frobnicate
expect_rc 2 "-m without a value" "$BIN" tokenize -p x -m
expect_rc 2 "\\x00 in -p" "$BIN" tokenize -m "$GPT2" -p 'a\x00b'
expect_rc 1 "missing model file" "$BIN" tokenize -m "$TMP/nope.gguf" -p x
expect_rc 1 "missing prompt file" "$BIN" tokenize -m "$GPT2" -f "$TMP/nope.txt"
printf 'not a gguf file at all' > "$TMP/bad.gguf"
expect_rc 1 "not a GGUF" "$BIN" tokenize -m "$TMP/bad.gguf" -p x

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
