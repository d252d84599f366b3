"""GPT-2 in PyTorch, nanoGPT's model.py style, for bench/step_torch.py's
GPT-2 row (the peer of models/gpt2 in weft-bench-step gpt2-tiny|gpt2-small).

The same model as models/gpt2/gpt2.h: token and learned position embeddings,
pre-norm blocks (LayerNorm eps 1e-5 with bias; causal self-attention through
one fused c_attn (3D, D) and c_proj; MLP c_fc (F, D), GELU (tanh
approximation, as llm.c and weft), c_proj), a final LayerNorm and lm_head
tied to wte; every Linear has a bias except lm_head; no dropout. Parameter
names are nanoGPT's, which are also weft's FQNs, so weft's dumped weights
load by name. torch 1.13 has no scaled_dot_product_attention: attention is
nanoGPT's explicit path (scores, causal mask, softmax, @ v).

AdamW with nanoGPT's configure_optimizers groups: weight decay on parameters
of 2 or more dims (Linear weights, wte, wpe), none on biases and LayerNorm
weights (weft_gpt2_adamw_create makes the same two groups).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads, seq):
        super().__init__()
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.heads = heads
        self.register_buffer("bias", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq),
                             persistent=False)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        hd = C // self.heads
        q, k, v = (t.view(B, T, self.heads, hd).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, dim, ffn):
        super().__init__()
        self.c_fc = nn.Linear(dim, ffn)
        self.c_proj = nn.Linear(ffn, dim)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, dim, heads, ffn, seq):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = CausalSelfAttention(dim, heads, seq)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = MLP(dim, ffn)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, vocab, seq, dim, layers, heads, ffn):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, dim),
            wpe=nn.Embedding(seq, dim),
            h=nn.ModuleList([Block(dim, heads, ffn, seq) for _ in range(layers)]),
            ln_f=nn.LayerNorm(dim, eps=1e-5),
        ))
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as nanoGPT

    def forward(self, idx, targets):
        B, T = idx.size()
        pos = torch.arange(0, T, dtype=torch.long)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def build(cfg, weights):
    """The model of config cfg (dim, layers, heads, ffn, vocab, seq) in float32
    with the weights of dict `weights` (weft's FQNs; lm_head.weight is wte's)."""
    m = GPT2(cfg["vocab"], cfg["seq"], cfg["dim"], cfg["layers"], cfg["heads"], cfg["ffn"])
    missing, unexpected = m.load_state_dict({k: v.float() for k, v in weights.items()},
                                            strict=False)
    if missing != ["lm_head.weight"] or unexpected:
        raise RuntimeError("GPT-2 weights: missing %s, unexpected %s" % (missing, unexpected))
    return m


def adamw(model, lr, betas, eps, weight_decay):
    """nanoGPT's two groups: decay on dim >= 2, none on the rest."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, foreach=True)
