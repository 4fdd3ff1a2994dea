"""Unit tests of the corpus pipeline's cleaning functions (scripts/data/clean.py): normalisation,
placeholder and markup filters, accelerators, ratio and script checks, sentence alignment and the
deterministic split. Hand-made strings only; no network, no packages."""

import os
import sys
import unicodedata
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "scripts", "data"))

import clean  # noqa: E402


class Normalize(unittest.TestCase):
    def test_nfc(self):
        decomposed = "Cafe\u0301"
        self.assertEqual(clean.normalize(decomposed), "Caf\u00e9")
        self.assertTrue(unicodedata.is_normalized("NFC", clean.normalize("\u0415\u0308")))

    def test_whitespace(self):
        self.assertEqual(clean.normalize("  a\t\tb\n c\u00a0\u00a0d\u3000e  "), "a b c d e")
        self.assertEqual(clean.normalize("\r\n"), "")
        self.assertEqual(clean.normalize(""), "")

    def test_controls_removed_zwnj_kept(self):
        self.assertEqual(clean.normalize("a\x00b\x07c\u00add"), "abcd")
        fa = "\u0645\u06cc\u200c\u0634\u0648\u062f"  # mi-shavad with ZWNJ
        self.assertEqual(clean.normalize(fa), fa)

    def test_utf8(self):
        self.assertEqual(clean.decode_utf8("é".encode()), "é")
        self.assertIsNone(clean.decode_utf8(b"\xff\xfeabc"))
        self.assertIsNone(clean.decode_utf8(b"\xed\xa0\x80"))  # surrogate


class Placeholders(unittest.TestCase):
    def test_detected(self):
        for s in ["Open %s", "%1$d files", "%(name)s was", "Copy %1 to %2", "%PRODUCTNAME Writer",
                  "Hello {0}", "{name} left", "$(ARG1) is", "set ${HOME}", "see $PATH now",
                  "<b>bold</b>", "a &amp; b", "line\\n", "visit https://x.org", "www.debian.org",
                  "Deleted %d items", "%-5.2f%%"]:
            self.assertTrue(clean.has_placeholder(s), s)

    def test_plain_text_passes(self):
        for s in ["50% of users", "Save the file.", "Tom & Jerry", "a < b", "Größe ändern",
                  "Сохранить файл", "打开文件", "100 % sûr"]:
            self.assertFalse(clean.has_placeholder(s), s)

    def test_accelerators(self):
        self.assertEqual(clean.strip_accelerators("_File"), "File")
        self.assertEqual(clean.strip_accelerators("~Open"), "Open")
        self.assertEqual(clean.strip_accelerators("&Save As"), "Save As")
        self.assertEqual(clean.strip_accelerators("文件(_F)"), "文件")
        self.assertEqual(clean.strip_accelerators("Datei (&D)"), "Datei")
        self.assertEqual(clean.strip_accelerators("snake_case"), "snake_case")
        self.assertEqual(clean.strip_accelerators("Tom & Jerry"), "Tom & Jerry")


class Filters(unittest.TestCase):
    def test_ratio(self):
        self.assertTrue(clean.ratio_ok("abcd", "abcd"))
        self.assertTrue(clean.ratio_ok("a" * 10, "b" * 3))  # exactly 0.3
        self.assertFalse(clean.ratio_ok("a" * 10, "b" * 2))
        self.assertTrue(clean.ratio_ok("a" * 10, "b" * 40))  # exactly 4
        self.assertFalse(clean.ratio_ok("a" * 10, "b" * 41))
        # zh: 3 bytes per character, so 4 characters for 10 Latin ones is fine
        self.assertTrue(clean.ratio_ok("Open file.", "打开文件"))

    def test_script(self):
        self.assertTrue(clean.script_ok("Сохранить файл как PDF", "ru"))
        self.assertFalse(clean.script_ok("Save file as PDF", "ru"))
        self.assertTrue(clean.script_ok("打开 PDF 文件", "zh"))
        self.assertFalse(clean.script_ok("Open the PDF file", "zh"))
        self.assertTrue(clean.script_ok("\u0641\u0627\u06cc\u0644 \u0631\u0627 \u0628\u0627\u0632 \u06a9\u0646", "fa"))
        self.assertFalse(clean.script_ok("Сохранить", "fa"))
        self.assertTrue(clean.script_ok("Größe ändern", "de"))
        self.assertFalse(clean.script_ok("Сохранить файл", "de"))
        self.assertFalse(clean.script_ok("12345 !!", "en"))

    def test_pair_reasons(self):
        r = clean.pair_reject_reason
        self.assertIsNone(r("Save the file.", "Die Datei speichern.", "de"))
        self.assertEqual(r("Save", "Save", "de"), "untranslated")
        self.assertEqual(r("", "x", "de"), "empty")
        self.assertEqual(r("a" * 2000, "b" * 2000, "de"), "long")
        self.assertEqual(r("1234", "\u06f1\u06f2\u06f3\u06f4", "fa"), "no-english")
        self.assertEqual(r("Open %s", "Öffne %s", "de"), "placeholder")
        self.assertEqual(r("Save the file.", "Save the file now please.", "ru"), "script")
        self.assertEqual(r("Save the file now.", "Sp.", "de"), "ratio")
        self.assertIsNone(r("Open the file.", "打开文件。", "zh"))

    def test_mono(self):
        self.assertTrue(clean.mono_ok("Hallo Welt", "de"))
        self.assertFalse(clean.mono_ok("1.2", "de"))
        self.assertFalse(clean.mono_ok("English text here", "ru"))
        self.assertFalse(clean.mono_ok("x" * 30000, "en"))


class Sentences(unittest.TestCase):
    def test_split(self):
        self.assertEqual(clean.split_sentences("One. Two! Three? four."),
                         ["One.", "Two!", "Three? four."])
        self.assertEqual(clean.split_sentences("Use e.g. This one. Next."),
                         ["Use e.g. This one.", "Next."])
        self.assertEqual(clean.split_sentences("你好。我们走。"), ["你好。", "我们走。"])
        self.assertEqual(clean.split_sentences(""), [])

    def test_align(self):
        en = "Open the file. Then save it."
        de = "Öffnen Sie die Datei. Speichern Sie sie dann."
        self.assertEqual(clean.align_paragraph(en, de),
                         [("Open the file.", "Öffnen Sie die Datei."),
                          ("Then save it.", "Speichern Sie sie dann.")])
        # different sentence counts: the paragraph pair is kept whole
        self.assertEqual(clean.align_paragraph(en, "Datei öffnen und speichern."),
                         [(en, "Datei öffnen und speichern.")])
        # same count but inconsistent lengths: whole paragraph
        bad = "A. " + "B" * 200 + "."
        self.assertEqual(len(clean.align_paragraph("Open the file. Then save it.", bad)), 1)


class Split(unittest.TestCase):
    def test_key(self):
        self.assertEqual(clean.split_key("Hello, World!"), clean.split_key("hello world"))
        self.assertEqual(clean.split_key("Straße"), clean.split_key("STRASSE"))
        self.assertNotEqual(clean.split_key("Hello world"), clean.split_key("Hello word"))

    def test_deterministic_and_case_insensitive(self):
        s = "This sentence decides its own split by hash."
        self.assertEqual(clean.split_of(s), clean.split_of(s))
        self.assertEqual(clean.split_of(s), clean.split_of(s.upper().replace(".", "!")))

    def test_short_segments_stay_in_train(self):
        for i in range(300):
            self.assertEqual(clean.split_of("Open file %d" % i), "train")

    def test_proportions(self):
        n = 20000
        c = {"train": 0, "dev": 0, "test": 0}
        for i in range(n):
            c[clean.split_of("this is synthetic sentence number %d here" % i)] += 1
        self.assertGreater(c["dev"], n * 0.006)
        self.assertLess(c["dev"], n * 0.014)
        self.assertGreater(c["test"], n * 0.006)
        self.assertLess(c["test"], n * 0.014)

    def test_leak_keys(self):
        keys = clean.leak_keys("Intro here. The held out sentence is this one. Outro.")
        self.assertIn(clean.split_key("The held out sentence is this one."), keys)


if __name__ == "__main__":
    unittest.main()
