#!/usr/bin/env python3
"""Compares nebula's chrF and BLEU (train/metrics.c, through nb_metrics_tool) with the sacrebleu
package on real sentence pairs (pairs_sample.tsv): references are the sample's sentences, system
outputs a deterministic perturbation of them. Scores must agree within 0.01 and the 13a
tokenization must agree exactly, line by line.

usage: compare_sacrebleu.py NB_METRICS_TOOL pairs_sample.tsv   (exit 77 if sacrebleu is missing)
"""

import os
import random
import subprocess
import sys
import tempfile

TOL = 0.01


def perturb(ref, i):
    """A deterministic, language-agnostic corruption of ref chosen by the line number i."""
    rng = random.Random(1000 + i)
    if i % 53 == 0:
        return ""
    words = ref.split(" ")
    op = i % 6
    if op == 0:
        return ref
    if len(words) < 3:  # no spaces (zh) or very short: work on characters
        chars = list(ref)
        if len(chars) < 2:
            return ref + ref
        k = rng.randrange(len(chars) - 1)
        if op in (1, 4):
            del chars[k:k + 1 + (op == 4) * max(1, len(chars) // 3)]
        elif op == 2:
            chars[k], chars[k + 1] = chars[k + 1], chars[k]
        else:
            chars[k] = chars[rng.randrange(len(chars))]
            chars.insert(k, chars[-1])
        return "".join(chars)
    k = rng.randrange(len(words) - 1)
    if op == 1:
        del words[k]
    elif op == 2:
        words[k], words[k + 1] = words[k + 1], words[k]
    elif op == 3:
        w = list(words[k])
        j = rng.randrange(len(w))
        w[j] = rng.choice("aeiouxyz,.-")
        words[k] = "".join(w)
    elif op == 4:
        words = words[: max(1, int(len(words) * 0.6))]
    else:
        words.insert(k, words[k])
        words[0] = words[0][:1].lower() + words[0][1:]
    return " ".join(words)


def load(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            lang, src, en, x = line.rstrip("\n").split("\t")
            rows.append((lang, src, en, x))
    return rows


def ours(tool, pairs, mode):
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".tsv", delete=False) as f:
        for h, r in pairs:
            f.write(h + "\t" + r + "\n")
        name = f.name
    try:
        out = subprocess.run([tool, mode, name], check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(name)
    if mode == "tokenize":
        return [l.split("\t") for l in out.rstrip("\n").split("\n")] if out else []
    return {k: float(v) for k, v in (l.split() for l in out.strip().split("\n"))}


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    try:
        import sacrebleu
        from sacrebleu.metrics import BLEU, CHRF
        from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
    except ImportError:
        print("sacrebleu is not installed (scripts/setup.sh installs it): skipping")
        return 77
    tool, sample = sys.argv[1], sys.argv[2]
    rows = load(sample)
    if len(rows) < 200:
        print("sample has only %d pairs" % len(rows))
        return 1
    groups = {}
    for i, (lang, _, en, x) in enumerate(rows):
        groups.setdefault(lang, []).append((perturb(x, i), x))
        groups.setdefault("en", []).append((perturb(en, i + 7), en))
    groups["all"] = [p for g in sorted(groups) for p in groups[g]]

    chrf_m, bleu_m = CHRF(), BLEU()
    print("%-4s %5s  %10s %10s %8s  %10s %10s %8s  %s" % (
        "set", "pairs", "chrF ours", "sacrebleu", "diff", "BLEU ours", "sacrebleu", "diff",
        "BLEU none/floor diff"))
    worst = 0.0
    failed = False
    for g in sorted(groups, key=lambda k: (k == "all", k)):
        pairs = groups[g]
        hyps, refs = [h for h, _ in pairs], [r for _, r in pairs]
        o = ours(tool, pairs, "score")
        ref_chrf = chrf_m.corpus_score(hyps, [refs]).score
        ref_bleu = bleu_m.corpus_score(hyps, [refs]).score
        ref_none = BLEU(smooth_method="none").corpus_score(hyps, [refs]).score
        ref_floor = BLEU(smooth_method="floor").corpus_score(hyps, [refs]).score
        d = [abs(o["chrf"] - ref_chrf), abs(o["bleu"] - ref_bleu), abs(o["bleu_none"] - ref_none),
             abs(o["bleu_floor"] - ref_floor)]
        worst = max(worst, *d)
        print("%-4s %5d  %10.4f %10.4f %8.2g  %10.4f %10.4f %8.2g  %.2g/%.2g" % (
            g, len(pairs), o["chrf"], ref_chrf, d[0], o["bleu"], ref_bleu, d[1], d[2], d[3]))
        if max(d) > TOL:
            failed = True
    print("sacrebleu %s signatures: %s | %s" % (sacrebleu.__version__, chrf_m.get_signature(),
                                                 bleu_m.get_signature()))
    # per-sentence scores stress the zero-count and brevity branches far more than a corpus does
    tok = Tokenizer13a()
    sent_worst = 0.0
    for h, r in groups["all"][::7]:
        o = ours(tool, [(h, r)], "score")
        sent_worst = max(sent_worst, abs(o["chrf"] - CHRF().corpus_score([h], [[r]]).score),
                         abs(o["bleu"] - BLEU().corpus_score([h], [[r]]).score))
    print("single-segment corpora (every 7th pair): worst |diff| %.2g" % sent_worst)
    if sent_worst > TOL:
        failed = True
    toks = ours(tool, groups["all"], "tokenize")
    mism = 0
    for (h, r), (th, tr) in zip(groups["all"], toks):
        for raw, got in ((h, th), (r, tr)):
            want = tok(raw.rstrip())
            if got != want:
                mism += 1
                if mism <= 5:
                    print("13a mismatch:\n  input %r\n  ours  %r\n  sacre %r" % (raw, got, want))
    print("13a tokenization: %d segments, %d mismatches" % (2 * len(toks), mism))
    if len(toks) != len(groups["all"]) or mism:
        failed = True
    print("worst corpus |diff| %.3g (tolerance %g): %s" % (worst, TOL, "FAIL" if failed else "ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
