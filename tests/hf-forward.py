#!/usr/bin/env python3
"""The reference forward pass of a Hugging Face Llama/Qwen2/Qwen3 checkpoint, in numpy (float64),
read straight from its safetensors: `hf-forward.py DIR ID,ID,... OUT.f32` writes the logits of
every position as little-endian float32 [n_tokens][n_vocab], the layout of `hearth eval --logits`.

Written from the transformers models' definitions, independently of hearth and of the converter:
the weights stay in Hugging Face's layout and RoPE rotates halves (rotate_half), where the GGUF
has llama's Q/K rows interleaved and hearth rotates adjacent pairs, so a wrong permutation in the
converter cannot cancel out here."""
import json
import struct
import sys

import numpy as np


def load(d):
    try:
        with open(d + "/model.safetensors.index.json") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    except FileNotFoundError:
        files = ["model.safetensors"]
    w = {}
    for name in files:
        with open(f"{d}/{name}", "rb") as f:
            raw = f.read()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        data = raw[8 + n:]
        for k, v in header.items():
            if k == "__metadata__":
                continue
            b, e = v["data_offsets"]
            if v["dtype"] == "BF16":
                a = (np.frombuffer(data[b:e], dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                a = np.frombuffer(data[b:e], dtype={"F32": "<f4", "F16": "<f2"}[v["dtype"]])
            w[k] = a.astype(np.float64).reshape(v["shape"])
    return w


def rms(x, g, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], -1)


def forward(d, ids):
    with open(d + "/config.json") as f:
        c = json.load(f)
    w = load(d)
    arch = c["architectures"][0]
    E, H = c["hidden_size"], c["num_attention_heads"]
    KV = c.get("num_key_value_heads", H)
    hd = c.get("head_dim", E // H)
    eps = c["rms_norm_eps"]
    theta = c.get("rope_theta", 10000.0)
    T = len(ids)
    embed = w.get("model.embed_tokens.weight", w.get("lm_head.weight"))
    head = w["lm_head.weight"] if "lm_head.weight" in w else embed
    x = embed[ids]
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    rs = c.get("rope_scaling")
    if rs:  # Llama 3.1's: as transformers' _compute_llama3_parameters
        if rs.get("rope_type", rs.get("type")) != "llama3":
            raise SystemExit("only llama3 rope scaling is implemented here")
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old_ctx = rs["original_max_position_embeddings"]
        wavelen = 2 * np.pi / inv
        scaled = np.where(wavelen > old_ctx / lo, inv / factor, inv)
        smooth = (old_ctx / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_ctx / hi) & ~(wavelen > old_ctx / lo)
        inv = np.where(medium, smoothed, scaled)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos = np.cos(np.concatenate([ang, ang], -1))[:, None, :]
    sin = np.sin(np.concatenate([ang, ang], -1))[:, None, :]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, w[p + "input_layernorm.weight"], eps)
        q = h @ w[p + "self_attn.q_proj.weight"].T
        k = h @ w[p + "self_attn.k_proj.weight"].T
        v = h @ w[p + "self_attn.v_proj.weight"].T
        if p + "self_attn.q_proj.bias" in w:
            q += w[p + "self_attn.q_proj.bias"]
            k += w[p + "self_attn.k_proj.bias"]
            v += w[p + "self_attn.v_proj.bias"]
        q, k, v = q.reshape(T, H, hd), k.reshape(T, KV, hd), v.reshape(T, KV, hd)
        if arch.startswith("Qwen3"):
            q = rms(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms(k, w[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = np.empty((T, H, hd))
        for i in range(H):
            j = i // (H // KV)
            s = q[:, i, :] @ k[:, j, :].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, i, :] = (s / s.sum(-1, keepdims=True)) @ v[:, j, :]
        x = x + out.reshape(T, H * hd) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["model.norm.weight"], eps) @ head.T


def main():
    ids = [int(t) for t in sys.argv[2].split(",")]
    forward(sys.argv[1], ids).astype("<f4").tofile(sys.argv[3])


if __name__ == "__main__":
    main()
