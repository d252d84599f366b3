#!/usr/bin/python3
"""Cross-check of the golden vectors against our reading of docs/DESIGN.md.

Builds the Llama-style reference model in torch float64 straight from
docs/DESIGN.md (interleaved RoPE, RMSNorm eps 1e-5, SwiGLU, untied output, causal
GQA via repeat_interleave, mean cross-entropy), loads init.safetensors and
tokens.bin, and compares loss, gradients and one clipped AdamW step with the
golden files. Not part of the test suite; run by hand:

    /usr/bin/python3 tests/kernels/torch_reference.py [tests/data/golden/tiny_gqa ...]

(/usr/bin/python3 has torch 1.13; the python3 first on PATH may not.) The
safetensors files are parsed here with struct + json, so no safetensors
package is needed.
"""
import json
import math
import os
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16,
          "F16": torch.float16, "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8}


def load_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:e]), dtype=DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"]).clone()
    return out


def load_tokens(path):
    with open(path, "rb") as f:
        raw = f.read()
    hdr = struct.unpack("<256i", raw[:1024])
    assert hdr[0] == 20240520 and hdr[1] == 1, hdr[:3]
    count = hdr[2]
    toks = struct.unpack("<%dH" % count, raw[1024:1024 + 2 * count])
    return torch.tensor(toks, dtype=torch.int64)


def rmsnorm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos0=0, theta=10000.0):
    # x: (B, T, nh, hd); interleaved pairs (x[2j], x[2j+1])
    B, T, nh, hd = x.shape
    j = torch.arange(hd // 2, dtype=torch.float64)
    freqs = theta ** (-2.0 * j / hd)
    p = torch.arange(pos0, pos0 + T, dtype=torch.float64)
    ang = torch.outer(p, freqs)  # (T, hd/2)
    c, s = ang.cos()[None, :, None, :].to(x.dtype), ang.sin()[None, :, None, :].to(x.dtype)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    y = torch.empty_like(x)
    y[..., 0::2] = x0 * c - x1 * s
    y[..., 1::2] = x0 * s + x1 * c
    return y


def forward(P, cfg, inputs, targets):
    B, T = inputs.shape
    D, H, Hkv, L = cfg["dim"], cfg["heads"], cfg["kv_heads"], cfg["layers"]
    hd = D // H
    x = P["tok_embeddings.weight"][inputs]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(L):
        pre = "layers.%d." % i
        n = rmsnorm(x, P[pre + "attention_norm.weight"])
        q = (n @ P[pre + "attention.wq.weight"].T).view(B, T, H, hd)
        k = (n @ P[pre + "attention.wk.weight"].T).view(B, T, Hkv, hd)
        v = (n @ P[pre + "attention.wv.weight"].T).view(B, T, Hkv, hd)
        q, k = rope(q), rope(k)
        k = k.repeat_interleave(H // Hkv, dim=2)
        v = v.repeat_interleave(H // Hkv, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        s = s.masked_fill(~mask, float("-inf"))
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * hd)
        h = x + a @ P[pre + "attention.wo.weight"].T
        n2 = rmsnorm(h, P[pre + "ffn_norm.weight"])
        g = torch.nn.functional.silu(n2 @ P[pre + "feed_forward.w1.weight"].T) * \
            (n2 @ P[pre + "feed_forward.w3.weight"].T)
        x = h + g @ P[pre + "feed_forward.w2.weight"].T
    logits = rmsnorm(x, P["norm.weight"]) @ P["output.weight"].T
    return torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def check(folder):
    exp = json.load(open(os.path.join(folder, "expected.json")))
    cfg, hp = exp["config"], exp["hyperparameters"]
    init = load_safetensors(os.path.join(folder, "init.safetensors"))
    gref = load_safetensors(os.path.join(folder, "grads.safetensors"))
    after = load_safetensors(os.path.join(folder, "after_step.safetensors"))
    toks = load_tokens(os.path.join(folder, "tokens.bin"))
    B, T = cfg["batch"], cfg["seq"]
    inputs, targets = toks[:B * T].view(B, T), toks[1:B * T + 1].view(B, T)
    P = {k: v.double().requires_grad_(True) for k, v in init.items()}
    loss = forward(P, cfg, inputs, targets)
    loss.backward()
    print("%s: loss %.15g (golden %.15g, rel %.2e)" % (
        os.path.basename(folder), loss.item(), exp["loss"], abs(loss.item() - exp["loss"]) / exp["loss"]))
    worst = 0.0
    for name in sorted(P):
        r = rel(P[name].grad, gref[name])
        worst = max(worst, r)
        print("  grad %-36s norm %.6e  rel err vs golden %.2e" % (name, P[name].grad.norm().item(), r))
    total = math.sqrt(sum(p.grad.pow(2).sum().item() for p in P.values()))
    print("  grad norm %.15g (golden %.15g); worst per-tensor grad rel err %.2e" % (
        total, exp["grad_norm_before_clip"], worst))
    torch.nn.utils.clip_grad_norm_(list(P.values()), hp["clip"])
    opt = torch.optim.AdamW(list(P.values()), lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]),
                            eps=hp["eps"], weight_decay=hp["weight_decay"])
    opt.step()
    worst_u = 0.0
    for name in sorted(P):
        du, dref = P[name].detach() - init[name].double(), after[name] - init[name].double()
        worst_u = max(worst_u, rel(du, dref))
    print("  AdamW update (after - init) worst per-tensor rel err vs golden %.2e" % worst_u)


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    folders = sys.argv[1:] or [os.path.join(here, "..", "data", "golden", c)
                               for c in ("tiny_mha", "tiny_gqa")]
    for f in folders:
        check(f)
