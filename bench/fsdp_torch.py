#!/usr/bin/python3
"""The PyTorch side of bench/fsdp.sh: DistributedDataParallel over gloo, and
the summary table of a bench/fsdp.sh run.

    /usr/bin/python3 bench/fsdp_torch.py --ddp CONFIG [--ranks 2] [--steps N] [--warmup W]
    /usr/bin/python3 bench/fsdp_torch.py --summary RESULTS_FILE

--ddp starts --ranks processes (this script with --rank), each with one
thread (torch.set_num_threads(1), OMP/OPENBLAS_NUM_THREADS=1), that train
the reference model of docs/DESIGN.md (tests/kernels/torch_reference.py's
forward, fp32) wrapped in torch.nn.parallel.DistributedDataParallel over
gloo with the same global batch as weft (each rank B / ranks rows), with
clip_grad_norm_(1.0), AdamW (bench/step.c's hyper-parameters,
foreach=True) and zero_grad(set_to_none=True). Rank 0 prints one
"RESULT config=.. mode=torch-ddp ranks=.. tokens_per_s=.. step_s=..
peak_bytes=.. rss_bytes=.. loss=.. comm=dp:0/0/<ar>/0" line: the median
step time over the timed steps (the slowest rank's), the peak RSS of the
largest rank (torch has no allocator counter on CPU: peak_bytes = RSS), and
the gradient all-reduce's bus bytes per step, 2 (n-1)/n * 4 P (DDP
all-reduces every gradient once per step; gloo does not count them).

--summary reads the RESULT lines of weft-bench-fsdp and of --ddp and prints
tokens/s, per-rank peak memory, comm per mesh dim and the ratios; the last
line is "tokens/s ratio weft-fsdp/torch-ddp (small): R".
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

CONFIGS = {
    "tiny": dict(dim=256, layers=4, heads=8, kv_heads=8, ffn=688, vocab=256, seq=256, batch=8),
    "small": dict(dim=768, layers=12, heads=12, kv_heads=12, ffn=2048, vocab=8192, seq=512,
                  batch=4),
}


def shapes(c):
    D, H, K, F, V, L = c["dim"], c["heads"], c["kv_heads"], c["ffn"], c["vocab"], c["layers"]
    hd = D // H
    s = {"tok_embeddings.weight": (V, D)}
    for i in range(L):
        p = "layers.%d." % i
        s[p + "attention_norm.weight"] = (D,)
        s[p + "attention.wq.weight"] = (H * hd, D)
        s[p + "attention.wk.weight"] = (K * hd, D)
        s[p + "attention.wv.weight"] = (K * hd, D)
        s[p + "attention.wo.weight"] = (D, H * hd)
        s[p + "ffn_norm.weight"] = (D,)
        s[p + "feed_forward.w1.weight"] = (F, D)
        s[p + "feed_forward.w2.weight"] = (D, F)
        s[p + "feed_forward.w3.weight"] = (F, D)
    s["norm.weight"] = (D,)
    s["output.weight"] = (V, D)
    return s


def worker(args):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "kernels"))
    import torch_reference as ref
    torch.set_num_threads(1)
    c = CONFIGS[args.ddp]
    dist.init_process_group("gloo", rank=args.rank, world_size=args.ranks)
    cfg = {"dim": c["dim"], "heads": c["heads"], "kv_heads": c["kv_heads"], "layers": c["layers"]}
    torch.manual_seed(1234)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            ps = {}
            for name, shape in shapes(c).items():
                t = torch.ones(shape) if len(shape) == 1 else torch.randn(shape) * 0.02
                ps[name.replace(".", "__")] = torch.nn.Parameter(t)
            self.ps = torch.nn.ParameterDict(ps)

        def forward(self, inputs, targets):
            P = {k.replace("__", "."): v for k, v in self.ps.items()}
            return ref.forward(P, cfg, inputs, targets)

    model = torch.nn.parallel.DistributedDataParallel(Model())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, foreach=True)
    nparams = sum(p.numel() for p in model.parameters())
    rows = c["batch"] // args.ranks
    g = torch.Generator().manual_seed(99)
    times, loss = [], 0.0
    for s in range(args.warmup + args.steps):
        toks = torch.randint(0, c["vocab"], (c["batch"], c["seq"] + 1), generator=g)
        mine = toks[args.rank * rows:(args.rank + 1) * rows]
        inputs, targets = mine[:, :-1].contiguous(), mine[:, 1:].contiguous()
        dist.barrier()
        t0 = time.perf_counter()
        out = model(inputs, targets)
        out.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        lt = out.detach().double().reshape(1)
        dist.all_reduce(lt)
        loss = lt.item() / args.ranks
        if args.rank == 0:
            print("  step %d%s: %.3f s, loss %.5f" % (s, " (warmup)" if s < args.warmup else "",
                                                     dt.item(), loss), flush=True)
        if s >= args.warmup:
            times.append(dt.item())
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0],
                       dtype=torch.float64)
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if args.rank == 0:
        med = statistics.median(times)
        n = args.ranks
        ar = 2 * (n - 1) * 4 * nparams // n
        print("median step %.3f s -> %.0f tokens/s; per-rank peak RSS %.1f MiB" % (
            med, c["batch"] * c["seq"] / med, rss.item() / 1048576.0))
        print("RESULT config=%s mode=torch-ddp ranks=%d tokens_per_s=%.3f step_s=%.6f "
              "peak_bytes=%.0f rss_bytes=%.0f loss=%.6f comm=dp:0/0/%d/0" % (
                  args.ddp, n, c["batch"] * c["seq"] / med, med, rss.item(), rss.item(), loss,
                  ar), flush=True)
    dist.destroy_process_group()


def launch(args):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    procs = []
    for r in range(args.ranks):
        cmd = [sys.executable, os.path.abspath(__file__), "--ddp", args.ddp, "--rank", str(r),
               "--ranks", str(args.ranks), "--steps", str(args.steps), "--warmup",
               str(args.warmup)]
        procs.append(subprocess.Popen(cmd, env=env))
    rc = 0
    for p in procs:
        rc |= p.wait()
    return rc


def parse(path):
    res = {}
    with open(path) as f:
        for line in f:
            if not line.startswith("RESULT "):
                continue
            kv = dict(x.split("=", 1) for x in line.split()[1:])
            res[(kv["config"], kv["mode"])] = kv
    return res


def summary(path):
    res = parse(path)
    modes = [("single", "weft 1 rank"), ("fsdp", "weft FSDP dp=2"), ("tp", "weft TP tp=2"),
             ("2d", "weft 2-D 2x2 (4 ranks)"), ("torch-ddp", "torch DDP (gloo, 2)")]
    ratio_small = None
    for cfg in ("tiny", "small"):
        print()
        print("config %s (global batch B=%d, T=%d)" % (cfg, CONFIGS[cfg]["batch"],
                                                        CONFIGS[cfg]["seq"]))
        print("  %-24s %12s %10s %14s %12s   %s" % ("run", "tokens/s", "step s", "peak MiB/rank",
                                                   "RSS MiB/rank", "comm MB/step per mesh dim "
                                                   "(all-gather/reduce-scatter/all-reduce)"))
        for m, label in modes:
            r = res.get((cfg, m))
            if not r:
                print("  %-24s %12s" % (label, "(missing)"))
                continue
            dims = []
            for part in r["comm"].split(","):
                name, vals = part.split(":")
                v = [int(x) * 1e-6 for x in vals.split("/")]
                if any(v):
                    dims.append("%s %.2f/%.2f/%.2f" % (name, v[0], v[1], v[2]))
            print("  %-24s %12.0f %10.3f %14.1f %12.1f   %s" % (
                label, float(r["tokens_per_s"]), float(r["step_s"]),
                float(r["peak_bytes"]) / 1048576.0, float(r["rss_bytes"]) / 1048576.0,
                ", ".join(dims) if dims else "-"))

        def get(m, k):
            r = res.get((cfg, m))
            return float(r[k]) if r else float("nan")
        f, d, s1 = get("fsdp", "tokens_per_s"), get("torch-ddp", "tokens_per_s"), \
            get("single", "tokens_per_s")
        print("  tokens/s ratio weft-fsdp/torch-ddp: %.3f (target >= 1.3)" % (f / d))
        print("  tokens/s ratio weft-tp/torch-ddp: %.3f; weft-2d/torch-ddp: %.3f; "
              "weft-fsdp/weft-1-rank: %.3f" % (get("tp", "tokens_per_s") / d,
                                                get("2d", "tokens_per_s") / d, f / s1))
        print("  peak memory ratio weft-fsdp/weft-1-rank (allocator): %.3f (target <= 0.6); "
              "RSS: %.3f; weft-fsdp/torch-ddp RSS: %.3f" % (
                  get("fsdp", "peak_bytes") / get("single", "peak_bytes"),
                  get("fsdp", "rss_bytes") / get("single", "rss_bytes"),
                  get("fsdp", "rss_bytes") / get("torch-ddp", "rss_bytes")))
        if cfg == "small":
            ratio_small = f / d
    print("tokens/s ratio weft-fsdp/torch-ddp (small): %.3f" % ratio_small)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddp", choices=sorted(CONFIGS))
    ap.add_argument("--rank", type=int, default=-1)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--summary")
    args = ap.parse_args()
    if args.summary:
        summary(args.summary)
    elif args.ddp and args.rank >= 0:
        worker(args)
    elif args.ddp:
        sys.exit(launch(args))
    else:
        ap.error("give --ddp CONFIG or --summary FILE")


if __name__ == "__main__":
    main()
