#!/usr/bin/env python3
"""Writes a small random-weight Hugging Face checkpoint for the converter's tests:
`make-hf-checkpoint.py ARCH VOCAB.gguf OUT_DIR` with ARCH qwen2, qwen3 or llama3 (Llama with Llama
3.1's rope scaling, its original context made short so that most frequencies are scaled, and an
untied output). The tokenizer is a
byte-level BPE tokenizer.json rebuilt from the vocabulary and merges of VOCAB.gguf (llama.cpp's
GPT-2 vocabulary in shared/tokenizers, whose .inp/.out vectors then say what the converted file
must tokenize to); the weights are F16 safetensors, the shape small and odd where it can be (Qwen3's
head size is not n_embd / n_head), with Qwen2's q/k/v biases and Qwen3's q/k norms."""
import json
import os
import struct
import sys

import numpy as np


def read_gguf_vocab(path):
    with open(path, "rb") as f:
        b = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, b, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = b[pos:pos + n].decode("utf-8")
        pos += n
        return s

    sizes = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(sizes[t])

    assert b[:4] == b"GGUF"
    pos = 8
    n_t, n_kv = take("Q"), take("Q")
    kv = {}
    for _ in range(n_kv):
        k = string()
        kv[k] = value(take("I"))
    return kv


def main():
    arch, vocab_path, out = sys.argv[1:4]
    kv = read_gguf_vocab(vocab_path)
    tokens, types, merges = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"], kv["tokenizer.ggml.merges"]
    os.makedirs(out, exist_ok=True)
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, t in enumerate(tokens) if types[i] == 3]
    tok = {"version": "1.0", "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "byte_fallback": False,
                     "vocab": {t: i for i, t in enumerate(tokens) if types[i] != 3},
                     "merges": [m.split(" ", 1) for m in merges]}}
    json.dump(tok, open(out + "/tokenizer.json", "w"), ensure_ascii=False)
    eos = added[0]["content"] if added else None
    json.dump({"eos_token": eos, "bos_token": None, "chat_template": "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"},
              open(out + "/tokenizer_config.json", "w"))

    E, H, KV, L, FF = 64, 4, 2, 2, 96
    hd = 24 if arch == "qwen3" else E // H
    V = len(tokens)
    cls = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama3": "LlamaForCausalLM"}[arch]
    cfg = {"architectures": [cls], "model_type": arch,
           "hidden_size": E, "num_attention_heads": H, "num_key_value_heads": KV, "num_hidden_layers": L,
           "intermediate_size": FF, "vocab_size": V, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
           "rope_theta": 1000000.0, "tie_word_embeddings": arch == "qwen2", "hidden_act": "silu",
           "eos_token_id": added[0]["id"] if added else None, "torch_dtype": "float16"}
    if arch == "qwen3":
        cfg["head_dim"] = hd
    if arch == "llama3":
        cfg["rope_theta"] = 500000.0
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 64}
    json.dump(cfg, open(out + "/config.json", "w"), indent=1)

    rng = np.random.default_rng(7)
    w = {}

    def mat(name, *shape, scale=0.15, center=0.0):
        w[name] = (center + scale * rng.standard_normal(shape)).astype(np.float16)

    mat("model.embed_tokens.weight", V, E, scale=0.5)
    mat("model.norm.weight", E, scale=0.1, center=1.0)
    if arch != "qwen2":
        mat("lm_head.weight", V, E)
    for l in range(L):
        p = f"model.layers.{l}."
        mat(p + "input_layernorm.weight", E, scale=0.1, center=1.0)
        mat(p + "post_attention_layernorm.weight", E, scale=0.1, center=1.0)
        mat(p + "self_attn.q_proj.weight", H * hd, E)
        mat(p + "self_attn.k_proj.weight", KV * hd, E)
        mat(p + "self_attn.v_proj.weight", KV * hd, E)
        mat(p + "self_attn.o_proj.weight", E, H * hd)
        mat(p + "mlp.gate_proj.weight", FF, E)
        mat(p + "mlp.up_proj.weight", FF, E)
        mat(p + "mlp.down_proj.weight", E, FF)
        if arch == "qwen2":
            for x, n in (("q", H), ("k", KV), ("v", KV)):
                mat(p + f"self_attn.{x}_proj.bias", n * hd, scale=0.3)
        elif arch == "qwen3":
            mat(p + "self_attn.q_norm.weight", hd, scale=0.1, center=1.0)
            mat(p + "self_attn.k_norm.weight", hd, scale=0.1, center=1.0)
    header, off, blobs = {}, 0, []
    for k, a in w.items():
        raw = a.astype("<f2").tobytes()
        header[k] = {"dtype": "F16", "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    with open(out + "/model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))


if __name__ == "__main__":
    main()
