#!/usr/bin/env python3
"""Checks a built tier independently of how it was built: every file present and valid UTF-8 in
NFC with one segment per line and no tabs inside segments, no duplicate lines, every dev/test
pair on the right side of the hash split, and no dev/test sentence (either side, compared by
split key, whole or as a sentence inside a longer segment) in the train pairs or in the
pretraining text. Prints a summary; exit 1 on any violation.

usage: verify.py data/quick
"""

import json
import os
import sys
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import clean  # noqa: E402
import extract  # noqa: E402


def lines(path):
    with open(path, "rb") as f:
        for i, raw in enumerate(f):
            t = raw.decode("utf-8")  # raises on invalid UTF-8
            yield i, t.rstrip("\n")


def verify(root):
    errors = []
    man = json.load(open(os.path.join(root, "manifest.json"), encoding="utf-8"))
    held_en, held_x = set(), {}
    for lang in extract.TARGETS:
        held_x[lang] = set()
        for sp in ("dev", "test"):
            for i, l in lines(os.path.join(root, "pairs", "en-%s.%s.tsv" % (lang, sp))):
                en, x = l.split("\t")
                if clean.split_of(en) != sp:
                    errors.append("%s %s line %d is not in its hash split" % (lang, sp, i + 1))
                held_en.add(clean.split_key(en))
                held_x[lang].add(clean.split_key(x))
    n_train = 0
    for lang in extract.TARGETS:
        seen = set()
        for i, l in lines(os.path.join(root, "pairs", "en-%s.train.tsv" % lang)):
            parts = l.split("\t")
            if len(parts) != 2 or not parts[0] or not parts[1]:
                errors.append("%s train line %d: not 'en<TAB>x'" % (lang, i + 1))
                continue
            en, x = parts
            if l in seen:
                errors.append("%s train line %d duplicated" % (lang, i + 1))
            seen.add(l)
            n_train += 1
            if any(k in held_en for k in clean.leak_keys(en)) or \
                    any(k in held_x[lang] for k in clean.leak_keys(x)):
                errors.append("%s train line %d holds a held-out sentence" % (lang, i + 1))
    n_mono = 0
    for lang in extract.LANGS:
        held = held_en if lang == "en" else held_en | held_x[lang]
        seen = set()
        for i, t in lines(os.path.join(root, "mono", lang + ".txt")):
            n_mono += 1
            if not t or "\t" in t or not unicodedata.is_normalized("NFC", t):
                errors.append("mono %s line %d: empty, tab or not NFC" % (lang, i + 1))
            d = clean.digest(t)
            if d in seen:
                errors.append("mono %s line %d duplicated" % (lang, i + 1))
            seen.add(d)
            if any(k in held for k in clean.leak_keys(t)):
                errors.append("mono %s line %d holds a held-out sentence" % (lang, i + 1))
    print("%s (%s tier): %d train pairs, %d mono lines, %d held-out English keys: %s" % (
        root, man.get("tier"), n_train, n_mono, len(held_en),
        "ok" if not errors else "%d problems" % len(errors)))
    for e in errors[:20]:
        print("  " + e)
    return not errors


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(0 if verify(sys.argv[1]) else 1)
