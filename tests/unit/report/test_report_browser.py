#!/usr/bin/env python3
"""The run report of a real run, loaded in headless Chromium at 1000 px wide.

A two-cluster `nebula run` over loopback and a one-cluster `nebula train` (tiny model, the
trainer's committed corpus) each get their report (`nebula report --job`). Chromium loads a copy
of each with a measuring script appended (the product's file has no script) and --dump-dom gives
back what it measured: no element reaches past the 1000 px window, no axis label, title or legend
overlaps a tick label, every axis's ticks are a 1, 2 or 5 x 10^k step with labels that carry only
the digits the step needs, and the evaluation curve is drawn per language (from summary.json's
evals for `nebula run`, curve.tsv for `nebula train`).
A screenshot of the run's report is a 1000 px wide PNG that is not blank (decoded here with zlib
and struct). Exits 77 (skipped) when no chromium is installed.

  test_report_browser.py NEBULA DATA_DIR [--keep DIR]   (--keep: copy the screenshots to DIR)
"""
import html
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import zlib

JOB = """{"apiVersion": "nebula/v1", "kind": "TrainingJob",
 "metadata": {"name": "report-browser"},
 "spec": {"task": "pretrain",
  "clusters": [
   {"id": "dc-a", "data": {"tier": "quick", "languages": ["en", "de"]}},
   {"id": "dc-b", "data": {"tier": "quick", "languages": ["en", "ru"]}}],
  "model": {"layers": 1, "width": 32, "heads": 2, "context": 32},
  "training": {"seed": 5, "batchSize": 4, "maxSteps": %d,
               "eval": {"everyRounds": 1, "batches": 1},
               "optimizer": {"lr": 0.003, "warmupSteps": 2}},
  "sync": {"mode": "outer", "innerSteps": 4, "overlap": false},
  "compression": {"density": {"initial": 0.05, "min": 0.001, "max": 0.1}, "values": "int8"},
  "link": {"rateMbit": 50}}}
"""

# Appended to a copy of report.html: measures the laid-out page and writes the result into the
# DOM as JSON (what --dump-dom returns).
CHECK_JS = r"""
<script>
(function () {
  var W = document.documentElement.clientWidth, r = {innerWidth: window.innerWidth, clientWidth: W,
    scrollWidth: document.documentElement.scrollWidth, wide: [], overlaps: [], axes: {},
    evalSeries: 0, figures: 0};
  var all = document.body.getElementsByTagName('*');
  for (var i = 0; i < all.length; i++) {
    var b = all[i].getBoundingClientRect();
    if (b.width === 0 && b.height === 0) continue;
    if (b.right > W + 0.5 || b.left < -0.5)
      r.wide.push(all[i].tagName + (all[i].id ? '#' + all[i].id : '') + ' ' +
                  Math.round(b.left) + '..' + Math.round(b.right));
  }
  function hit(a, b) {
    return a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  }
  var svgs = document.getElementsByTagName('svg');
  for (var s = 0; s < svgs.length; s++) {
    var fig = svgs[s].closest('figure'), id = fig && fig.id ? fig.id : 'svg' + s;
    r.figures++;
    var ticks = Array.prototype.slice.call(svgs[s].querySelectorAll('text.tick'));
    var others = svgs[s].querySelectorAll('text.axis, text.title, text.legend');
    r.axes[id] = {x: [], y: []};
    ticks.forEach(function (t) {
      r.axes[id][t.classList.contains('x') ? 'x' : 'y'].push(t.textContent);
    });
    for (var a = 0; a < others.length; a++)
      for (var t = 0; t < ticks.length; t++)
        if (hit(others[a].getBoundingClientRect(), ticks[t].getBoundingClientRect()))
          r.overlaps.push(id + ': "' + others[a].textContent + '" over tick "' +
                          ticks[t].textContent + '"');
    for (var p = 0; p < ticks.length; p++)
      for (var q = p + 1; q < ticks.length; q++)
        if (hit(ticks[p].getBoundingClientRect(), ticks[q].getBoundingClientRect()))
          r.overlaps.push(id + ': tick "' + ticks[p].textContent + '" over tick "' +
                          ticks[q].textContent + '"');
  }
  var ev = document.getElementById('chart-eval');
  r.evalSeries = ev ? ev.querySelectorAll('polyline.series').length : 0;
  var pre = document.createElement('pre');
  pre.id = 'nb-check';
  pre.textContent = JSON.stringify(r);
  document.body.appendChild(pre);
})();
</script>
"""

PREFIX = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
LABEL = re.compile(r"^(-?\d+(?:\.(\d+))?)(?: ?([kMGT]?)(B|B/s)?)?$")

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def chromium_run(chrome, args, profile, timeout=90):
    """Runs chromium in its own process group, which is gone when this returns."""
    cmd = [chrome, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-extensions", "--disable-dev-shm-usage", "--user-data-dir=" + profile,
           "--window-size=1000,1400", "--virtual-time-budget=10000"] + args
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise SystemExit("chromium did not finish in %d s: %s" % (timeout, " ".join(cmd)))
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # helpers it may have left behind
        except ProcessLookupError:
            pass
    if p.returncode != 0:
        raise SystemExit("chromium failed (%d): %s" % (p.returncode, err.decode()[-2000:]))
    return out.decode("utf-8", "replace")


def axis_ok(fig, name, labels):
    """Labels of one axis: all of LABEL's form, evenly spaced by 1, 2 or 5 x 10^k, each with the
    decimals of the step and no more."""
    where = "%s %s axis %s" % (fig, name, labels)
    check(len(labels) >= 2, where + ": fewer than two ticks")
    vals, decs = [], []
    for s in labels:
        m = LABEL.match(s)
        check(m is not None, where + ": label %r is not a rounded number" % s)
        if not m:
            return
        vals.append(float(m.group(1)) * PREFIX[m.group(3) or ""])
        decs.append(len(m.group(2) or ""))
    if len(vals) < 2:
        return
    step = vals[1] - vals[0]
    check(step > 0, where + ": ticks do not increase")
    for a, b in zip(vals, vals[1:]):
        check(abs((b - a) - step) <= 1e-9 * abs(step), where + ": uneven ticks")
    k = 10 ** int(f"{step:e}".split("e")[1])
    check(any(abs(step - m * k) <= 1e-9 * step for m in (1, 2, 5)), where + ": step %g" % step)
    nonzero = [d for v, d in zip(vals, decs) if v != 0]
    check(len(set(nonzero)) <= 1, where + ": labels with different decimals")


def load_checked(chrome, report, tmp, tag):
    page = os.path.join(tmp, tag + "-check.html")
    with open(report, encoding="utf-8") as f:
        text = f.read()
    check("<script" not in text, tag + ": report.html holds a script")
    check(re.search(r"\b(src|href)=", text) is None, tag + ": report.html fetches something")
    with open(page, "w", encoding="utf-8") as f:
        f.write(text.replace("</body>", CHECK_JS + "</body>"))
    dom = chromium_run(chrome, ["--dump-dom", "file://" + page], os.path.join(tmp, "profile"))
    m = re.search(r'<pre id="nb-check">(.*?)</pre>', dom, re.S)
    if not m:
        raise SystemExit(tag + ": the measuring script left no result in the DOM")
    r = json.loads(html.unescape(m.group(1)))
    print(tag, json.dumps(r, indent=1)[:3000])
    check(r["innerWidth"] == 1000, tag + ": window %d px wide, not 1000" % r["innerWidth"])
    check(r["scrollWidth"] <= r["clientWidth"],
          tag + ": page scrolls sideways (%d px in %d)" % (r["scrollWidth"], r["clientWidth"]))
    check(not r["wide"], tag + ": elements past the %d px page: %s" % (r["clientWidth"],
                                                                       r["wide"][:10]))
    check(not r["overlaps"], tag + ": overlapping labels: %s" % r["overlaps"][:10])
    for fig, ax in r["axes"].items():
        for name in ("x", "y"):
            if fig.startswith("svg") and name == "x":
                continue  # the translation bar chart has no x ticks
            axis_ok(fig, name, ax[name])
    return r, text


def png_check(path, tag):
    """Width 1000, and not blank: a fair share of non-white pixels, the charts' blue among them."""
    with open(path, "rb") as f:
        data = f.read()
    check(data[:8] == b"\x89PNG\r\n\x1a\n", tag + ": not a PNG")
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, ctype = ihdr[0], ihdr[1], ihdr[2], ihdr[3]
    check(w == 1000, tag + ": screenshot is %d px wide" % w)
    check(depth == 8 and ctype in (2, 6), tag + ": PNG depth %d colour type %d" % (depth, ctype))
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    prev = bytearray(stride)
    nonwhite = blue = 0
    colours = set()
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                pr = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pr) & 255
        for x in range(0, stride, bpp * 4):  # every fourth pixel is plenty
            px = bytes(line[x:x + 3])
            colours.add(px)
            if px != b"\xff\xff\xff":
                nonwhite += 1
            if abs(px[0] - 0x1F) < 24 and abs(px[1] - 0x77) < 24 and abs(px[2] - 0xB4) < 24:
                blue += 1
        prev = line
    sampled = h * ((w + 3) // 4)
    print("%s: %dx%d, %.1f%% non-white, %d colours, %d blue samples" %
          (tag, w, h, 100.0 * nonwhite / sampled, len(colours), blue))
    check(nonwhite > 0.02 * sampled, tag + ": screenshot is (nearly) blank")
    check(len(colours) > 16, tag + ": screenshot has %d colours" % len(colours))
    check(blue > 20, tag + ": no chart line in the screenshot")


def run(cmd, log):
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    if rc != 0:
        with open(log) as f:
            sys.stderr.write(f.read()[-4000:])
        raise SystemExit("%s: exit %d" % (" ".join(cmd), rc))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    nebula, data = sys.argv[1], sys.argv[2]
    keep = sys.argv[sys.argv.index("--keep") + 1] if "--keep" in sys.argv else None
    chrome = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chrome:
        print("skipped: no chromium (scripts/setup.sh installs it)")
        return 77
    tmp = tempfile.mkdtemp(prefix="nb_report_browser.")
    try:
        job = os.path.join(tmp, "job.json")
        with open(job, "w") as f:
            f.write(JOB % 12)
        out = os.path.join(tmp, "run")
        run([nebula, "run", job, "--out", out, "--data-dir", data, "--no-mpi"],
            os.path.join(tmp, "run.log"))
        run([nebula, "report", out, "--job", job], os.path.join(tmp, "report.log"))
        r, text = load_checked(chrome, os.path.join(out, "report.html"), tmp, "run")
        # per cluster its mean and one per language (summary.json's evals carry each language)
        check(r["evalSeries"] == 6, "run: %d evaluation curves, expected 6 (per cluster: mean and "
              "its two languages)" % r["evalSeries"])
        check("chart-eval" in r["axes"], "run: no evaluation chart")
        check("<th>final loss (nats)</th>" in text, "run: loss without its unit")
        check("1 layer, width 32, 2 heads, context 32" in text, "run: no model shape")
        check(re.search(r'<td class="generated">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</td>', text),
              "run: no generation date")
        check("density-constant" in text or "chart-density" in text, "run: density missing")
        shot = os.path.join(tmp, "run.png")
        chromium_run(chrome, ["--hide-scrollbars", "--screenshot=" + shot, "file://" +
                              os.path.join(out, "report.html")], os.path.join(tmp, "profile"))
        png_check(shot, "run screenshot")

        # nebula train: one cluster, its curve.tsv gives a line per language
        with open(job, "w") as f:
            f.write(JOB % 8)
        tr = os.path.join(tmp, "train")
        run([nebula, "train", job, "--out", tr, "--data-dir", data],
            os.path.join(tmp, "train.log"))
        run([nebula, "report", tr, "--job", job], os.path.join(tmp, "report2.log"))
        r2, _ = load_checked(chrome, os.path.join(tr, "report", "report.html"), tmp, "train")
        check(r2["evalSeries"] == 3, "train: %d evaluation curves, expected 3 (mean, en, de)"
              % r2["evalSeries"])
        if keep:
            os.makedirs(keep, exist_ok=True)
            shutil.copy(shot, os.path.join(keep, "report-run-1000px.png"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
