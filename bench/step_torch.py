#!/usr/bin/python3
"""One training step of the reference model, weft against PyTorch, in one run.

    /usr/bin/python3 bench/step_torch.py --weft build/bench/weft-bench-step \
        [--threads N] [--steps S] [--warmup W] CONFIG [CONFIG ...]

For each config (tiny, small, gpt2-tiny, gpt2-small: see bench/step.c) this
starts weft-bench-step in --serve mode, which writes its initial weights and
tokens to a safetensors file; PyTorch (fp32, this process) starts from the
same weights and tokens. The Llama model (tiny, small) is
tests/kernels/torch_reference.py's forward (the one PyTorch model of
docs/DESIGN.md in this repository); GPT-2 (gpt2-*) is bench/gpt2_torch.py, an
nn.Module in nanoGPT's style, with nanoGPT's two AdamW parameter groups.
Both with torch autograd, torch.nn.utils.clip_grad_norm_(1.0),
torch.optim.AdamW (same hyper-parameters as weft; foreach=True, torch's
fastest CPU path here) and zero_grad(set_to_none=True).

Steps alternate between weft and PyTorch round by round (the order flips
every round), and every round also times two 2048^3 SGEMMs in the weft
process, so load from other processes hits all three alike. Reported: the
median step time of each after W warmup rounds, tokens/s, model FLOPs
utilisation (model FLOPs per step as bench/step.c counts them, divided by
the median step time and by the best SGEMM rate seen in the run: load
from other processes only ever lowers a rate, so the best one is the
machine's), and the step time ratio weft/torch = median(weft) /
median(torch); the median of the per-round ratios and the ratio of the
fastest rounds are printed beside it. A second table gives each side's
peak resident memory (VmHWM) over the config and their ratio: weft's whole
process, and this process's from the config's start (reset through
/proc/self/clear_refs, so its floor is the RSS then, torch loaded). Both sides use
N threads: torch.set_num_threads(N), OMP_NUM_THREADS=N and
OPENBLAS_NUM_THREADS=N for both processes (torch's matmuls go to the same
OpenBLAS here), and OMP_WAIT_POLICY=PASSIVE unless set (torch's fastest
setting here, see main()).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "kernels"))

CONFIGS = {
    "tiny": dict(dim=256, layers=4, heads=8, kv_heads=8, ffn=688, vocab=256, seq=256, batch=8),
    "small": dict(dim=768, layers=12, heads=12, kv_heads=12, ffn=2048, vocab=8192, seq=512,
                  batch=4),
    # GPT-2 with the Llama configs' sizes and GPT-2's MLP (F = 4 D)
    "gpt2-tiny": dict(gpt2=True, dim=256, layers=4, heads=8, ffn=1024, vocab=256, seq=256,
                      batch=8),
    "gpt2-small": dict(gpt2=True, dim=768, layers=12, heads=12, ffn=3072, vocab=8192, seq=512,
                       batch=4),
}


def peak_rss(pid):
    """The process's peak resident memory in bytes (VmHWM), or None."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_rss(pid):
    """Restarts VmHWM from the current RSS (Linux: clear_refs 5); False if refused."""
    try:
        with open("/proc/%d/clear_refs" % pid, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class Weft:
    """weft-bench-step --serve, driven line by line."""

    def __init__(self, binary, config, dump, env):
        self.p = subprocess.Popen([binary, config, "--serve", "--dump", dump],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                  universal_newlines=True, bufsize=1)
        ready = self.p.stdout.readline().split()
        if not ready or ready[0] != "ready":
            raise RuntimeError("weft-bench-step did not start (got %r)" % ready)
        self.flops = float(ready[2])

    def ask(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        reply = self.p.stdout.readline().split()
        if not reply or reply[0] != cmd:
            raise RuntimeError("weft-bench-step: %r -> %r" % (cmd, reply))
        return [float(x) for x in reply[1:]]

    def close(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
        except BrokenPipeError:
            pass
        self.p.wait(timeout=60)


class Torch:
    def __init__(self, torch, ref, path, cfg):
        st = ref.load_safetensors(path)
        self.torch = torch
        self.ref = ref
        self.inputs = st.pop("inputs").long()
        self.targets = st.pop("targets").long()
        self.params = {k: v.float().requires_grad_(True) for k, v in st.items()}
        self.cfg = cfg
        self.opt = torch.optim.AdamW(list(self.params.values()), lr=3e-4, betas=(0.9, 0.95),
                                     eps=1e-8, weight_decay=0.1, foreach=True)

    def step(self):
        t0 = time.perf_counter()
        loss = self.ref.forward(self.params, self.cfg, self.inputs, self.targets)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        norm = self.torch.nn.utils.clip_grad_norm_(list(self.params.values()), 1.0)
        t3 = time.perf_counter()
        self.opt.step()
        t4 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        t5 = time.perf_counter()
        return [t5 - t0, t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, loss.item(), norm.item()]


class TorchGPT2:
    """bench/gpt2_torch.py's GPT-2 from weft's dumped weights, one step at a time."""

    def __init__(self, torch, ref, path, cfg):
        import gpt2_torch
        st = ref.load_safetensors(path)
        self.torch = torch
        self.inputs = st.pop("inputs").long()
        self.targets = st.pop("targets").long()
        self.model = gpt2_torch.build(cfg, st)
        self.params = list(self.model.parameters())
        self.opt = gpt2_torch.adamw(self.model, lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                    weight_decay=0.1)

    def step(self):
        t0 = time.perf_counter()
        loss = self.model(self.inputs, self.targets)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        norm = self.torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        t3 = time.perf_counter()
        self.opt.step()
        t4 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        t5 = time.perf_counter()
        return [t5 - t0, t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, loss.item(), norm.item()]


def run_config(name, args, torch, ref):
    c = CONFIGS[name]
    if c.get("gpt2"):
        cfg = c
    else:
        cfg = {"dim": c["dim"], "heads": c["heads"], "kv_heads": c["kv_heads"],
               "layers": c["layers"]}
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads),
               OMP_NUM_THREADS=str(args.threads))
    fd, dump = tempfile.mkstemp(prefix="weft-step-", suffix=".safetensors")
    os.close(fd)
    # torch's peak: this process's, from here (its RSS now, with torch
    # loaded, is the floor, as weft's process counts its own libraries)
    torch_reset = reset_peak_rss(os.getpid())
    try:
        weft = Weft(args.weft, name, dump, env)
        tq = (TorchGPT2 if c.get("gpt2") else Torch)(torch, ref, dump, cfg)
    finally:
        os.unlink(dump)
    rounds = args.warmup + args.steps
    wt, tt, sg, ratios = [], [], [], []
    try:
        for r in range(rounds):
            if r % 2 == 0:
                w = weft.ask("step")
                t = tq.step()
            else:
                t = tq.step()
                w = weft.ask("step")
            g = max(weft.ask("sgemm")[0], weft.ask("sgemm")[0])
            tag = " (warmup)" if r < args.warmup else ""
            print("  %s round %d%s: weft %.1f ms (fwd %.1f bwd %.1f clip %.1f adamw %.1f zero "
                  "%.1f) loss %.6f | torch %.1f ms (fwd %.1f bwd %.1f clip %.1f adamw %.1f zero "
                  "%.1f) loss %.6f | sgemm %.1f GF/s" % (
                      (name, r, tag) + tuple(x * 1e3 for x in w[:6]) + (w[6],) +
                      tuple(x * 1e3 for x in t[:6]) + (t[6], g)), flush=True)
            if r == 0 and abs(w[6] - t[6]) > 1e-4 * abs(t[6]):
                print("  warning: first-step losses differ (weft %.9g, torch %.9g)" % (w[6], t[6]))
            if r >= args.warmup:
                wt.append(w[0])
                tt.append(t[0])
                sg.append(g)
                ratios.append(w[0] / t[0])
        weft_peak = peak_rss(weft.p.pid)
        torch_peak = peak_rss(os.getpid())
    finally:
        weft.close()
    flops, tokens = weft.flops, c["batch"] * c["seq"]
    res = dict(name=name, weft=statistics.median(wt), torch=statistics.median(tt),
               sgemm=max(sg), ratio=statistics.median(wt) / statistics.median(tt),
               round_ratio=statistics.median(ratios), best_ratio=min(wt) / min(tt), flops=flops,
               tokens=tokens, weft_peak=weft_peak, torch_peak=torch_peak,
               torch_peak_reset=torch_reset)
    del tq
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True, help="path of weft-bench-step")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps-small", type=int, default=None,
                    help="timed steps for the small configs (default: --steps)")
    ap.add_argument("configs", nargs="+", choices=sorted(CONFIGS))
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    # Idle OpenMP threads sleep instead of spinning: torch's OpenMP workers
    # otherwise spin against the OpenBLAS threads (and other processes) for
    # the cores; measured here on the tiny config under load, PASSIVE made
    # torch's step about 3x faster. Set OMP_WAIT_POLICY to override.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch  # after the thread variables are set
    import torch_reference as ref
    torch.set_num_threads(args.threads)
    print("threads %d (torch.get_num_threads() = %d, OMP_WAIT_POLICY=%s); load average before: %s"
          % (args.threads, torch.get_num_threads(), os.environ["OMP_WAIT_POLICY"],
             " ".join("%.2f" % x for x in os.getloadavg())))
    results = []
    for name in args.configs:
        a = argparse.Namespace(**vars(args))
        if name.endswith("small") and args.steps_small:
            a.steps = args.steps_small
        results.append(run_config(name, a, torch, ref))
    print("load average after: %s" % " ".join("%.2f" % x for x in os.getloadavg()))
    print()
    print("%-10s %10s %10s %11s %11s %9s %9s %10s %7s %7s %7s" % (
        "config", "weft ms", "torch ms", "weft tok/s", "torch tok/s", "weft MFU", "torch MFU",
        "SGEMM GF/s", "ratio", "rounds", "best"))
    for r in results:
        mfu = lambda t: 100.0 * r["flops"] / t / (r["sgemm"] * 1e9)
        print("%-10s %10.1f %10.1f %11.0f %11.0f %8.1f%% %8.1f%% %10.1f %7.3f %7.3f %7.3f" % (
            r["name"], r["weft"] * 1e3, r["torch"] * 1e3, r["tokens"] / r["weft"],
            r["tokens"] / r["torch"], mfu(r["weft"]), mfu(r["torch"]), r["sgemm"], r["ratio"],
            r["round_ratio"], r["best_ratio"]))
    print("(model FLOPs/step: %s; ratio = median weft / median torch step time; rounds = median "
          "of the per-round ratios; best = fastest weft round / fastest torch round)" % ", ".join(
              "%s %.1f GFLOP" % (r["name"], r["flops"] * 1e-9) for r in results))
    print()
    print("%-10s %14s %14s %7s" % ("config", "weft peak GB", "torch peak GB", "ratio"))
    for r in results:
        if r["weft_peak"] and r["torch_peak"]:
            print("%-10s %14.2f %14.2f %7.2f%s" % (
                r["name"], r["weft_peak"] / 1e9, r["torch_peak"] / 1e9,
                r["weft_peak"] / r["torch_peak"],
                "" if r["torch_peak_reset"] else "  (torch's peak not reset: the whole run's)"))
        else:
            print("%-10s peak memory unknown (no /proc/PID/status VmHWM)" % r["name"])
    print("(process peak resident memory, max RSS: weft-bench-step's whole process; torch's "
          "process from the start of the config, its RSS then included)")
    for r in results:
        print("step time ratio weft/torch (%s): %.3f" % (r["name"], r["ratio"]))


if __name__ == "__main__":
    main()
