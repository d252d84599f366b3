#!/usr/bin/python3
"""Writes gpt2_tiny/init_hf.safetensors: the golden GPT-2's init weights in
Hugging Face transformers' GPT-2 layout, as GPT2Model.save_pretrained and
the hub's gpt2/model.safetensors lay them out:

  - names without the "transformer." prefix ("wte.weight", "h.0.ln_1.weight");
  - attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj are Conv1D modules:
    weight [in, out], y = x @ weight + bias (nanoGPT's / weft's Linear holds
    [out, in]);
  - each block's causal-mask buffer "h.N.attn.bias" [1, 1, P, P] (f32
    lower-triangular ones, as older transformers versions save it);
  - no lm_head.weight (tied to wte).

It then runs an HF-semantics GPT-2 forward over the golden batch in float64
from the tensors it wrote (Conv1D products, GELU tanh, LayerNorm eps 1e-5)
and checks the loss against expected.json, so the file is known to be a
correct HF-layout GPT-2 independently of weft's converter.

    /usr/bin/python3 tests/data/golden/make_gpt2_hf.py
"""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt2_tiny")
DT = {"F32": torch.float32, "F64": torch.float64}
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def read_st(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        t = torch.frombuffer(bytearray(b[8 + n + s:8 + n + e]), dtype=DT[v["dtype"]])
        out[k] = t.reshape(v["shape"]).clone()
    return out


def write_st(path, tensors):
    header, blobs, off = {}, [], 0
    for k, t in tensors.items():
        raw = t.contiguous().numpy().tobytes()
        header[k] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))


def gpt2_logits(t, ids, c):
    """transformers' GPT-2 forward (Conv1D x @ W + b, GELU tanh, LayerNorm
    eps 1e-5, causal mask) over ids [B, T], from HF-named tensors t."""
    B, T = ids.shape
    D, H = c["dim"], c["heads"]
    ln = lambda x, p: F.layer_norm(x, (D,), t[p + ".weight"], t[p + ".bias"], 1e-5)
    conv = lambda x, p: x @ t[p + ".weight"] + t[p + ".bias"]
    x = t["wte.weight"][ids] + t["wpe.weight"][:T]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for i in range(c["layers"]):
        p = "h.%d." % i
        q, k, v = conv(ln(x, p + "ln_1"), p + "attn.c_attn").split(D, dim=2)
        q, k, v = (z.view(B, T, H, D // H).transpose(1, 2) for z in (q, k, v))
        a = ((q @ k.transpose(-2, -1)) / math.sqrt(D // H)).masked_fill(mask, float("-inf"))
        x = x + conv((a.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D), p + "attn.c_proj")
        x = x + conv(F.gelu(conv(ln(x, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh"),
                     p + "mlp.c_proj")
    return ln(x, "ln_f") @ t["wte.weight"].t()


def main():
    cfg = json.load(open(os.path.join(HERE, "expected.json")))
    c = cfg["config"]
    w = read_st(os.path.join(HERE, "init.safetensors"))
    hf = {}
    for k, t in sorted(w.items()):
        name = k[len("transformer."):] if k.startswith("transformer.") else k
        hf[name] = t.t().contiguous() if name.endswith(CONV1D) else t
    P = c["positions"]
    for i in range(c["layers"]):
        hf["h.%d.attn.bias" % i] = torch.tril(torch.ones(P, P)).view(1, 1, P, P)
    write_st(os.path.join(HERE, "init_hf.safetensors"), hf)

    # an HF-semantics forward in float64 from what was written
    t = {k: v.double() for k, v in read_st(os.path.join(HERE, "init_hf.safetensors")).items()}
    toks = open(os.path.join(HERE, "tokens.bin"), "rb").read()
    hdr = struct.unpack("<256i", toks[:1024])
    ids = torch.tensor(struct.unpack("<%dH" % hdr[2], toks[1024:1024 + 2 * hdr[2]]))
    B, T = c["batch"], c["seq"]
    x_ids, y_ids = ids[:B * T].view(B, T), ids[1:B * T + 1].view(B, T)
    logits = gpt2_logits(t, x_ids, c)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y_ids.reshape(-1)).item()
    assert abs(loss - cfg["loss"]) <= 1e-6 * abs(cfg["loss"]), (loss, cfg["loss"])
    print("init_hf.safetensors: %d tensors, HF-layout forward loss %.12f (expected %.12f)" %
          (len(hf), loss, cfg["loss"]))


if __name__ == "__main__":
    main()
