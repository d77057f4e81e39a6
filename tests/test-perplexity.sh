#!/usr/bin/env bash
# Tests of `hearth perplexity` and `hearth calibrate` (docs/lossy.md): the perplexity of a fixed text on
# stories260K equals an independent computation (python: llama-perplexity's chunking over `hearth
# eval`'s logits, -log softmax summed in double); KL divergence of a run against its own base is 0
# with 100% top-token agreement, against another quant type of the same model > 0; the lossy
# simulation at 0% loss is the lossless run and at 10% costs quality, less with the groups' importance
# measured on the text (oracle) than at random, and less still ranked token by token; calibrate's
# file; refusals.
. "$(dirname "$0")/lib-cli.sh"
if ! command -v python3 > /dev/null; then echo "python3 not found; skipping" >&2; exit 77; fi
TEXT="$(dirname "$0")/data/lossy-text.txt"
Q8="$SHARED/models/synth/synth-llama-Q8_0.gguf"
Q4="$SHARED/models/synth/synth-llama-Q4_0.gguf"

# --- PPL against an independent computation (4 chunks of 128: [1]..[4] and the final line) ---
timeout 120 "$BIN" perplexity -m "$M" -f "$TEXT" -c 128 --chunks 4 -t 2 > "$TMP/ppl.out" 2> "$TMP/ppl.err" \
    && ok || bad "perplexity failed: $(tail -2 "$TMP/ppl.err")"
"$BIN" tokenize -m "$M" -f "$TEXT" --ids > "$TMP/ids" 2> /dev/null || bad "tokenize failed"
python3 - "$BIN" "$M" "$TMP" 128 4 << 'EOF' && ok || bad "perplexity differs from the independent computation"
import json, math, re, struct, subprocess, sys
bin_, model, tmp, n_ctx, n_chunk = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
ids = json.loads(open(tmp + "/ids").read())
bos = ids[0]  # the vocabulary adds BOS: it is the text's first token
V = None
nll = []
running = []
for c in range(n_chunk):
    chunk = ids[c * n_ctx:(c + 1) * n_ctx]
    inp = [bos] + chunk[1:]
    path = "%s/chunk%d.f32" % (tmp, c)
    subprocess.run([bin_, "eval", "-m", model, "-t", "2", "--tokens", ",".join(map(str, inp)), "--logits", path],
                   check=True, stderr=subprocess.DEVNULL)
    raw = open(path, "rb").read()
    V = len(raw) // 4 // n_ctx
    for p in range(n_ctx // 2, n_ctx - 1):
        row = struct.unpack_from("<%df" % V, raw, p * V * 4)
        m = max(row)
        lse = m + math.log(sum(math.exp(x - m) for x in row))
        nll.append(lse - row[chunk[p + 1]])
    running.append(math.exp(sum(nll) / len(nll)))
n = len(nll)
mean = sum(nll) / n
var = sum(x * x for x in nll) / n - mean * mean
ppl, unc = math.exp(mean), math.sqrt(var / (n - 1)) * math.exp(mean)
out = open(tmp + "/ppl.out").read()
got = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+),", out)]
m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
ok = m and len(got) == n_chunk and all(abs(a - b) <= 1e-4 * b + 1e-4 for a, b in zip(got, running))
ok = ok and abs(float(m.group(1)) - ppl) <= 1e-4 * ppl and abs(float(m.group(2)) - unc) <= 1e-3 * unc + 1e-5
print("independent: PPL = %.4f +/- %.5f, running %s; hearth: %s" % (ppl, unc, running, m.group(0) if m else out),
      file=sys.stderr)
sys.exit(0 if ok else 1)
EOF

# --- KL divergence: against its own base, and against another quant type ---
kl() { # kl OUT -> mean KLD and same-top percentage of a --kl-divergence run's output
    awk '/^Mean    KLD:/{k=$3} /^Same top p:/{t=$4} END{print k, t}' "$1"
}
"$BIN" perplexity -m "$M" -f "$TEXT" -c 128 --chunks 4 --kl-divergence-base "$TMP/base.kld" > "$TMP/b.out" 2> /dev/null \
    && ok || bad "writing the KL base failed"
cmp <(grep Final "$TMP/b.out") <(grep Final "$TMP/ppl.out") > /dev/null && ok || bad "saving the base changed the PPL"
"$BIN" perplexity -m "$M" --kl-divergence-base "$TMP/base.kld" --kl-divergence > "$TMP/self.out" 2> "$TMP/self.err" \
    && ok || bad "--kl-divergence failed: $(tail -1 "$TMP/self.err")"
read -r k t <<< "$(kl "$TMP/self.out")"
python3 -c "import sys; sys.exit(0 if abs(float('$k')) < 1e-4 and float('$t') == 100 else 1)" \
    && ok || bad "KL against its own base: KLD $k, same top $t% (want 0 and 100)"
if [[ -f $Q8 && -f $Q4 ]]; then
    "$BIN" perplexity -m "$Q8" -f "$TEXT" -c 64 --chunks 3 --kl-divergence-base "$TMP/q8.kld" > /dev/null 2>&1 \
        && ok || bad "Q8_0 base failed"
    "$BIN" perplexity -m "$Q4" --kl-divergence-base "$TMP/q8.kld" --kl-divergence > "$TMP/q4.out" 2> /dev/null \
        && ok || bad "Q4_0 against the Q8_0 base failed"
    read -r k t <<< "$(kl "$TMP/q4.out")"
    python3 -c "import sys; sys.exit(0 if float('$k') > 1e-4 and float('$t') < 100 else 1)" \
        && ok || bad "Q4_0 against Q8_0: KLD $k, same top $t% (want > 0 and < 100)"
fi
# a base of another vocabulary size is refused
L2="$SHARED/models/llama-2-tiny-random.gguf"
if [[ -f $L2 ]]; then
    "$BIN" perplexity -m "$L2" --kl-divergence-base "$TMP/base.kld" --kl-divergence > /dev/null 2> "$TMP/e" \
        && bad "a base of another vocabulary was taken" || grep -q "vocabulary" "$TMP/e" && ok || bad "no reason: $(cat "$TMP/e")"
fi
head -c 1000 "$TMP/base.kld" > "$TMP/short.kld"
"$BIN" perplexity -m "$M" --kl-divergence-base "$TMP/short.kld" --kl-divergence > /dev/null 2> "$TMP/e" \
    && bad "a truncated base was taken" || grep -q "bytes" "$TMP/e" && ok || bad "truncated base: $(cat "$TMP/e")"

python3 -c "import struct,sys; open(sys.argv[1],'wb').write(b'HRTHKLD1'+struct.pack('<3i',1<<24,512,1<<24)+b'\0'*64)" \
    "$TMP/huge.kld"
"$BIN" perplexity -m "$M" --kl-divergence-base "$TMP/huge.kld" --kl-divergence > /dev/null 2> "$TMP/e"
[[ $? -eq 1 ]] && grep -q "header" "$TMP/e" && ok || bad "a header of 2^48 tokens: $(cat "$TMP/e")"

# --- calibrate ---
"$BIN" calibrate -m "$M" -f "$TEXT" -c 128 --chunks 4 -o "$TMP/imp.json" 2> "$TMP/cal.err" && ok \
    || bad "calibrate failed: $(cat "$TMP/cal.err")"
python3 - "$TMP/imp.json" << 'EOF' && ok || bad "importance file"
import json, sys
d = json.load(open(sys.argv[1]))
a, f = d["attention"], d["ffn"]
# stories260K: 5 layers, 4 KV heads (groups of 1), 172 F32 FFN neurons (groups of 1); 4 chunks of 128 tokens
ok = d["format"] == "hearth-importance" and d["n_layer"] == 5 and d["tokens"] == 512
ok = ok and a["groups"] == 4 and len(a["importance"]) == 5 and all(len(r) == 4 for r in a["importance"])
ok = ok and f["groups"] == 172 and all(len(r) == 172 for r in f["importance"])
ok = ok and all(x > 0 for r in a["importance"] + f["importance"] for x in r)
sys.exit(0 if ok else 1)
EOF
"$BIN" calibrate -m "$M" -f "$TEXT" -c 128 -o "$TMP/imp.json" > /dev/null 2>&1 && bad "calibrate overwrote its output" || ok

# --- the lossy simulation ---
sim() { "$BIN" perplexity -m "$M" --kl-divergence-base "$TMP/base.kld" --kl-divergence "$@" 2> "$TMP/sim.err"; }
sim --sim-loss 0 --sim-placement random > "$TMP/s0.out" && ok || bad "sim 0%: $(tail -1 "$TMP/sim.err")"
read -r k t <<< "$(kl "$TMP/s0.out")"
python3 -c "import sys; sys.exit(0 if abs(float('$k')) < 1e-4 and float('$t') == 100 else 1)" \
    && ok || bad "0% loss is not the lossless run: KLD $k, same top $t%"
sim --sim-loss 0,0,10 --sim-placement random > "$TMP/sr.out" && ok || bad "sim random: $(tail -1 "$TMP/sim.err")"
sim --sim-loss 0,0,10 --sim-placement oracle > "$TMP/so.out" && ok || bad "sim oracle: $(tail -1 "$TMP/sim.err")"
sim --sim-loss 0,0,10 --importance "$TMP/imp.json" > "$TMP/si.out" && ok || bad "sim importance: $(tail -1 "$TMP/sim.err")"
cmp <(kl "$TMP/so.out") <(kl "$TMP/si.out") > /dev/null && ok || bad "importance from this text is not the oracle"
read -r kr _ <<< "$(kl "$TMP/sr.out")"
read -r ko _ <<< "$(kl "$TMP/so.out")"
grep -q "worker datagrams lost" "$TMP/sr.out" && ok || bad "no loss counters"
python3 -c "import sys; sys.exit(0 if 0 < float('$ko') < float('$kr') else 1)" \
    && ok || bad "10% loss on one worker: KLD oracle $ko, random $kr (want 0 < oracle < random)"
sim --sim-loss 0,0,10 --sim-placement per-token > "$TMP/st.out" && ok || bad "sim per-token: $(tail -1 "$TMP/sim.err")"
read -r kt _ <<< "$(kl "$TMP/st.out")"
python3 -c "import sys; sys.exit(0 if 0 < float('$kt') < float('$ko') else 1)" \
    && ok || bad "10% loss on one worker: KLD per-token $kt, oracle $ko (want 0 < per-token < oracle)"
# the low-rank predictor at full rank (n_embd = 64) predicts the FFN's activations exactly: it ranks the FFN per token,
# and beats the same placement's static FFN ranking; at rank 4 it is worse than at full rank
sim --sim-loss 0,0,10 --importance "$TMP/imp.json" --sim-placement lowrank --sim-rank 64 > "$TMP/sl.out" \
    && ok || bad "sim lowrank: $(tail -1 "$TMP/sim.err")"
sim --sim-loss 0,0,10 --importance "$TMP/imp.json" --sim-placement lowrank --sim-rank 4 > "$TMP/sl4.out" \
    && ok || bad "sim lowrank 4: $(tail -1 "$TMP/sim.err")"
read -r kl64 _ <<< "$(kl "$TMP/sl.out")"
read -r kl4 _ <<< "$(kl "$TMP/sl4.out")"
read -r ki _ <<< "$(kl "$TMP/si.out")"
python3 -c "import sys; sys.exit(0 if 0 < float('$kl64') < float('$ki') and float('$kl64') < float('$kl4') else 1)" \
    && ok || bad "lowrank: KLD rank 64 $kl64, rank 4 $kl4, static importance $ki (want rank 64 below both)"
# protect: the importance placement, less each token's N largest-predicted FFN groups of the lossy worker (the head
# computes them): N = 0 is the static placement itself; more protected groups lose less (the worker has 43 of 172)
for n in 0 8 43; do
    sim --sim-loss 0,0,10 --importance "$TMP/imp.json" --sim-placement protect --sim-rank 64 --sim-protect $n \
        > "$TMP/sp$n.out" && ok || bad "sim protect $n: $(tail -1 "$TMP/sim.err")"
done
cmp <(kl "$TMP/sp0.out") <(kl "$TMP/si.out") > /dev/null && ok || bad "protect 0 is not the importance placement"
read -r kp8 _ <<< "$(kl "$TMP/sp8.out")"
read -r kp43 _ <<< "$(kl "$TMP/sp43.out")"
python3 -c "import sys; sys.exit(0 if 0 < float('$kp43') < float('$kp8') < float('$ki') else 1)" \
    && ok || bad "protect: KLD 43 groups $kp43, 8 groups $kp8, none $ki (want 0 < 43 < 8 < none)"
sim --sim-loss 5 --sim-placement protect > /dev/null 2>&1; [[ $? -eq 2 ]] && ok || bad "protect without --importance"
sim --sim-loss 5 > /dev/null 2>&1; [[ $? -eq 2 ]] && ok || bad "importance placement without --importance"
sim --sim-loss 5 --sim-placement best > /dev/null 2>&1; [[ $? -eq 2 ]] && ok || bad "an unknown placement"
sim --sim-loss 5,5 --sim-devices 4 --sim-placement random > /dev/null 2>&1; [[ $? -eq 1 ]] && ok \
    || bad "2 loss rates for 3 workers"
"$BIN" perplexity -m "$M" -f "$TEXT" -c 4096 > /dev/null 2> "$TMP/e"; [[ $? -eq 1 ]] && grep -q "needs at least" "$TMP/e" \
    && ok || bad "a text shorter than two chunks: $(cat "$TMP/e")"

echo "test-perplexity: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
