#!/usr/bin/env python3
"""Writes the small committed sample of real pairs used by the metrics comparison test
(tests/unit/metrics/pairs_sample.tsv): the first N test pairs per language of a built tier (the
test files are already in a hash order), with the source of each line and the tier's provenance
in the header. Not part of `make data`; run by hand when the sample is refreshed.

usage: sample_pairs.py [--data data/quick] [--per-lang 60] [--out tests/unit/metrics/pairs_sample.tsv]
"""

import argparse
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data/quick")
    ap.add_argument("--per-lang", type=int, default=60)
    ap.add_argument("--out", default="tests/unit/metrics/pairs_sample.tsv")
    a = ap.parse_args()
    with open(os.path.join(a.data, "manifest.json"), encoding="utf-8") as f:
        man = json.load(f)
    rows, used = [], set()
    for lang in ("de", "fr", "ru", "es", "zh", "fa"):
        base = os.path.join(a.data, "pairs", "en-%s.test" % lang)
        with open(base + ".tsv", encoding="utf-8") as f, open(base + ".src", encoding="utf-8") as fs:
            n = 0
            for line, src in zip(f, fs):
                en, x = line.rstrip("\n").split("\t")
                if len(en) > 300:  # keep the sample readable
                    continue
                rows.append((lang, src.strip(), en, x))
                used.add(src.strip())
                n += 1
                if n >= a.per_lang:
                    break
    pk = {p["name"]: p["version"] for p in man["packages"]}
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("# Real en->X sentence pairs for the metrics comparison test: lang, source, en, x.\n")
        f.write("# Produced by scripts/data (make data, tier %s, pipeline %s, built %s) from\n"
                % (man["tier"], man["pipeline_version"], man["built_utc"]))
        f.write("# Debian bookworm; first %d test-split pairs per language. Sources and versions:\n"
                % a.per_lang)
        for s in sorted(used):
            job = man["jobs"].get(s, {})
            vers = ", ".join("%s %s" % (p, pk.get(p, "?")) for p in job.get("packages", []))
            if s.startswith("ddtp-"):
                idx = man["ddtp_indexes"].get({"zh": "zh_CN"}.get(s[5:], s[5:]), {})
                vers = "DDTP Translation-en + Translation-%s (sha256 %s...)" % (
                    s[5:], idx.get("sha256", "?")[:16])
            f.write("#   %s: %s; licence: %s\n" % (s, vers, job.get("licence", "?")))
        for r in rows:
            f.write("\t".join(r) + "\n")
    print("wrote %d pairs to %s" % (len(rows), a.out), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
