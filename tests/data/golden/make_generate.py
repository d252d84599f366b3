#!/usr/bin/python3
"""Writes gpt2_tiny/gen_hf.safetensors, tiny_gqa/gen_hf.safetensors and
generate.json beside each: a model of the golden config trained in PyTorch
(float64, then stored f32) on sequences that count up by 3 modulo V, and the
greedy continuation of a prompt computed by a Hugging Face-semantics forward
(the same forwards as make_gpt2_hf.py / make_llama_hf.py, full sequence per
token, no KV cache) with the f32 weights in float64. Each generated token's
margin (its logit minus the runner-up's) is recorded; the smallest is far
from a tie, so weft's f32 greedy output must equal these tokens exactly.

    /usr/bin/python3 tests/data/golden/make_generate.py
"""
import json
import os
import struct

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
import importlib.util


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


G, L = load("make_gpt2_hf"), load("make_llama_hf")


def make(folder, reader, logits_fn, buffers):
    d = os.path.join(HERE, folder)
    c = json.load(open(os.path.join(d, "expected.json")))["config"]
    V, T = c["vocab"], c["seq"]
    t = {k: v.double().requires_grad_(True) for k, v in reader(os.path.join(d, "init_hf.safetensors")).items()
         if not any(b in k for b in buffers)}
    keep = {k: v for k, v in reader(os.path.join(d, "init_hf.safetensors")).items()
            if any(b in k for b in buffers)}
    opt = torch.optim.Adam(t.values(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for step in range(300):
        start = torch.randint(0, V, (8, 1), generator=g)
        seq = (start + 3 * torch.arange(T + 1)) % V
        loss = F.cross_entropy(logits_fn(t, seq[:, :-1], c).reshape(-1, V), seq[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    w = {k: v.detach().float() for k, v in t.items()}
    w.update(keep)
    G.write_st(os.path.join(d, "gen_hf.safetensors"), dict(sorted(w.items())))
    t64 = {k: v.double() for k, v in reader(os.path.join(d, "gen_hf.safetensors")).items()}
    prompt = [7, 10, 13]
    ids, margins = list(prompt), []
    P = c.get("positions", T)
    n_new = 24
    for _ in range(n_new):
        z = logits_fn(t64, torch.tensor([ids[-P:]]), c)[0, -1]
        top = torch.topk(z, 2).values
        margins.append((top[0] - top[1]).item())
        ids.append(int(z.argmax()))
    out = {"prompt": prompt, "tokens": ids[len(prompt):], "min_margin": min(margins),
           "final_train_loss": loss.item(),
           "how": "greedy, full sequence per token, last %d positions" % P}
    json.dump(out, open(os.path.join(d, "generate.json"), "w"), indent=1)
    print(folder, out)


if __name__ == "__main__":
    make("gpt2_tiny", G.read_st, G.gpt2_logits, [".attn.bias"])
    make("tiny_gqa", L.read_st, L.llama_logits, ["rotary_emb.inv_freq"])
