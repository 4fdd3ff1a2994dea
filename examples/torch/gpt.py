#!/usr/bin/env python3
"""A PyTorch byte-level GPT pretraining on nebula's multilingual corpus, three ways:

  --mode nebula  one cluster of a nebula job (nebula.torch.DiLoCo over a session from the
                 NEBULA_* environment that `nebula run` or a gateway sets): each cluster trains
                 on its own languages, the WAN carries only the outer round's updates
  --mode single  one process on every cluster's data (the baseline nebula is measured against)
  --mode ddp     PyTorch DDP with gloo across the clusters (torch.distributed's env:// set-up):
                 what a PyTorch user does without nebula, every step's gradients on the WAN

The model is the user's own (SDPA attention, pre-LayerNorm blocks, tied embeddings); nothing of
it is nebula's. Each run writes a summary JSON (final held-out loss, wall time, WAN bytes,
compute utilization) to --out-dir (default: the folder of NEBULA_PROGRESS_FILE, else the current
one). The data: <data-dir>/mono/<lang>.txt (`make data`); the last 1 % of every language of the
job is held out and never trained on.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
# the two-datacenter split of docs/data: each cluster trains on the text that lives there
DEFAULT_LANGS = "en,de,fr,es;en,ru,zh,fa"


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers: int, width: int, heads: int, context: int):
        super().__init__()
        self.tok = nn.Embedding(256, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.ln(x) @ self.tok.weight.t()  # tied: the head is the embedding


class Corpus:
    """The training bytes of some languages and the held-out tail of each."""

    def __init__(self, data_dir: str, langs: list[str], context: int):
        self.train, self.held = [], []
        for lang in langs:
            path = os.path.join(data_dir, "mono", lang + ".txt")
            try:
                raw = np.fromfile(path, dtype=np.uint8)
            except OSError as e:
                sys.exit(f"gpt.py: {path}: {e.strerror} (run `make data`, or give --data-dir)")
            if raw.size < 20 * (context + 1):
                sys.exit(f"gpt.py: {path}: {raw.size} bytes is too little text for context "
                         f"{context}")
            cut = raw.size - max(raw.size // 100, 4 * (context + 1))
            self.train.append(raw[:cut])
            self.held.append(raw[cut:])

    def batch(self, rng: np.random.Generator, batch: int, context: int) -> torch.Tensor:
        """batch windows of context + 1 bytes, languages in turn (equal share each)."""
        rows = []
        for i in range(batch):
            a = self.train[i % len(self.train)]
            o = int(rng.integers(0, a.size - context - 1))
            rows.append(a[o:o + context + 1])
        return torch.from_numpy(np.stack(rows).astype(np.int64))


@torch.no_grad()
def held_out_loss(model: GPT, held: list[np.ndarray], context: int, windows: int) -> float:
    """Mean next-byte loss (nats) over `windows` evenly spaced windows of every held-out tail."""
    was = model.training
    model.eval()
    total, count = 0.0, 0
    for a in held:
        starts = np.linspace(0, a.size - context - 1, windows).astype(np.int64)
        x = torch.from_numpy(np.stack([a[s:s + context + 1] for s in starts]).astype(np.int64))
        logits = model(x[:, :-1])
        total += F.cross_entropy(logits.reshape(-1, 256), x[:, 1:].reshape(-1),
                                 reduction="sum").item()
        count += x[:, 1:].numel()
    model.train(was)
    return total / count


def net_tx_bytes() -> int | None:
    """Bytes this process's network namespace sent on the emulated WAN link's device (deploy/wan's
    wan0: what crossed the link, TLS and TCP overhead included); None outside such a namespace
    (loopback: the bytes are then the ones counted by the library or the allreduce's size)."""
    try:
        with open("/proc/net/dev") as f:
            lines = f.readlines()[2:]
    except OSError:
        return None
    for ln in lines:
        name, data = ln.split(":", 1)
        if name.strip() == "wan0":
            return int(data.split()[8])
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("nebula", "single", "ddp"), default="nebula")
    ap.add_argument("--data-dir", default=os.environ.get("NEBULA_DATA_DIR",
                                                         os.path.join(HERE, "..", "..", "data",
                                                                      "quick")))
    ap.add_argument("--langs", default=DEFAULT_LANGS,
                    help="languages per cluster, clusters separated by ';' (default %(default)s)")
    ap.add_argument("--steps", type=int, default=400, help="inner steps per cluster")
    ap.add_argument("--sync-every", type=int, default=0,
                    help="H inner steps per outer round (default NEBULA_INNER_STEPS, else 32)")
    ap.add_argument("--overlap", type=int, default=0, help="overlap_steps of the outer round")
    ap.add_argument("--land-early", action="store_true",
                    help="with --overlap: land each round as soon as its exchange is over "
                         "(DiLoCo's land_early), the overlap step being the latest")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8, help="windows per step per cluster")
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW's (the inner optimizer)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-windows", type=int, default=16, help="per held-out language")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (default OMP_NUM_THREADS, else 1)")
    ap.add_argument("--out-dir", default=None)
    a = ap.parse_args(argv)
    for k in ("steps", "layers", "width", "heads", "context", "batch", "eval_windows"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1")
    if a.width % a.heads:
        ap.error(f"--width {a.width} is not divisible by --heads {a.heads}")
    if a.mode == "nebula" and "NEBULA_CLUSTER_ID" not in os.environ:
        ap.error("--mode nebula needs the NEBULA_* environment (run it through `nebula run` or a "
                 "gateway job), or use --mode single")
    torch.set_num_threads(a.threads or int(os.environ.get("OMP_NUM_THREADS", "1") or 1))

    groups = [g.split(",") for g in a.langs.split(";")]
    if a.mode == "nebula":
        me = int(os.environ.get("NEBULA_CLUSTER_INDEX", "0"))
        ident = os.environ["NEBULA_CLUSTER_ID"]
    elif a.mode == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo")  # MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
        me = dist.get_rank()
        ident = f"rank{me}"
    else:
        me, ident = -1, "single"
    # under `nebula run` every line already carries the cluster's name
    tag = "" if a.mode == "nebula" else f"[{ident}] "
    if me >= len(groups):
        sys.exit(f"gpt.py: cluster index {me} has no languages in --langs {a.langs!r}")
    every = sorted({lang for g in groups for lang in g})
    mine = every if me < 0 else groups[me]
    corpus = Corpus(a.data_dir, every, a.context)  # every language's held-out tail: the same
    held = corpus.held                               # evaluation text on every cluster
    corpus.train = [corpus.train[every.index(lang)] for lang in mine]  # trains on its own

    torch.manual_seed(a.seed)  # the same initial model on every cluster (nebula takes cluster 0's)
    model = GPT(a.layers, a.width, a.heads, a.context)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    rng = np.random.default_rng(a.seed * 1000 + max(me, 0))
    # single trains on what both clusters together see per step (every cluster's batch)
    batch = a.batch * (len(groups) if me < 0 else 1)

    diloco, ddp = None, None
    if a.mode == "nebula":
        import nebula
        import nebula.torch
        h = a.sync_every or int(os.environ.get("NEBULA_INNER_STEPS", "32"))
        diloco = nebula.torch.DiLoCo(nebula.Session.from_env(inner_steps=h), model, h,
                                     overlap_steps=a.overlap, land_early=a.land_early)
        # the binding's cost: time inside the library's round calls, against the whole sync
        # (flattening, copies, Python) as DiLoCo.step spends it
        c_time = [0.0]

        def timed(call):
            def run(*args):
                t = time.perf_counter()
                try:
                    return call(*args)
                finally:
                    c_time[0] += time.perf_counter() - t
            return run
        for name in ("round", "round_begin", "round_end"):
            setattr(diloco.session, name, timed(getattr(diloco.session, name)))
    elif a.mode == "ddp":
        ddp = nn.parallel.DistributedDataParallel(model)
    net = ddp or model

    tx0 = net_tx_bytes()
    t0 = time.perf_counter()
    compute_s, sync_s, counted, rounds = 0.0, 0.0, 0, 0
    first_loss = None
    for step in range(a.steps):
        c0 = time.perf_counter()
        x = corpus.batch(rng, batch, a.context)
        loss = F.cross_entropy(net(x[:, :-1]).reshape(-1, 256), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # ddp: the gradients' allreduce crosses the link here
        opt.step()
        if first_loss is None:
            first_loss = loss.item()
        if ddp is None:
            compute_s += time.perf_counter() - c0
        if diloco is not None:
            s0 = time.perf_counter()
            info = diloco.step(samples=batch, loss=loss.item())
            sync_s += time.perf_counter() - s0
            if info is not None:
                rounds += 1
                counted += info.bytes_sent
                print(f"{tag}round {info.round + 1} step {step + 1} loss {loss.item():.4f} "
                      f"sent {info.bytes_sent} B wait {info.wait_s:.3f} s "
                      f"hash {info.global_hash:016x}", flush=True)
        elif (step + 1) % 50 == 0:
            print(f"{tag}step {step + 1} loss {loss.item():.4f}", flush=True)
    c_sync = c_time[0] if diloco is not None else 0.0  # before finish's own calls
    if diloco is not None:
        diloco.finish()
    wall = time.perf_counter() - t0
    if ddp is not None:
        # the allreduce waits inside backward: time the same steps without the link to split
        # compute from communication (one short pass, no gradient exchange)
        c0 = time.perf_counter()
        probe = min(a.steps, 10)
        for _ in range(probe):
            x = corpus.batch(rng, batch, a.context)
            with ddp.no_sync():
                F.cross_entropy(ddp(x[:, :-1]).reshape(-1, 256), x[:, 1:].reshape(-1)).backward()
            opt.zero_grad(set_to_none=True)
        compute_s = (time.perf_counter() - c0) / probe * a.steps
        counted = 2 * 4 * n_params * a.steps * (dist.get_world_size() - 1) // dist.get_world_size()
    tx1 = net_tx_bytes()
    final = held_out_loss(model, held, a.context, a.eval_windows)
    summary = {
        "mode": a.mode, "cluster": ident, "seed": a.seed, "steps": a.steps, "params": n_params,
        "langs": mine, "batch": batch, "wall_s": wall,
        "first_train_loss": first_loss, "final_eval_loss": final,
        "final_eval_bpb": final / math.log(2),
        "wan_bytes": (tx1 - tx0) if tx0 is not None and tx1 is not None else counted,
        "wan_bytes_measured_on_link": tx0 is not None and tx1 is not None,
        "wan_bytes_counted": counted,
        "compute_utilization": min(1.0, compute_s / wall) if wall > 0 else 0.0,
        "rounds": rounds,
        # (time in DiLoCo.step's syncs outside the library's calls) / (time inside them)
        "binding_overhead": (sync_s - c_sync) / c_sync if c_sync > 0 else None,
        "global_xxh3": f"{diloco.global_hash():016x}" if diloco is not None else None,
    }
    if diloco is not None:
        diloco.close()
    if a.mode == "ddp":
        dist.destroy_process_group()
    out_dir = a.out_dir or os.path.dirname(os.environ.get("NEBULA_PROGRESS_FILE", "")) or "."
    path = os.path.join(out_dir, f"torch-summary-{ident}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(tmp, path)  # never a half-written summary
    print(f"{tag}final held-out loss {final:.4f} nats ({final / math.log(2):.4f} bpb), "
          f"wall {wall:.1f} s, WAN {summary['wan_bytes']} B -> {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
