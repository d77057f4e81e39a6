#!/usr/bin/env python3
"""ab.py: two hearth binaries side by side, interleaved, on the same models.

Runs `hearth bench --json` with the same arguments from binary A and binary B in turn, ROUNDS times
per model (A B B A ... so that a drift of the machine's speed falls on both), and prints, per model
and test, the median tok/s of each binary over the rounds and the ratio B/A. A refactor that must not
change speed shows ratios near 1; the spread of the rounds says how far the machine lets one tell.

  bench/ab.py --a OLD/hearth --b NEW/hearth --rounds 3 MODEL.gguf [MODEL.gguf ...] -- -t 1,2 -p 128 -n 64 -r 5
"""
import argparse, json, statistics, subprocess, sys


def run(binary, model, args):
    out = subprocess.run([binary, "bench", "-m", model, "--json"] + args, check=True, capture_output=True, text=True)
    return {(r["test"], r["threads"], r.get("n_depth", 0)): r["tok_per_s"] for r in json.loads(out.stdout)}


def main():
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="the baseline hearth binary")
    ap.add_argument("--b", required=True, help="the binary under test")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="also write every round's figures here")
    ap.add_argument("models", nargs="+")
    o = ap.parse_args(argv)
    rows, raw = [], {}
    for model in o.models:
        res = {"a": [], "b": []}
        for r in range(o.rounds):
            order = ("a", "b") if r % 2 == 0 else ("b", "a")
            for who in order:
                res[who].append(run(getattr(o, who), model, extra))
        raw[model] = res
        for key in res["a"][0]:
            a = [x[key] for x in res["a"]]
            b = [x[key] for x in res["b"]]
            ma, mb = statistics.median(a), statistics.median(b)
            rows.append((model.rsplit("/", 1)[-1], key, ma, min(a), max(a), mb, min(b), max(b), mb / ma))
    print("| model | test | threads | A tok/s (min-max) | B tok/s (min-max) | B/A |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for m, (test, th, d), ma, a0, a1, mb, b0, b1, ratio in rows:
        name = test + (f" @ d{d}" if d else "")
        print(f"| {m} | {name} | {th} | {ma:.2f} ({a0:.2f}-{a1:.2f}) | {mb:.2f} ({b0:.2f}-{b1:.2f}) | {ratio:.3f} |")
    if o.json:
        with open(o.json, "w") as f:
            json.dump({"a": o.a, "b": o.b, "args": extra, "rounds": {m: {w: [{"|".join(map(str, k)): v for k, v in x.items()}
                       for x in r[w]] for w in r} for m, r in raw.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
