"""Text cleaning for the corpus pipeline: normalisation, filters, sentence pairing, split keys.

Pure functions only (no I/O), so the unit tests in tests/unit/data exercise exactly what the
pipeline runs. Not a tokenizer and not a language identifier: script checks are letter counts.
"""

import hashlib
import re
import unicodedata

# Whitespace (incl. NBSP and the other Unicode spaces) collapses to one ASCII space. Zero-width
# joiner/non-joiner are kept: Persian spelling needs ZWNJ (U+200C).
_WS_RE = re.compile(r"[\s\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]+")
# C0/C1 controls other than whitespace, and the BOM/soft hyphen/word joiner noise.
_CTRL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u2060\ufffd]")


def normalize(text):
    """NFC, controls removed, every whitespace run -> one space, stripped. Returns a str."""
    if not text:
        return ""
    if not text.isascii():
        text = unicodedata.normalize("NFC", text)
    text = _CTRL_RE.sub("", text)
    return _WS_RE.sub(" ", text).strip()


def decode_utf8(raw):
    """Bytes -> str if valid UTF-8, else None (invalid segments are dropped, never repaired)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


# Placeholders and markup that make a segment a template rather than text.
_PLACEHOLDER_RES = [
    re.compile(r"%(\d+\$)?[-+#0]*(\d+|\*)?(\.(\d+|\*))?(hh|h|ll|l|L|q|j|z|t|I64)?[diouxXeEfFgGcsSpn]"),
    re.compile(r"%\([A-Za-z_][A-Za-z0-9_]*\)[-+#0 ]*\d*(\.\d+)?[diouxXeEfFgGcrsa%]"),  # %(name)s
    re.compile(r"%\d+"),  # Qt/KDE %1
    re.compile(r"%[A-Z][A-Z_]{2,}%?"),  # %PRODUCTNAME
    re.compile(r"\{[A-Za-z0-9_.:!\-]*\}"),  # {0} {name} {}
    re.compile(r"\$\([A-Za-z0-9_]+\)"),  # $(ARG1)
    re.compile(r"\$\{[^}]*\}|\$[A-Z][A-Z0-9_]{2,}"),  # ${VAR} $VAR
    re.compile(r"</?[A-Za-z][A-Za-z0-9:_-]*(\s[^<>]*)?/?>"),  # markup tags
    re.compile(r"&(#\d+|#x[0-9A-Fa-f]+|[A-Za-z]+);"),  # entities
    re.compile(r"\\[ntr\"\\]"),  # literal escapes
    re.compile(r"https?://|www\.|@[A-Za-z0-9-]+\.[A-Za-z]{2,}"),  # URLs / e-mail
]


_PLACEHOLDER_RE = re.compile("|".join("(?:%s)" % r.pattern for r in _PLACEHOLDER_RES))
_PLACEHOLDER_CHARS = re.compile(r"[%{$<&\\@]|://|www\.")


def has_placeholder(text):
    """True if text holds printf/format/shell placeholders, markup, entities, escapes or URLs."""
    if not _PLACEHOLDER_CHARS.search(text):
        return False
    return _PLACEHOLDER_RE.search(text) is not None


# Accelerators: "(_F)"/"(&F)" appended in CJK UIs, "_File", "~Open", "&Save" (not "& ").
_ACCEL_PAREN_RE = re.compile(r"\s*\(\s*[_&~][A-Za-z0-9]\s*\)")
_ACCEL_RE = re.compile(r"(?<![\w&])[_~&](?=\w)")


def strip_accelerators(text):
    """Remove GUI mnemonic markers from a UI string; leaves "a & b" and snake_case alone."""
    text = _ACCEL_PAREN_RE.sub("", text)
    return _ACCEL_RE.sub("", text)


_LETTER_RE = re.compile(r"[^\W\d_]")
_LATIN_RE = re.compile(r"[A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff]")
_CYR_RE = re.compile(r"[\u0400-\u052f]")
_HAN_RE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f]")
_ARAB_RE = re.compile(r"[\u0600-\u06ff\u0750-\u077f\ufb50-\ufdff\ufe70-\ufeff]")
_OWN_RE = {"ru": _CYR_RE, "zh": _HAN_RE, "fa": _ARAB_RE}
# Run versions for counting: len(text) - len(rx.sub("", text)) counts the same characters as
# len(findall) but matches once per word instead of once per character.
_LETTER_RUN_RE = re.compile(_LETTER_RE.pattern + "+")
_OWN_RUN_RE = {k: re.compile(v.pattern + "+") for k, v in _OWN_RE.items()}
_LATIN_RUN_RE = re.compile(_LATIN_RE.pattern + "+")


def _count_runs(rx, text):
    return len(text) - len(rx.sub("", text))


def _count(rx, text):
    return sum(1 for _ in rx.finditer(text))


def script_counts(text):
    """(letters, latin, cyrillic, han, arabic) counts of letters in text."""
    return (_count(_LETTER_RE, text), _count(_LATIN_RE, text), _count(_CYR_RE, text),
            _count(_HAN_RE, text), _count(_ARAB_RE, text) if _ARAB_RE.search(text) else 0)


# Fraction of letters that must be in the language's own script.
SCRIPT_MIN = 0.5


_ASCII_NONLETTERS = bytes(c for c in range(128) if not chr(c).isalpha())


def letter_count(text):
    """Number of letters (Unicode category L*, digits and underscore excluded) in text."""
    if text.isascii():
        return len(text.encode("ascii").translate(None, _ASCII_NONLETTERS))
    return _count_runs(_LETTER_RUN_RE, text)


def script_ok(text, lang):
    """True if most letters of text are in lang's script (Latin for en/de/fr/es, Cyrillic for ru,
    Han for zh, Arabic for fa). Text without letters fails."""
    if text.isascii():
        return lang not in _OWN_RE and letter_count(text) > 0
    letters = _count_runs(_LETTER_RUN_RE, text)
    if letters == 0:
        return False
    own = _count_runs(_OWN_RUN_RE.get(lang, _LATIN_RUN_RE), text)
    return own >= SCRIPT_MIN * letters


def has_english_letters(text):
    return any("a" <= c <= "z" or "A" <= c <= "Z" for c in text)


# Pair limits (UTF-8 bytes).
PAIR_MAX_BYTES = 1500
PAIR_MIN_EN_LETTERS = 2
RATIO_MIN = 0.3
RATIO_MAX = 4.0
MONO_MAX_BYTES = 20000
MONO_MIN_LETTERS = 3


def ratio_ok(en, x):
    """Byte-length ratio len(x)/len(en) inside [RATIO_MIN, RATIO_MAX] (UTF-8 bytes: zh is 3 per
    character, ru/fa 2, which the wide window allows)."""
    le, lx = len(en.encode("utf-8")), len(x.encode("utf-8"))
    if le == 0 or lx == 0:
        return False
    r = lx / le
    return RATIO_MIN <= r <= RATIO_MAX


_ASCII_LETTER_RE = re.compile(r"[A-Za-z]")


def pair_reject_reason(en, x, lang):
    """None if (en, x) is a usable en->lang pair (both already normalized), else a short reason."""
    if not en or not x:
        return "empty"
    if len(en.encode("utf-8")) > PAIR_MAX_BYTES or len(x.encode("utf-8")) > PAIR_MAX_BYTES:
        return "long"
    if en == x:
        return "untranslated"
    if len(_ASCII_LETTER_RE.findall(en)) < PAIR_MIN_EN_LETTERS:
        return "no-english"
    if has_placeholder(en) or has_placeholder(x):
        return "placeholder"
    if not script_ok(en, "en"):
        return "script-en"
    if not script_ok(x, lang):
        return "script"
    if not ratio_ok(en, x):
        return "ratio"
    return None


def mono_ok(text, lang):
    """A monolingual segment is kept if it is short enough, has letters and is in lang's script."""
    if not text or len(text.encode("utf-8")) > MONO_MAX_BYTES:
        return False
    if letter_count(text) < MONO_MIN_LETTERS:
        return False
    return script_ok(text, lang)


# Sentence boundaries: whitespace after . ! ? when the next piece starts like a sentence (capital,
# digit, opening quote/bracket, Arabic-script letter) and the previous one does not end with a known
# abbreviation; always after a CJK/Arabic full stop.
_BOUND_RE = re.compile(r"(?<=[.!?])\s+|(?<=[\u3002\uff01\uff1f\u061f])\s*")
_START_RE = re.compile(r"[\"'\u00ab\u201e\u201c(\[\u00bf\u00a1]?[A-Z\u00c0-\u00d6\u00d8-\u00de\u0400-\u042f0-9\u0600-\u06ff]")
_ABBREV_RE = re.compile(r"(e\.g|i\.e|etc|vs|mr|mrs|dr|st|z\.b|d\.h|usw|bzw|ca|nr|vgl|cf|p\.ex|sr|sra|"
                        r"\u0442\.\u0435|\u0442\.\u0434|\u0442\.\u043f|\u0441\u043c|[a-z]|\d+)\.", re.I)
_CJK_STOPS = "\u3002\uff01\uff1f\u061f"


def split_sentences(text):
    """Split a normalized paragraph into sentences (heuristic, abbreviation-aware). Returns a list
    with at least one element for non-empty text."""
    if not text:
        return []
    out = []
    for p in _BOUND_RE.split(text):
        if not p:
            continue
        if out and out[-1][-1] not in _CJK_STOPS and (
                not _START_RE.match(p) or _ABBREV_RE.fullmatch(out[-1].rsplit(" ", 1)[-1])):
            out[-1] = out[-1] + " " + p
        else:
            out.append(p)
    return out


def align_paragraph(en, x):
    """Sentence pairs for a paragraph pair when both sides split into the same number of sentences
    with consistent byte-length ratios (each within 0.5x..2x of the paragraph ratio); otherwise the
    paragraph pair itself. Returns a list of (en, x)."""
    se, sx = split_sentences(en), split_sentences(x)
    if len(se) <= 1 or len(se) != len(sx):
        return [(en, x)]
    total = len(x.encode("utf-8")) / max(1, len(en.encode("utf-8")))
    for a, b in zip(se, sx):
        r = len(b.encode("utf-8")) / max(1, len(a.encode("utf-8")))
        if not (0.5 * total <= r <= 2.0 * total):
            return [(en, x)]
    return list(zip(se, sx))


_KEY_DROP_RE = re.compile(r"[\W_]+", re.UNICODE)
_ASCII_NONALNUM = bytes(c for c in range(128) if not chr(c).isalnum())


def split_key(text):
    """The key that decides the split and detects held-out leaks: NFKC, casefolded, punctuation and
    whitespace removed. Two segments that differ only in case/punctuation share a key."""
    if text.isascii():
        return text.encode("ascii").lower().translate(None, _ASCII_NONALNUM).decode("ascii")
    t = unicodedata.normalize("NFKC", text).casefold()
    return _KEY_DROP_RE.sub("", t)


# Split: SHA-256 of the normalised English key -> bucket in [0, 1000).
DEV_BUCKETS = range(0, 10)  # 1%
TEST_BUCKETS = range(10, 20)  # 1%
# Held-out pairs are sentences, not UI labels: shorter English stays in train (consistently for
# every language, since the rule looks at the English only).
HELDOUT_MIN_WORDS = 4


def split_of(en):
    """'dev', 'test' or 'train' for an English segment, by a hash of split_key(en): the same
    English always lands in the same split for every target language."""
    if len(en.split()) < HELDOUT_MIN_WORDS:
        return "train"
    h = hashlib.sha256(split_key(en).encode("utf-8")).digest()
    b = int.from_bytes(h[:8], "big") % 1000
    if b in DEV_BUCKETS:
        return "dev"
    if b in TEST_BUCKETS:
        return "test"
    return "train"


def digest(text):
    """Compact 8-byte digest for exact dedup sets."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()


def leak_keys(text):
    """Keys of a monolingual segment and of each of its sentences, for the held-out check."""
    keys = [split_key(text)]
    sents = split_sentences(text)
    if len(sents) > 1:
        keys.extend(split_key(s) for s in sents)
    return [k for k in keys if k]
