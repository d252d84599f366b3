#!/usr/bin/python3
"""Writes tiny_mha/init_hf.safetensors and tiny_gqa/init_hf.safetensors: the
golden Llama's init weights in Hugging Face transformers' Llama layout, as
transformers' convert_llama_weights_to_hf.py writes them from Meta's:

  - names "model.embed_tokens.weight", "model.layers.N.input_layernorm.weight",
    "model.layers.N.self_attn.{q,k,v,o}_proj.weight",
    "model.layers.N.post_attention_layernorm.weight",
    "model.layers.N.mlp.{gate,up,down}_proj.weight", "model.norm.weight",
    "lm_head.weight";
  - q_proj and k_proj rows permuted per head from interleaved RoPE pairs
    (x[2j], x[2j+1]) (Meta's, weft's) to transformers' rotate_half halves
    (x[j], x[j + hd/2]): w.view(heads, hd/2, 2, D).transpose(1, 2);
  - each layer's "model.layers.N.self_attn.rotary_emb.inv_freq" buffer, as
    older transformers versions save it;
  - tiny_gqa also as a sharded set (hf_sharded/: two files and
    model.safetensors.index.json), as save_pretrained writes big models.

It then runs a transformers-semantics Llama forward (rotate_half RoPE,
repeat_kv, RMSNorm eps 1e-5, SwiGLU) in float64 over the golden batch from
the tensors it wrote and checks the loss against expected.json, so the
files are known to be correct HF-layout Llamas independently of weft.

    /usr/bin/python3 tests/data/golden/make_llama_hf.py
"""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

from make_gpt2_hf import read_st, write_st  # the safetensors reader and writer

HERE = os.path.dirname(os.path.abspath(__file__))
THETA, EPS = 10000.0, 1e-5
NAMES = {"attention_norm": "input_layernorm", "attention.wq": "self_attn.q_proj",
         "attention.wk": "self_attn.k_proj", "attention.wv": "self_attn.v_proj",
         "attention.wo": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
         "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj",
         "feed_forward.w2": "mlp.down_proj"}


def permute(w, heads):  # Meta's interleaved pairs -> transformers' halves
    rows, cols = w.shape
    return w.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def llama_logits(t, ids, c):
    """transformers' Llama forward (rotate_half RoPE, repeat_kv, RMSNorm eps
    1e-5, SwiGLU, causal) over ids [B, T], from HF-named tensors t."""
    B, T = ids.shape
    D, H, Hk = c["dim"], c["heads"], c["kv_heads"]
    hd = D // H
    rms = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w
    inv = 1.0 / THETA ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    rot = lambda x: torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    x = t["model.embed_tokens.weight"][ids]
    for i in range(c["layers"]):
        p = "model.layers.%d." % i
        n = rms(x, t[p + "input_layernorm.weight"])
        q = (n @ t[p + "self_attn.q_proj.weight"].t()).view(B, T, H, hd).transpose(1, 2)
        k = (n @ t[p + "self_attn.k_proj.weight"].t()).view(B, T, Hk, hd).transpose(1, 2)
        v = (n @ t[p + "self_attn.v_proj.weight"].t()).view(B, T, Hk, hd).transpose(1, 2)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        k, v = k.repeat_interleave(H // Hk, 1), v.repeat_interleave(H // Hk, 1)
        a = ((q @ k.transpose(-2, -1)) / math.sqrt(hd)).masked_fill(mask, float("-inf"))
        x = x + (a.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D) @ \
            t[p + "self_attn.o_proj.weight"].t()
        n = rms(x, t[p + "post_attention_layernorm.weight"])
        x = x + (F.silu(n @ t[p + "mlp.gate_proj.weight"].t()) *
                 (n @ t[p + "mlp.up_proj.weight"].t())) @ t[p + "mlp.down_proj.weight"].t()
    return rms(x, t["model.norm.weight"]) @ t["lm_head.weight"].t()


def make(folder):
    d = os.path.join(HERE, folder)
    cfg = json.load(open(os.path.join(d, "expected.json")))
    c = cfg["config"]
    D, H, Hk, L = c["dim"], c["heads"], c["kv_heads"], c["layers"]
    hd = D // H
    w = read_st(os.path.join(d, "init.safetensors"))
    hf = {"model.embed_tokens.weight": w["tok_embeddings.weight"],
          "model.norm.weight": w["norm.weight"], "lm_head.weight": w["output.weight"]}
    for i in range(L):
        for ours, theirs in NAMES.items():
            t = w["layers.%d.%s.weight" % (i, ours)]
            if ours == "attention.wq":
                t = permute(t, H)
            if ours == "attention.wk":
                t = permute(t, Hk)
            hf["model.layers.%d.%s.weight" % (i, theirs)] = t
        hf["model.layers.%d.self_attn.rotary_emb.inv_freq" % i] = \
            (1.0 / THETA ** (torch.arange(0, hd, 2).float() / hd))
    write_st(os.path.join(d, "init_hf.safetensors"), dict(sorted(hf.items())))
    if folder == "tiny_gqa":  # also as a sharded set, as save_pretrained splits big models
        sd = os.path.join(d, "hf_sharded")
        os.makedirs(sd, exist_ok=True)
        names = sorted(hf)
        parts = [names[:len(names) // 2], names[len(names) // 2:]]
        weight_map = {}
        for k, part in enumerate(parts):
            fn = "model-%05d-of-%05d.safetensors" % (k + 1, len(parts))
            write_st(os.path.join(sd, fn), {n: hf[n] for n in part})
            weight_map.update({n: fn for n in part})
        json.dump({"metadata": {"total_size": sum(t.numel() * 4 for t in hf.values())},
                   "weight_map": weight_map},
                  open(os.path.join(sd, "model.safetensors.index.json"), "w"), indent=2)

    t = {k: v.double() for k, v in read_st(os.path.join(d, "init_hf.safetensors")).items()}
    toks = open(os.path.join(d, "tokens.bin"), "rb").read()
    hdr = struct.unpack("<256i", toks[:1024])
    ids = torch.tensor(struct.unpack("<%dH" % hdr[2], toks[1024:1024 + 2 * hdr[2]]))
    B, T = c["batch"], c["seq"]
    x_ids, y_ids = ids[:B * T].view(B, T), ids[1:B * T + 1].view(B, T)
    logits = llama_logits(t, x_ids, c)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y_ids.reshape(-1)).item()
    assert abs(loss - cfg["loss"]) <= 1e-6 * abs(cfg["loss"]), (folder, loss, cfg["loss"])
    print("%s/init_hf.safetensors: %d tensors, HF-layout forward loss %.12f (expected %.12f)" %
          (folder, len(hf), loss, cfg["loss"]))


if __name__ == "__main__":
    make("tiny_mha")
    make("tiny_gqa")
