#!/usr/bin/python3
"""PyTorch side of tests/nn/test_torch_crosscheck.c.

    /usr/bin/python3 tests/nn/torch_crosscheck.py DIR

DIR holds what the C test wrote: config.json, weights.safetensors (the
parameters, F32, and the tokens "inputs"/"targets", I32 [B, T]) and
weft.safetensors (weft's fp32 gradients under the parameter names, and
"loss", F64 [1]). This recomputes the mean cross-entropy loss and every
gradient in float64 with torch autograd, using the model of
tests/kernels/torch_reference.py (built from docs/DESIGN.md; the one PyTorch
model in this repository), prints the errors and exits
  0  loss rel err <= 1e-6 and every gradient's ||g_weft - g_torch|| /
     ||g_torch|| <= 1e-5
  1  a mismatch (the table says which)
  2  bad input (missing files, names or shapes that do not match)
"""
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "kernels"))

LOSS_TOL = 1e-6
GRAD_TOL = 1e-5


def fail_input(msg):
    print("torch_crosscheck: " + msg)
    sys.exit(2)


def main():
    if len(sys.argv) != 2:
        fail_input("usage: torch_crosscheck.py DIR")
    folder = sys.argv[1]
    import torch
    import torch_reference as ref

    try:
        cfg = json.load(open(os.path.join(folder, "config.json")))
        weights = ref.load_safetensors(os.path.join(folder, "weights.safetensors"))
        weft = ref.load_safetensors(os.path.join(folder, "weft.safetensors"))
    except (OSError, ValueError, KeyError) as e:
        fail_input("cannot read %s: %s" % (folder, e))
    if abs(cfg.get("norm_eps", 1e-5) - 1e-5) > 1e-12 or cfg.get("rope_theta", 1e4) != 1e4:
        fail_input("the reference model has eps 1e-5 and theta 10000; config says %r" % cfg)
    inputs = weights.pop("inputs").long()
    targets = weights.pop("targets").long()
    B, T = cfg["batch"], cfg["seq"]
    if tuple(inputs.shape) != (B, T) or tuple(targets.shape) != (B, T):
        fail_input("tokens %s / targets %s, config says (%d, %d)" % (
            tuple(inputs.shape), tuple(targets.shape), B, T))
    if "loss" not in weft:
        fail_input("weft.safetensors has no 'loss'")
    weft_loss = weft.pop("loss").double().item()
    if sorted(weights) != sorted(weft):
        fail_input("parameter names differ: only in weights %s, only in weft grads %s" % (
            sorted(set(weights) - set(weft)), sorted(set(weft) - set(weights))))

    P = {k: v.double().requires_grad_(True) for k, v in weights.items()}
    loss = ref.forward(P, cfg, inputs, targets)
    loss.backward()

    ok = True
    lerr = abs(weft_loss - loss.item()) / abs(loss.item())
    ok &= lerr <= LOSS_TOL
    print("torch_crosscheck: D=%d L=%d H=%d Hkv=%d F=%d V=%d B=%d T=%d seed %s" % (
        cfg["dim"], cfg["layers"], cfg["heads"], cfg["kv_heads"], cfg["ffn"], cfg["vocab"], B, T,
        cfg.get("seed", "?")))
    print("  loss weft %.12g torch(f64) %.12g rel err %.2e (tol %.0e)%s" % (
        weft_loss, loss.item(), lerr, LOSS_TOL, "" if lerr <= LOSS_TOL else "  MISMATCH"))
    worst = 0.0
    for name in sorted(P):
        g = P[name].grad
        w = weft[name].double()
        if tuple(w.shape) != tuple(g.shape):
            fail_input("grad %s: weft shape %s, torch %s" % (name, tuple(w.shape), tuple(g.shape)))
        gn = g.norm().item()
        err = (w - g).norm().item() / gn if gn > 0 else (w - g).norm().item()
        bad = not (err <= GRAD_TOL)  # NaN fails too
        ok &= not bad
        worst = max(worst, err) if not math.isnan(err) else float("inf")
        print("  grad %-36s norm %.6e rel err %.2e%s" % (name, gn, err, "  MISMATCH" if bad else ""))
    print("  worst grad rel err %.2e (tol %.0e): %s" % (worst, GRAD_TOL, "ok" if ok else "FAILED"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
