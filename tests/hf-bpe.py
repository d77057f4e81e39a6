#!/usr/bin/env python3
"""An independent reading of a Hugging Face tokenizer.json BPE tokenizer, to check what
`hearth convert` makes of it: `hf-bpe.py DIR TEXT...` prints one JSON list of ids per text.

Written from the tokenizers library's documented behaviour, not from hearth's code: the normalizer
(Prepend, Replace, NFC/NFKC in a Sequence), the pre-tokenizer (none, or Metaspace), the BPE model
(merges applied lowest rank first, all of a pair's non-overlapping occurrences left to right; a
character outside the vocabulary falls back to its <0xNN> byte tokens, else to the unknown token,
consecutive unknowns fused when fuse_unk), and the post-processor's TemplateProcessing (the
special tokens before the sequence). Texts must not contain added tokens' texts (the library
would cut those out first; hearth only does that with --parse-special)."""
import json
import sys
import unicodedata


def normalize(n, s):
    if n is None:
        return s
    t = n["type"]
    if t == "Sequence":
        for p in n["normalizers"]:
            s = normalize(p, s)
        return s
    if t == "Prepend":
        return n["prepend"] + s if s else s
    if t == "Replace":
        return s.replace(n["pattern"]["String"], n["content"])
    if t in ("NFC", "NFKC", "NFD", "NFKD"):
        return unicodedata.normalize(t, s)
    raise SystemExit(f"normalizer {t} is not implemented here")


def pre_tokenize(p, s):
    if p is None:
        return [s]
    t = p["type"]
    if t == "Metaspace":
        rep = p.get("replacement", "\u2581")
        s = s.replace(" ", rep)
        scheme = p.get("prepend_scheme", "always" if p.get("add_prefix_space", True) else "never")
        if scheme != "never" and not s.startswith(rep):
            s = rep + s
        if not p.get("split", True):
            return [s]
        words, cur = [], ""
        for ch in s:  # split before each replacement character, keeping it
            if ch == rep and cur:
                words.append(cur)
                cur = ""
            cur += ch
        return words + ([cur] if cur else [])
    raise SystemExit(f"pre-tokenizer {t} is not implemented here")


def bpe(model, word):
    vocab, unk = model["vocab"], model.get("unk_token")
    ranks = {}
    for i, m in enumerate(model["merges"]):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        ranks.setdefault((a, b), i)
    syms = list(word)
    while len(syms) > 1:
        best = min(((ranks.get((syms[i], syms[i + 1]), 1 << 60), i) for i in range(len(syms) - 1)))
        if best[0] == 1 << 60:
            break
        pair = (syms[best[1]], syms[best[1] + 1])
        out, i = [], 0
        while i < len(syms):
            if i + 1 < len(syms) and (syms[i], syms[i + 1]) == pair:
                out.append(syms[i] + syms[i + 1])
                i += 2
            else:
                out.append(syms[i])
                i += 1
        syms = out
    ids = []
    for s in syms:
        if s in vocab:
            ids.append(vocab[s])
            continue
        if model.get("byte_fallback"):
            bs = [f"<0x{b:02X}>" for b in s.encode("utf-8")]
            if all(b in vocab for b in bs):
                ids += [vocab[b] for b in bs]
                continue
        if unk is None:
            raise SystemExit(f"'{s}' is not in the vocabulary and there is no unknown token")
        if model.get("fuse_unk") and ids and ids[-1] == vocab[unk]:
            continue
        ids.append(vocab[unk])
    return ids


def encode(tok, text):
    model = tok["model"]
    if model["type"] != "BPE":
        raise SystemExit("only BPE models")
    ids = []
    for w in pre_tokenize(tok.get("pre_tokenizer"), normalize(tok.get("normalizer"), text)):
        ids += bpe(model, w)
    post = tok.get("post_processor")
    if post and post["type"] == "TemplateProcessing":
        before, after, seen = [], [], False
        for piece in post["single"]:
            if "Sequence" in piece:
                seen = True
            else:
                (after if seen else before).extend(post["special_tokens"][piece["SpecialToken"]["id"]]["ids"])
        ids = before + ids + after
    return ids


def main():
    with open(sys.argv[1] + "/tokenizer.json", encoding="utf-8") as f:
        tok = json.load(f)
    for text in sys.argv[2:]:
        print(json.dumps(encode(tok, text)))


if __name__ == "__main__":
    main()
