#!/usr/bin/env python3
"""PyTorch's training-step throughput for the model of `nebula bench train` (train/model.c).

The same byte-level GPT-2-shaped model: vocab 259, learned positions, pre-LayerNorm blocks
(ln_1 -> qkv -> causal attention -> proj, ln_2 -> fc -> tanh-GELU -> proj, residual adds), a
final LayerNorm, logits through the tied token embedding, mean cross-entropy; AdamW (lr 3e-4,
betas 0.9/0.95, eps 1e-8, weight decay 0.1 on the matrices and the token embedding) with global
norm clipping at 1.0, as nb_adamw_config_default. Attention is F.scaled_dot_product_attention
(is_causal=True). Prints both parameter counts and refuses (exit 3) when --params is given and
differs from this model's. A speed measurement on the CPU, not a correctness reference.

usage: torch_train.py --layers L --width C --context T --batch B --threads N
                      [--heads H] [--steps S] [--warmup W] [--params N] [--json | --serve]

--serve is how `nebula bench train` drives it, so that its steps and PyTorch's alternate and
see the same machine load: after the warm-up one JSON line {"ready": ...}; then for each line
"K" on stdin, K steps and one line {"step_s": [...]}; stdin's end ends it.
"""
import argparse
import json
import statistics
import sys
import time

VOCAB = 259  # the 256 bytes, SEP, EOS, PAD (train/model.h)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--width", type=int, required=True)
    ap.add_argument("--context", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--heads", type=int, default=0, help="default width/64 (at least 1)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--params", type=int, default=0, help="nebula's count: refuse if different")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--serve", action="store_true", help="steps on request (see above)")
    a = ap.parse_args()
    for k in ("layers", "width", "context", "batch", "threads", "steps"):
        if getattr(a, k) < 1:
            ap.error(f"--{k} must be >= 1")
    heads = a.heads or max(1, a.width // 64)
    if a.width % heads:
        ap.error(f"--width {a.width} is not divisible by --heads {heads}")

    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError as e:
        print(f"torch_train.py: PyTorch is not importable: {e}", file=sys.stderr)
        return 4

    torch.set_num_threads(a.threads)
    torch.manual_seed(7)
    L, C, T, B = a.layers, a.width, a.context, a.batch

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C, eps=1e-5)
            self.c_attn = nn.Linear(C, 3 * C)
            self.attn_proj = nn.Linear(C, C)
            self.ln_2 = nn.LayerNorm(C, eps=1e-5)
            self.c_fc = nn.Linear(C, 4 * C)
            self.mlp_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (z.view(b, t, heads, C // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(VOCAB, C)
            self.wpe = nn.Embedding(T, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C, eps=1e-5)
            for p in self.parameters():
                nn.init.normal_(p, std=0.02) if p.dim() == 2 else nn.init.zeros_(p)
            for m in self.modules():
                if isinstance(m, nn.LayerNorm):
                    nn.init.ones_(m.weight)

        def forward(self, idx, tgt):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for blk in self.h:
                x = blk(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # tied, as nebula's
            return F.cross_entropy(logits.view(-1, VOCAB), tgt.view(-1))

    model = GPT()
    n = sum(p.numel() for p in model.parameters())
    print(f"torch_train.py: parameters: torch {n}, nebula {a.params or '(not given)'}",
          file=sys.stderr)
    if a.params and a.params != n:
        print(f"torch_train.py: refusing: the models differ ({n} != {a.params} parameters)",
              file=sys.stderr)
        return 3
    decay = [p for name, p in model.named_parameters() if p.dim() == 2 and name != "wpe.weight"]
    rest = [p for name, p in model.named_parameters() if not (p.dim() == 2 and name != "wpe.weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(7)
    idx = torch.randint(0, 256, (B, T), generator=g)
    tgt = torch.randint(0, 256, (B, T), generator=g)

    def step():
        loss = model(idx, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(loss.detach())

    for _ in range(a.warmup):
        step()
    # PyTorch's own square sgemm rate at nebula's n = 1024: says when its BLAS is the slow side
    x, y = torch.randn(1024, 1024), torch.randn(1024, 1024)
    x @ y
    best = min(timed(lambda: x @ y) for _ in range(3))
    sgemm_gflops = 2 * 1024**3 / best / 1e9
    if a.serve:
        print(json.dumps({"ready": True, "torch": torch.__version__, "params": n,
                          "threads": torch.get_num_threads(), "sgemm_gflops": sgemm_gflops}),
              flush=True)
        for line in sys.stdin:
            times = []
            for _ in range(max(0, int(line))):
                t0 = time.perf_counter()
                step()
                times.append(time.perf_counter() - t0)
            print(json.dumps({"step_s": times}), flush=True)
        return 0
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    out = {"torch": torch.__version__, "params": n, "threads": torch.get_num_threads(),
           "sgemm_gflops": sgemm_gflops,
           "layers": L, "width": C, "heads": heads, "context": T, "batch": B,
           "step_s": step_s, "tokens_per_s": B * T / step_s}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"torch {out['torch']}: {n} parameters, step {step_s * 1e3:.1f} ms, "
              f"{out['tokens_per_s']:.0f} tokens/s, {out['threads']} threads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
