#!/usr/bin/env python3
"""Prints the counts of a built tier (from its manifest.json) as Markdown tables: pretraining text
and pairs per language, and the sources behind each language. Used to write docs/data.md.

usage: report.py data/quick [data/full ...]
"""

import json
import os
import sys


def report(root):
    with open(os.path.join(root, "manifest.json"), encoding="utf-8") as f:
        m = json.load(f)
    c = m["counts"]
    sec = m["seconds"]
    debs = sum(p["bytes"] for p in m["packages"])
    print("### %s tier (pipeline %s, built %s)\n" % (m["tier"], m["pipeline_version"],
                                                      m["built_utc"]))
    print("%d packages, %.1f MB of .deb files, plus the DDTP indexes. Processing %.0f s wall on %d "
          "workers (jobs %.0f s, merge %.0f s; %.0f s of job time).\n" % (
              len(m["packages"]), debs / 1e6, sec["process"], sec.get("workers", 2),
              sec.get("jobs", 0), sec.get("merge", 0), sec.get("job_total", 0)))
    print("| lang | DC | pretraining lines | MB | pairs train | dev | test |")
    print("|---|---|---:|---:|---:|---:|---:|")
    tot_b = 0
    for l in m["languages"]:
        mo = c["mono"][l]
        tot_b += mo["bytes"]
        dc = "+".join(k[-1].upper() for k, v in sorted(m["datacenters"].items()) if l in v)
        p = c["pairs"].get(l)
        if p:
            print("| %s | %s | %d | %.1f | %d | %d | %d |" % (l, dc, mo["lines"], mo["bytes"] / 1e6,
                                                       p["train"], p["dev"], p["test"]))
        else:
            print("| %s | %s | %d | %.1f | — | — | — |" % (l, dc, mo["lines"], mo["bytes"] / 1e6))
    print("| all | | | %.1f | %d | %d | %d |\n" % (
        tot_b / 1e6, sum(v["train"] for v in c["pairs"].values()),
        sum(v["dev"] for v in c["pairs"].values()), sum(v["test"] for v in c["pairs"].values())))
    print("Train pairs by source (largest first):\n")
    for l in m["languages"]:
        s = c["pair_sources"].get(l)
        if s:
            top = sorted(s.items(), key=lambda kv: -kv[1])[:6]
            print("- %s: %s" % (l, ", ".join("%s %d" % kv for kv in top)))
    print("\nHeld-out leaks removed (train pairs / mono lines that held a dev or test sentence): %s\n"
          % ", ".join("%s %d" % kv for kv in c["leaks_dropped"].items()))


if __name__ == "__main__":
    for r in sys.argv[1:]:
        report(r)
