"""Unit tests of the corpus pipeline's readers and its merge step (scripts/data/extract.py,
build.py): gettext .mo parsing, HTML block extraction and document pairing, DDTP records, roff
and fortune readers, per-job dedup, and the held-out guarantee: no dev/test sentence (either side)
in train pairs or in the pretraining text. Built from hand-made inputs in a temporary folder."""

import multiprocessing
import os
import struct
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "scripts", "data"))

import build  # noqa: E402
import clean  # noqa: E402
import extract  # noqa: E402
import verify  # noqa: E402


def make_mo(entries):
    """A little-endian .mo from [(msgid bytes, msgstr bytes)], sorted as msgfmt does."""
    entries = sorted(entries)
    n = len(entries)
    o_orig = 28
    o_tr = o_orig + 8 * n
    data_off = o_tr + 8 * n
    ids = strs = b""
    tab_o, tab_t = [], []
    for mid, _ in entries:
        tab_o.append((len(mid), data_off + len(ids)))
        ids += mid + b"\0"
    for _, ms in entries:
        tab_t.append((len(ms), data_off + len(ids) + len(strs)))
        strs += ms + b"\0"
    out = struct.pack("<7I", 0x950412DE, 0, n, o_orig, o_tr, 0, 0)
    out += b"".join(struct.pack("<2I", *t) for t in tab_o)
    out += b"".join(struct.pack("<2I", *t) for t in tab_t)
    return out + ids + strs


class Readers(unittest.TestCase):
    def test_mo(self):
        mo = make_mo([
            (b"", b"Content-Type: text/plain; charset=UTF-8\n"),
            (b"Save file", "Datei speichern".encode()),
            (b"menu\x04Open", b"\xc3\x96ffnen"),
            (b"One file\x00%d files", b"Eine Datei\x00%d Dateien"),
            (b"Your names", b"Max Mustermann"),
            (b"NAME OF TRANSLATORS\x04Your names", b"Max"),
            (b"Untranslated", b""),
        ])
        got = dict(extract.mo_entries(mo))
        self.assertEqual(got, {"Save file": "Datei speichern", "Open": "Öffnen",
                               "One file": "Eine Datei"})
        with self.assertRaises(ValueError):
            extract.mo_entries(b"not a mo file at all, really not")
        with self.assertRaises(ValueError):
            extract.mo_entries(struct.pack("<7I", 0x950412DE, 0, 1000, 28, 9000, 0, 0))

    def test_html_segments_hidden_and_skip(self):
        html = ("<html><head><title>T</title></head><body><h1>Title here</h1>"
                "<p id='par_1'>Press <span class='switchinline'><span hidden='true' class='MAC'>"
                "Command</span><span hidden='true' id='default_1'>Ctrl</span></span>+C.</p>"
                "<pre>code here</pre><div class='para'>Second <em>para</em>.</div>"
                "<ul class='docnav'><li>Prev</li></ul></body></html>").encode()
        segs = extract.html_segments(html)
        self.assertEqual(segs, [(None, "Title here"), ("par_1", "Press Ctrl+C."),
                                (None, "Second para.")])
        self.assertEqual(extract.html_segments(b"\xff<p>x</p>"), [])

    def test_pair_documents(self):
        a = [("p1", "One"), ("p2", "Two"), (None, "Three")]
        b = [("p1", "Eins"), ("p2", "Zwei"), (None, "Drei")]
        self.assertEqual(extract.pair_documents(a, b), [("One", "Eins"), ("Two", "Zwei"),
                                                        ("Three", "Drei")])
        # different counts: only ids unique on both sides pair up
        b2 = [("p2", "Zwei"), ("p9", "Neun")]
        self.assertEqual(extract.pair_documents(a, b2), [("Two", "Zwei")])

    def test_ddtp(self):
        text = ("Package: foo\nDescription-md5: abc\nDescription-de: Kurz\n"
                " Erster Absatz\n Zeile zwei.\n .\n Zweiter.\n\n"
                "Package: bar\nDescription-md5: def\nDescription-de: Nur kurz\n\n")
        r = extract.ddtp_records(text, "de")
        self.assertEqual(r["abc"], ("Kurz", ["Erster Absatz Zeile zwei.", "Zweiter."]))
        self.assertEqual(r["def"], ("Nur kurz", []))

    def test_roff(self):
        page = ('.\\" comment\n.TH LS 1\n.SH NAME\nls \\- list directory contents\n'
                ".SH DESCRIPTION\nList information about the FILEs\n.B ls\n"
                "sorts entries\\(emalphabetically.\n.PP\nSecond \\fBbold\\fR paragraph.\n"
                ".nf\ncode block\n.fi\n")
        self.assertEqual(extract.roff_paragraphs(page), [
            "NAME", "ls - list directory contents", "DESCRIPTION",
            "List information about the FILEs ls sorts entries\u2014alphabetically.",
            "Second bold paragraph."])

    def test_fortunes(self):
        self.assertEqual(extract.fortunes("One\nline\n%\nTwo\n%\n%\n"), ["One line", "Two"])

    def test_lang_tags(self):
        self.assertEqual(extract.lang_of_tag("zh_CN"), "zh")
        self.assertEqual(extract.lang_of_tag("zh-TW"), None)
        self.assertEqual(extract.lang_of_tag("fa-IR"), "fa")
        self.assertEqual(extract.lang_of_tag("C"), "en")
        self.assertEqual(build.mo_lang("usr/share/locale/de/LC_MESSAGES/x.mo"), "de")
        self.assertEqual(build.mo_lang("usr/share/wordpress/wp-content/languages/admin-fa_IR.mo"),
                         "fa")
        self.assertEqual(build.mo_lang("usr/lib/libreoffice/program/resource/zh-CN/LC_MESSAGES/a.mo"),
                         "zh")


def find(split, n, template):
    """n English sentences that the hash puts in `split`."""
    out, i = [], 0
    while len(out) < n:
        s = template % i
        if clean.split_of(s) == split:
            out.append(s)
        i += 1
    return out


class Merge(unittest.TestCase):
    def test_sink_dedups_and_filters(self):
        with tempfile.TemporaryDirectory() as d:
            s = build.Sink(d, "job")
            s.pair("de", "Save the file now.", "Speichern Sie die Datei jetzt.")
            s.pair("de", "Save the file now.", "Speichern Sie die Datei jetzt.")
            s.pair("de", "Open %s", "Öffne %s")
            s.text("de", "Ein Satz hier.")
            s.text("de", "Ein Satz hier.")
            s.close()
            with open(os.path.join(d, "job.pairs"), encoding="utf-8") as f:
                self.assertEqual(f.read().count("\n"), 1)
            with open(os.path.join(d, "job.mono.de"), encoding="utf-8") as f:
                self.assertEqual(f.read(), "Ein Satz hier.\n")
            self.assertEqual(s.stats["rejected"], {"placeholder": 1})

    def test_no_heldout_sentence_in_train_or_mono(self):
        test_en = find("test", 2, "The held out sentence number %d is here.")
        dev_en = find("dev", 1, "The development sentence number %d is here.")
        train_en = find("train", 3, "The training sentence number %d is here.")
        test_de = ["Der zurückgehaltene Satz eins ist hier.", "Der zurückgehaltene Satz zwei."]
        with tempfile.TemporaryDirectory() as d:
            jobdir, out = os.path.join(d, "jobs"), os.path.join(d, "out")
            os.makedirs(jobdir)
            with open(os.path.join(jobdir, "a.pairs"), "w", encoding="utf-8") as f:
                f.write("de\t%s\t%s\n" % (test_en[0], test_de[0]))
                f.write("de\t%s\t%s\n" % (test_en[1], test_de[1]))
                f.write("de\t%s\tDer Entwicklungssatz ist hier.\n" % dev_en[0])
                f.write("de\t%s\tDer Trainingssatz ist hier.\n" % train_en[0])
                # train English, but its German is a test sentence: must be dropped
                f.write("de\t%s\t%s\n" % (train_en[1], test_de[0]))
                # a train paragraph holding a test sentence inside: must be dropped
                f.write("de\tIntro text. %s\tEinleitung. Etwas anderes hier.\n" % test_en[1])
                f.write("de\t%s\tNoch ein Trainingssatz.\n" % train_en[2])
            with open(os.path.join(jobdir, "a.mono.en"), "w", encoding="utf-8") as f:
                f.write(test_en[0] + "\n")  # exact
                f.write("Some context first. %s And more.\n" % test_en[1])  # inside
                f.write(test_en[0].upper() + "\n")  # same key
                f.write("A clean English line.\n")
            with open(os.path.join(jobdir, "a.mono.de"), "w", encoding="utf-8") as f:
                f.write(test_de[1] + "\n")
                f.write("Eine saubere deutsche Zeile.\n")
            jobs = [("mo", "a", {})]
            counts = build.merge(jobs, jobdir, out, multiprocessing.get_context("fork"), 1)

            def read(p):
                with open(os.path.join(out, p), encoding="utf-8") as f:
                    return f.read().splitlines()

            train = read("pairs/en-de.train.tsv")
            test = read("pairs/en-de.test.tsv")
            dev = read("pairs/en-de.dev.tsv")
            self.assertEqual(len(test), 2)
            self.assertEqual(len(dev), 1)
            self.assertEqual(sorted(l.split("\t")[0] for l in train),
                             sorted([train_en[0], train_en[2]]))
            held = [l.split("\t") for l in test + dev]
            for en, de in held:
                for line in train:
                    self.assertNotIn(clean.split_key(en), clean.split_key(line))
                    self.assertNotIn(clean.split_key(de), clean.split_key(line))
            self.assertEqual(read("mono/en.txt"), ["A clean English line."])
            self.assertEqual(read("mono/de.txt"), ["Eine saubere deutsche Zeile."])
            self.assertEqual(read("pairs/en-de.train.src"), ["a", "a"])
            self.assertEqual(counts["pairs"]["de"], {"train": 2, "dev": 1, "test": 2})
            self.assertEqual(counts["leaks_dropped"]["pairs-de"], 2)
            self.assertEqual(counts["leaks_dropped"]["mono-en"], 3)

            # the independent checker accepts this output, and catches a planted leak
            for lang in extract.TARGETS:
                for sp in ("train", "dev", "test"):
                    p = os.path.join(out, "pairs", "en-%s.%s.tsv" % (lang, sp))
                    if not os.path.exists(p):
                        open(p, "w").close()
            with open(os.path.join(out, "manifest.json"), "w") as f:
                f.write('{"tier": "unit"}')
            self.assertTrue(verify.verify(out))
            with open(os.path.join(out, "mono", "de.txt"), "a", encoding="utf-8") as f:
                f.write("Vorher. %s Nachher.\n" % test_de[1])
            self.assertFalse(verify.verify(out))


if __name__ == "__main__":
    unittest.main()
