#!/usr/bin/env python3
"""Remote fine-tuning of a translation model with LoRA: a Hugging Face `transformers` T5 built
from a small config (byte-level: ByT5's tokenizer needs no vocabulary file, nothing is
downloaded), `peft` LoRA adapters on its attention, trained en->X on each cluster's own share of
the translation pairs; only the adapters are trainable, so only they are registered with nebula
and only they cross the WAN. chrF and BLEU (sacrebleu) on the pair's test split at the end.

  --mode nebula  one cluster of a nebula job (the NEBULA_* environment of `nebula run` or a
                 gateway): cluster i trains on pairs i, i + N, i + 2N, ... of the split
  --mode single  one process on every pair

The base model is the same on every cluster: --base FILE (safetensors of a T5 of this config),
else initialised from --seed. --save-adapters FILE writes the adapters as safetensors (atomic).
The summary JSON goes to --out-dir (default: the folder of NEBULA_PROGRESS_FILE, else the
current one).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import ByT5Tokenizer, T5Config, T5ForConditionalGeneration
except ImportError as e:  # scripts/setup.sh pins torch, transformers and peft
    print(f"t5_lora.py: {e.name} is not installed (scripts/setup.sh installs it)", file=sys.stderr)
    sys.exit(77)


def read_pairs(path: str, limit: int | None = None) -> list[tuple[str, str]]:
    try:
        with open(path, encoding="utf-8") as f:
            rows = [ln.rstrip("\n").split("\t") for ln in f]
    except OSError as e:
        sys.exit(f"t5_lora.py: {path}: {e.strerror} (run `make data`, or give --data-dir)")
    pairs = [(r[0], r[1]) for r in rows if len(r) == 2 and r[0] and r[1]]
    if not pairs:
        sys.exit(f"t5_lora.py: {path}: no 'source<TAB>target' lines")
    return pairs[:limit] if limit else pairs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("nebula", "single"), default="nebula")
    ap.add_argument("--data-dir", default=os.environ.get(
        "NEBULA_DATA_DIR", os.path.join(HERE, "..", "..", "data", "quick")))
    ap.add_argument("--pair", default="en-de", help="pairs/<pair>.{train,test}.tsv")
    ap.add_argument("--steps", type=int, default=200, help="inner steps per cluster")
    ap.add_argument("--sync-every", type=int, default=0,
                    help="H (default NEBULA_INNER_STEPS, else 16)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-bytes", type=int, default=96, help="longest source/target, bytes")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--base", default=None, help="the base model's safetensors")
    ap.add_argument("--save-adapters", default=None)
    ap.add_argument("--eval-sentences", type=int, default=32)
    ap.add_argument("--out-dir", default=None)
    a = ap.parse_args(argv)
    for k in ("steps", "batch", "max_bytes", "d_model", "layers", "lora_rank", "eval_sentences"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1")
    if a.mode == "nebula" and "NEBULA_CLUSTER_ID" not in os.environ:
        ap.error("--mode nebula needs the NEBULA_* environment (run it through `nebula run` or a "
                 "gateway job), or use --mode single")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))

    if a.mode == "nebula":
        me = int(os.environ.get("NEBULA_CLUSTER_INDEX", "0"))
        n = int(os.environ.get("NEBULA_N_CLUSTERS", "1"))
        ident = os.environ["NEBULA_CLUSTER_ID"]
    else:
        me, n, ident = 0, 1, "single"
    train = read_pairs(os.path.join(a.data_dir, "pairs", f"{a.pair}.train.tsv"))[me::n]
    test = read_pairs(os.path.join(a.data_dir, "pairs", f"{a.pair}.test.tsv"), a.eval_sentences)

    tok = ByT5Tokenizer()
    cfg = T5Config(vocab_size=len(tok), d_model=a.d_model, d_kv=a.d_model // 4,
                   d_ff=2 * a.d_model, num_layers=a.layers, num_decoder_layers=a.layers,
                   num_heads=4, dropout_rate=0.0, decoder_start_token_id=tok.pad_token_id,
                   pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                   tie_word_embeddings=False)
    torch.manual_seed(a.seed)
    base = T5ForConditionalGeneration(cfg)
    if a.base:
        from safetensors.torch import load_file
        try:
            state = load_file(a.base)
        except (OSError, ValueError) as e:
            sys.exit(f"t5_lora.py: --base {a.base}: {e}")
        missing, unexpected = base.load_state_dict(state, strict=False)
        if missing or unexpected:
            sys.exit(f"t5_lora.py: --base {a.base}: not a T5 of this config (missing "
                     f"{missing[:3]}, unexpected {unexpected[:3]})")
    model_params = sum(p.numel() for p in base.parameters())
    model = get_peft_model(base, LoraConfig(r=a.lora_rank, lora_alpha=2 * a.lora_rank,
                                            target_modules=["q", "v"], lora_dropout=0.0))
    trainable = [(nm, p) for nm, p in model.named_parameters() if p.requires_grad]
    adapter_params = sum(p.numel() for _, p in trainable)
    opt = torch.optim.AdamW([p for _, p in trainable], lr=a.lr, weight_decay=0.0)

    diloco = None
    if a.mode == "nebula":
        import nebula
        import nebula.torch
        h = a.sync_every or int(os.environ.get("NEBULA_INNER_STEPS", "16"))
        # DiLoCo registers what requires_grad: the adapters only, the frozen base never crosses
        diloco = nebula.torch.DiLoCo(nebula.Session.from_env(inner_steps=h), model, h)

    g = torch.Generator().manual_seed(a.seed * 1000 + me)

    def batch_of(rows):
        enc = tok([s for s, _ in rows], max_length=a.max_bytes, truncation=True,
                  padding=True, return_tensors="pt")
        lab = tok([t for _, t in rows], max_length=a.max_bytes, truncation=True,
                  padding=True, return_tensors="pt").input_ids
        lab[lab == tok.pad_token_id] = -100  # no loss on padding
        return enc, lab

    model.train()
    t0 = time.perf_counter()
    sent, rounds, first, last = 0, 0, None, None
    for step in range(a.steps):
        idx = torch.randint(0, len(train), (a.batch,), generator=g).tolist()
        enc, lab = batch_of([train[i] for i in idx])
        loss = model(**enc, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
        last = loss.item()
        if diloco is not None:
            info = diloco.step(samples=a.batch, loss=last)
            if info is not None:
                rounds += 1
                sent += info.bytes_sent
                print(f"round {info.round + 1} step {step + 1} loss {last:.4f} sent "
                      f"{info.bytes_sent} B hash {info.global_hash:016x}", flush=True)
        elif (step + 1) % 50 == 0:
            print(f"step {step + 1} loss {last:.4f}", flush=True)
    if diloco is not None:
        diloco.finish()
    wall = time.perf_counter() - t0

    import sacrebleu
    model.eval()
    hyps = []
    with torch.no_grad():
        for i in range(0, len(test), 16):
            rows = test[i:i + 16]
            enc = tok([s for s, _ in rows], max_length=a.max_bytes, truncation=True,
                      padding=True, return_tensors="pt")
            out = model.generate(**enc, max_new_tokens=a.max_bytes, do_sample=False)
            hyps += tok.batch_decode(out, skip_special_tokens=True)
    refs = [[t for _, t in test]]
    chrf = sacrebleu.corpus_chrf(hyps, refs).score
    bleu = sacrebleu.corpus_bleu(hyps, refs).score

    if a.save_adapters:
        from safetensors.torch import save_file
        tmp = a.save_adapters + ".tmp"
        save_file({nm: p.detach().contiguous() for nm, p in trainable}, tmp)
        os.replace(tmp, a.save_adapters)
    summary = {
        "mode": a.mode, "cluster": ident, "pair": a.pair, "steps": a.steps,
        "train_pairs": len(train), "model_params": model_params,
        "adapter_params": adapter_params, "synced": [nm for nm, _ in trainable],
        "first_train_loss": first, "last_train_loss": last, "wall_s": wall,
        "chrf": chrf, "bleu": bleu, "rounds": rounds, "wan_bytes_counted": sent,
        "global_xxh3": f"{diloco.global_hash():016x}" if diloco is not None else None,
    }
    if diloco is not None:
        diloco.close()
    out_dir = a.out_dir or os.path.dirname(os.environ.get("NEBULA_PROGRESS_FILE", "")) or "."
    path = os.path.join(out_dir, f"t5-summary-{ident}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(path + ".tmp", path)
    per_round = sent / rounds if rounds else 0
    print(f"adapters {adapter_params} of {model_params} parameters "
          f"({100 * adapter_params / model_params:.2f} %); {per_round:.0f} B per round; "
          f"train loss {first:.3f} -> {last:.3f}; chrF {chrf:.1f} BLEU {bleu:.2f}; "
          f"{wall:.1f} s -> {path}", flush=True)
    return 0 if math.isfinite(last) else 1


if __name__ == "__main__":
    sys.exit(main())
