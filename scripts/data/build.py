#!/usr/bin/env python3
"""Builds nebula's multilingual corpus from Debian's package repository: monolingual text per
language for pretraining and en->X sentence pairs with fixed train/dev/test splits.

Downloads with `apt-get download` and a private `apt-get update` (never installs anything, never
touches the machine's own apt state), extracts with `dpkg-deb -x`, cleans, deduplicates and
splits. Standard library only. Not a general crawler: the sources are listed in sources.py.

usage: build.py [--tier quick|full] [--out data] [--cache .cache/data] [--jobs 2] [--force]
"""

import argparse
import glob
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import clean  # noqa: E402
import extract  # noqa: E402
import sources  # noqa: E402

PIPELINE_VERSION = 1
# The modules whose code decides the output (report/verify/sample scripts do not).
PIPELINE_MODULES = ("build.py", "clean.py", "extract.py", "sources.py")
APT_LANGS = "en,de,fr,ru,es,zh_CN,fa"
DDTP_FIELDS = {"de": "de", "fr": "fr", "ru": "ru", "es": "es", "zh": "zh_CN", "fa": "fa"}


def log(msg):
    print("data: " + msg, file=sys.stderr, flush=True)


def pipeline_hash():
    """Version of the pipeline: PIPELINE_VERSION plus a hash of the pipeline modules, so any change
    to the code that builds the outputs invalidates them."""
    h = hashlib.sha256(str(PIPELINE_VERSION).encode())
    here = os.path.dirname(os.path.abspath(__file__))
    for f in [os.path.join(here, m) for m in PIPELINE_MODULES]:
        with open(f, "rb") as fh:
            h.update(os.path.basename(f).encode() + b"\0" + fh.read())
    return "%d-%s" % (PIPELINE_VERSION, h.hexdigest()[:16])


# --- apt -----------------------------------------------------------------------------------------


def apt_opts(cache):
    lists = os.path.join(cache, "apt", "lists")
    return ["-o", "Dir::State::Lists=" + lists, "-o", "Dir::Cache::pkgcache=",
            "-o", "Dir::Cache::srcpkgcache=", "-o", "Acquire::Languages=" + APT_LANGS] + \
        (["-o", "APT::Sandbox::User=root"] if os.geteuid() == 0 else [])


def apt_update(cache, refresh):
    lists = os.path.join(cache, "apt", "lists")
    if not refresh and glob.glob(os.path.join(lists, "*_i18n_Translation-en*")):
        return
    os.makedirs(os.path.join(lists, "partial"), exist_ok=True)
    log("apt-get update into a private lists folder")
    subprocess.run(["apt-get", "update", "-qq"] + apt_opts(cache), check=True,
                   stdout=subprocess.DEVNULL)


def deb_path(cache, pkg):
    hits = sorted(glob.glob(os.path.join(cache, "debs", pkg + "_*.deb")))
    return hits[-1] if hits else None


def apt_download(cache, pkgs):
    debs = os.path.join(cache, "debs")
    os.makedirs(debs, exist_ok=True)
    missing = [p for p in pkgs if deb_path(cache, p) is None]
    if not missing:
        return
    log("apt-get download %d packages: %s" % (len(missing), " ".join(missing)))
    subprocess.run(["apt-get", "download", "-q"] + apt_opts(cache) + missing, check=True,
                   cwd=debs, stdout=subprocess.DEVNULL)
    still = [p for p in missing if deb_path(cache, p) is None]
    if still:
        raise RuntimeError("apt-get download did not fetch: " + " ".join(still))


def deb_info(path):
    out = subprocess.run(["dpkg-deb", "-f", path, "Package", "Version"], check=True,
                         capture_output=True, text=True).stdout
    f = dict(l.split(": ", 1) for l in out.strip().split("\n") if ": " in l)
    return {"name": f.get("Package"), "version": f.get("Version"), "deb": os.path.basename(path),
            "bytes": os.path.getsize(path)}


def ddtp_index_files(cache):
    """{lang field: path} of the main-suite Translation indexes in the private lists folder."""
    lists = os.path.join(cache, "apt", "lists")
    out = {}
    for p in glob.glob(os.path.join(lists, "*_dists_bookworm_main_i18n_Translation-*")):
        field = os.path.basename(p).split("Translation-", 1)[1].split(".")[0].replace("%5f", "_")
        out[field] = p
    return out


def apt_cat(path):
    return subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", path], check=True,
                          capture_output=True).stdout.decode("utf-8", "replace")


# --- job output ----------------------------------------------------------------------------------


class Sink:
    """Per-job output: pairs as 'lang\\ten\\tx' lines and one mono file per language, each segment
    already normalized and filtered; exact duplicates inside the job dropped."""

    def __init__(self, outdir, name):
        self.dir = outdir
        self.name = name
        self.pairs = open(os.path.join(outdir, name + ".pairs"), "w", encoding="utf-8")
        self.mono = {}
        self.seen = set()
        self.stats = {"pairs": {}, "mono": {}, "rejected": {}}

    def pair(self, lang, en, x):
        for a, b in clean.align_paragraph(en, x):
            why = clean.pair_reject_reason(a, b, lang)
            if why:
                self.stats["rejected"][why] = self.stats["rejected"].get(why, 0) + 1
                continue
            d = clean.digest(lang + "\t" + a + "\t" + b)
            if d in self.seen:
                continue
            self.seen.add(d)
            self.pairs.write("%s\t%s\t%s\n" % (lang, a, b))
            self.stats["pairs"][lang] = self.stats["pairs"].get(lang, 0) + 1

    def text(self, lang, t):
        if not clean.mono_ok(t, lang):
            return
        d = clean.digest(lang + "\t" + t)
        if d in self.seen:
            return
        self.seen.add(d)
        f = self.mono.get(lang)
        if f is None:
            f = self.mono[lang] = open(os.path.join(self.dir, "%s.mono.%s" % (self.name, lang)), "w",
                                       encoding="utf-8")
        f.write(t + "\n")
        self.stats["mono"][lang] = self.stats["mono"].get(lang, 0) + 1

    def close(self):
        self.pairs.close()
        for f in self.mono.values():
            f.close()


def extract_debs(cache, scratch, pkgs):
    roots = []
    for p in pkgs:
        deb = deb_path(cache, p)
        if deb is None:
            raise RuntimeError("package %s not downloaded" % p)
        root = os.path.join(scratch, p)
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
        roots.append(root)
    return roots


def walk(root):
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            if not os.path.islink(p):
                yield p, os.path.relpath(p, root)


# English DDTP records, read once by the parent before the workers fork (shared copy-on-write).
_DDTP_EN = None


def load_ddtp_en(cache):
    global _DDTP_EN
    files = ddtp_index_files(cache)
    if "en" not in files:
        raise RuntimeError("Translation-en index missing; apt-get update failed?")
    _DDTP_EN = extract.ddtp_records(apt_cat(files["en"]), "en")


def job_ddtp(cache, lang, sink):
    en = _DDTP_EN
    if lang == "en":
        for short, paras in en.values():
            sink.text("en", short)
            for p in paras:
                sink.text("en", p)
        return
    field = DDTP_FIELDS[lang]
    files = ddtp_index_files(cache)
    if field not in files:
        return  # no DDTP translation for this language (fa)
    tr = extract.ddtp_records(apt_cat(files[field]), field)
    for md5, (short, paras) in tr.items():
        sink.text(lang, short)
        for p in paras:
            sink.text(lang, p)
        if md5 not in en:
            continue
        es, ep = en[md5]
        sink.pair(lang, es, short)
        if len(ep) == len(paras):
            for a, b in zip(ep, paras):
                sink.pair(lang, a, b)


def job_doc(spec, roots, sink):
    rx = re.compile(spec["regex"])
    docs = {}  # lang -> rel -> path
    for root in roots:
        for path, rel in walk(root):
            m = rx.search(rel)
            if not m:
                continue
            g = m.groupdict()
            lang = extract.lang_of_tag(g.get("lang") or spec.get("default_lang"))
            if lang is None:
                continue
            docs.setdefault(lang, {})[g["rel"]] = path
    if "en" not in docs:
        raise RuntimeError("%s: no English documents found" % sink.name)

    def segs(path):
        with open(path, "rb") as f:
            return extract.html_segments(f.read())

    en_cache = {}
    for rel in sorted(docs["en"]):
        en_cache[rel] = segs(docs["en"][rel])
        for _, t in en_cache[rel]:
            sink.text("en", t)
    for lang in extract.TARGETS:
        for rel in sorted(docs.get(lang, {})):
            sx = segs(docs[lang][rel])
            se = en_cache.get(rel, [])
            en_set = {t for _, t in se}
            for _, t in sx:
                if t not in en_set:  # untranslated paragraphs are English, not `lang`
                    sink.text(lang, t)
            if se:
                for a, b in extract.pair_documents(se, sx):
                    sink.pair(lang, a, b)


_MO_LANG_RE = re.compile(r"(?:^|[-/])([a-z]{2,3}(?:[_-][A-Za-z]{2,4})?)\.mo$")


def mo_lang(rel):
    parts = rel.split("/")
    if "LC_MESSAGES" in parts:
        i = parts.index("LC_MESSAGES")
        return extract.lang_of_tag(parts[i - 1]) if i > 0 else None
    m = _MO_LANG_RE.search(rel)
    return extract.lang_of_tag(m.group(1)) if m else None


def job_mo(roots, sink):
    for root in roots:
        for path, rel in sorted(walk(root)):
            if not rel.endswith(".mo"):
                continue
            lang = mo_lang(rel)
            if lang is None or lang == "en":
                continue
            with open(path, "rb") as f:
                try:
                    entries = extract.mo_entries(f.read())
                except ValueError:
                    continue
            for a, b in entries:
                a = clean.normalize(clean.strip_accelerators(a))
                b = clean.normalize(clean.strip_accelerators(b))
                if not a or not b or clean.has_placeholder(a) or clean.has_placeholder(b):
                    continue
                sink.text("en", a)
                if a != b:
                    sink.text(lang, b)
                sink.pair(lang, a, b)


_MAN_RE = re.compile(r"usr/share/man/(?:(?P<lang>[a-zA-Z_]+)/)?man[0-9n][^/]*/[^/]+$")


def job_man(spec, roots, sink):
    for root in roots:
        for path, rel in sorted(walk(root)):
            m = _MAN_RE.search(rel)
            if not m:
                continue
            lang = spec["lang"] or extract.lang_of_tag(m.group("lang"))
            if m.group("lang") and spec["lang"] == "en":
                continue
            if lang is None:
                continue
            try:
                raw = extract.read_maybe_gz(path)
            except (OSError, EOFError):
                continue
            text = extract.decode_lang(raw, lang)
            if text is None or text.lstrip().startswith(".so "):
                continue
            for p in extract.roff_paragraphs(text):
                sink.text(lang, p)


def job_fortune(spec, roots, sink):
    for root in roots:
        for path, rel in sorted(walk(root)):
            if "/fortunes/" not in "/" + rel or rel.endswith(".dat") or "/off/" in rel:
                continue
            with open(path, "rb") as f:
                text = extract.decode_lang(f.read(), spec["lang"])
            if text is None:
                continue
            for t in extract.fortunes(text):
                sink.text(spec["lang"], t)


def run_job(args):
    kind, name, spec, cache, scratch, outdir = args
    t0 = time.time()
    sink = Sink(outdir, name)
    roots = []
    try:
        if kind == "ddtp":
            job_ddtp(cache, spec["lang"], sink)
        else:
            roots = extract_debs(cache, scratch, spec["packages"])
            {"doc": lambda: job_doc(spec, roots, sink), "mo": lambda: job_mo(roots, sink),
             "man": lambda: job_man(spec, roots, sink),
             "fortune": lambda: job_fortune(spec, roots, sink)}[kind]()
    finally:
        sink.close()
        for r in roots:
            shutil.rmtree(r, ignore_errors=True)
    sink.stats["seconds"] = round(time.time() - t0, 2)
    return name, kind, sink.stats


# --- merge: dedup, split, held-out filtering -----------------------------------------------------


_MERGE = None  # (jobs, jobdir, out, held_en, held_x, pairs), set before the merge workers fork


def merge_pairs(lang):
    """Writes out/pairs/en-<lang>.{train,dev,test}.{tsv,src}: train pairs holding a held-out
    sentence on either side (whole or inside a paragraph) dropped; every split in a fixed
    hash order. Returns (counts per split, train lines per source, dropped)."""
    _, _, out, held_en, held_x, pairs = _MERGE
    hx = held_x[lang]
    train = pairs[lang]["train"]
    # The English key itself never matches a held-out key (equal keys share a split); sentences
    # inside a train paragraph and the target side can.
    kept = [p for p in train if not any(k in hx for k in clean.leak_keys(p[1]))
            and not any(k in held_en for k in clean.leak_keys(p[0]))]
    counts, srcs = {}, {}
    for sp in ("train", "dev", "test"):
        rows = kept if sp == "train" else pairs[lang][sp]
        rows = sorted(rows, key=lambda p: clean.digest(p[0] + "\t" + p[1]))
        base = os.path.join(out, "pairs", "en-%s.%s" % (lang, sp))
        with open(base + ".tsv", "w", encoding="utf-8") as f, \
                open(base + ".src", "w", encoding="utf-8") as fs:
            for en, x, src in rows:
                f.write(en + "\t" + x + "\n")
                fs.write(src + "\n")  # provenance: the job (source) of each line
                if sp == "train":
                    srcs[src] = srcs.get(src, 0) + 1
        counts[sp] = len(rows)
    return counts, srcs, len(train) - len(kept)


def merge_mono(lang):
    """Writes out/mono/<lang>.txt: every job's segments in job order, exact duplicates and
    segments holding a held-out sentence dropped. Returns (counts, per-source lines, dropped)."""
    jobs, jobdir, out, held_en, held_x, _ = _MERGE
    held = held_en if lang == "en" else (held_en | held_x[lang])
    seen = set()
    n = nbytes = dropped = 0
    srcs = {}
    with open(os.path.join(out, "mono", lang + ".txt"), "w", encoding="utf-8") as fo:
        for _, name, _ in jobs:
            p = os.path.join(jobdir, "%s.mono.%s" % (name, lang))
            if not os.path.exists(p):
                continue
            with open(p, encoding="utf-8") as f:
                for line in f:
                    t = line.rstrip("\n")
                    d = clean.digest(t)
                    if d in seen:
                        continue
                    seen.add(d)
                    if any(k in held for k in clean.leak_keys(t)):
                        dropped += 1
                        continue
                    fo.write(t + "\n")
                    n += 1
                    nbytes += len(t.encode("utf-8")) + 1
                    srcs[name] = srcs.get(name, 0) + 1
    return {"lines": n, "bytes": nbytes}, srcs, dropped


def merge(jobs, jobdir, out, ctx, workers):
    """Reads every job's output in job order and writes out/mono, out/pairs. Returns counts."""
    pairs = {l: {"train": [], "dev": [], "test": []} for l in extract.TARGETS}
    seen = set()
    for _, name, _ in jobs:
        with open(os.path.join(jobdir, name + ".pairs"), encoding="utf-8") as f:
            for line in f:
                lang, en, x = line.rstrip("\n").split("\t")
                d = clean.digest(lang + "\t" + en + "\t" + x)
                if d in seen:
                    continue
                seen.add(d)
                pairs[lang][clean.split_of(en)].append((en, x, name))
    held_en, held_x = set(), {l: set() for l in extract.TARGETS}
    for lang in extract.TARGETS:
        for sp in ("dev", "test"):
            for en, x, _ in pairs[lang][sp]:
                held_en.add(clean.split_key(en))
                held_x[lang].add(clean.split_key(x))
    held_en.discard("")
    counts = {"pairs": {}, "mono": {}, "pair_sources": {}, "mono_sources": {}, "leaks_dropped": {}}
    os.makedirs(os.path.join(out, "pairs"), exist_ok=True)
    os.makedirs(os.path.join(out, "mono"), exist_ok=True)
    global _MERGE
    _MERGE = (jobs, jobdir, out, held_en, held_x, pairs)
    if workers > 1:
        with ctx.Pool(workers) as pool:
            res_pairs = pool.map(merge_pairs, extract.TARGETS, chunksize=1)
            res_mono = pool.map(merge_mono, extract.LANGS, chunksize=1)
    else:
        res_pairs = list(map(merge_pairs, extract.TARGETS))
        res_mono = list(map(merge_mono, extract.LANGS))
    _MERGE = None
    for lang, (c, srcs, dropped) in zip(extract.TARGETS, res_pairs):
        counts["pairs"][lang] = c
        counts["pair_sources"][lang] = srcs
        counts["leaks_dropped"]["pairs-" + lang] = dropped
    for lang, (mono, srcs, dropped) in zip(extract.LANGS, res_mono):
        counts["mono"][lang] = mono
        counts["mono_sources"][lang] = srcs
        counts["leaks_dropped"]["mono-" + lang] = dropped
    return counts


# --- main ----------------------------------------------------------------------------------------


def outputs_present(out):
    need = [os.path.join(out, "manifest.json")]
    need += [os.path.join(out, "mono", l + ".txt") for l in extract.LANGS]
    need += [os.path.join(out, "pairs", "en-%s.%s.tsv" % (l, s)) for l in extract.TARGETS
             for s in ("train", "dev", "test")]
    return all(os.path.exists(p) for p in need)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tier", default="quick", choices=["quick", "full"])
    ap.add_argument("--out", default="data", help="output root; the tier goes in OUT/<tier>")
    ap.add_argument("--cache", default=".cache/data", help="apt lists, .deb files and scratch")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--force", action="store_true", help="rebuild even if outputs are current")
    ap.add_argument("--refresh", action="store_true", help="re-run apt-get update")
    a = ap.parse_args(argv)

    out = os.path.join(a.out, a.tier)
    version = pipeline_hash()
    if not a.force and outputs_present(out):
        with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
            if json.load(f).get("pipeline_version") == version:
                log("%s is up to date (pipeline %s)" % (out, version))
                return 0

    t_start = time.time()
    cache = os.path.abspath(a.cache)
    jobs = sources.jobs_for(a.tier)
    pkgs = sources.packages_for(a.tier)
    apt_update(cache, a.refresh)
    apt_download(cache, pkgs)
    t_dl = time.time()

    work = os.path.join(cache, "work-" + a.tier)
    shutil.rmtree(work, ignore_errors=True)
    jobdir, scratch = os.path.join(work, "jobs"), os.path.join(work, "scratch")
    os.makedirs(jobdir)
    os.makedirs(scratch)
    args = [(k, n, s, cache, scratch, jobdir) for k, n, s in jobs]
    stats = {}
    if any(k == "ddtp" for k, _, _ in jobs):
        load_ddtp_en(cache)
    log("%s tier: %d jobs on %d workers" % (a.tier, len(jobs), a.jobs))
    ctx = multiprocessing.get_context("fork")
    if a.jobs <= 1:
        results = map(run_job, args)
    else:
        pool = ctx.Pool(a.jobs)
        results = pool.imap_unordered(run_job, args)
    for name, kind, st in results:
        stats[name] = st
        log("  %-28s %6.1fs pairs %s" % (name, st["seconds"], sum(st["pairs"].values())))
    if a.jobs > 1:
        pool.close()
        pool.join()

    t_jobs = time.time()
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    counts = merge(jobs, jobdir, tmp, ctx, a.jobs)
    t_end = time.time()
    log("jobs %.1fs (%.1fs of job time on %d workers), merge %.1fs" % (
        t_jobs - t_dl, sum(s["seconds"] for s in stats.values()), a.jobs, t_end - t_jobs))

    ddtp = ddtp_index_files(cache)
    manifest = {
        "tier": a.tier,
        "pipeline_version": version,
        "built_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": {"download": round(t_dl - t_start, 1), "process": round(t_end - t_dl, 1),
                    "jobs": round(t_jobs - t_dl, 1), "merge": round(t_end - t_jobs, 1),
                    "job_total": round(sum(s["seconds"] for s in stats.values()), 1),
                    "workers": a.jobs},
        "languages": list(extract.LANGS),
        "datacenters": sources.DATACENTERS,
        "split": {"key": "sha256(split_key(en)) % 1000", "dev": [0, 9], "test": [10, 19],
                  "heldout_min_words": clean.HELDOUT_MIN_WORDS},
        "counts": counts,
        "packages": [deb_info(deb_path(cache, p)) for p in sources.packages_for(a.tier)],
        "ddtp_indexes": {f: {"file": os.path.basename(p),
                             "sha256": hashlib.sha256(open(p, "rb").read()).hexdigest()}
                         for f, p in sorted(ddtp.items())},
        "jobs": {n: {"kind": k, "packages": s.get("packages", []), "licence":
                     s.get("licence", sources.LICENCES.get(k, "")), "stats": stats[n]}
                 for k, n, s in jobs},
    }
    with open(os.path.join(tmp, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False, sort_keys=False)
        f.write("\n")
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    shutil.rmtree(work, ignore_errors=True)
    log("wrote %s in %.1fs (download %.1fs)" % (out, t_end - t_start, t_dl - t_start))
    for lang in extract.LANGS:
        m = counts["mono"][lang]
        p = counts["pairs"].get(lang)
        log("  %s mono %8d lines %7.1f MB%s" % (lang, m["lines"], m["bytes"] / 1e6,
            "" if not p else "  pairs train %d dev %d test %d" % (p["train"], p["dev"], p["test"])))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as e:
        log("error: %s exited with status %d; see its messages above (apt needs Debian's "
            "repository reachable)" % (" ".join(e.cmd[:2]), e.returncode))
        sys.exit(1)
    except (RuntimeError, OSError) as e:
        log("error: %s" % e)
        sys.exit(1)
