"""Readers for the formats the corpus comes in: HTML/Mallard documentation trees, gettext .mo
catalogues, DDTP Translation indexes, roff man pages and fortune files.

Each reader turns bytes into normalized segments; it does not filter or split (clean.py does) and
does no I/O beyond reading the file it is given.
"""

import gzip
import html
import re
import struct

import clean

# --- language tags -------------------------------------------------------------------------------

LANGS = ("en", "de", "fr", "ru", "es", "zh", "fa")
TARGETS = ("de", "fr", "ru", "es", "zh", "fa")

_TAG_MAP = {
    "c": "en", "en": "en", "en-us": "en", "en-gb": None,
    "de": "de", "de-de": "de",
    "fr": "fr", "fr-fr": "fr",
    "ru": "ru", "ru-ru": "ru",
    "es": "es", "es-es": "es",
    "zh-cn": "zh", "zh-hans": "zh",
    "fa": "fa", "fa-ir": "fa",
}


def lang_of_tag(tag):
    """Our language code for a locale tag ('de_DE', 'zh-CN', 'C', 'fa-IR'...) or None."""
    if tag is None:
        return None
    t = tag.lower().replace("_", "-").split(".")[0].split("@")[0]
    return _TAG_MAP.get(t)


# --- HTML / XML documentation --------------------------------------------------------------------

_BLOCK_TAGS = {
    "p", "div", "li", "dt", "dd", "td", "th", "h1", "h2", "h3", "h4", "h5", "h6", "title",
    "caption", "figcaption", "blockquote", "section", "table", "tr", "ul", "ol", "dl", "br",
    "item", "note", "desc", "terms", "tree", "list", "steps", "body", "page", "entry", "row",
}
_SKIP_TAGS = {"script", "style", "pre", "head", "screen", "code-block", "info", "credit", "license",
              "listing", "programlisting", "synopsis", "example"}
_VOID_TAGS = {"br", "img", "meta", "link", "hr", "input", "col", "area", "base", "wbr", "embed",
              "source", "media"}


_TAG_RE = re.compile(r"<!--.*?-->|<!\[CDATA\[.*?\]\]>|<[!?][^>]*>|<(/?)([A-Za-z][\w:.-]*)((?:[^>\"']|\"[^\"]*\"|'[^']*')*)>",
                     re.S)
_ATTR_RE = re.compile(r"([\w:.-]+)(?:\s*=\s*(\"[^\"]*\"|'[^']*'|[^\s\"'>]+))?")


def _attrs(s):
    out = {}
    for m in _ATTR_RE.finditer(s):
        v = m.group(2)
        if v and v[0] in "\"'":
            v = v[1:-1]
        out[m.group(1).lower()] = html.unescape(v) if v else ""
    return out


def html_segments(raw):
    """(id or None, normalized text) for every block-level element of an HTML/XML document given as
    bytes. Elements with a `hidden` attribute are skipped unless their id starts with 'default'
    (LibreOffice help's per-module switches keep their default variant); <pre>, <script>, <head>,
    navigation (class toc/docnav*) and similar are skipped whole. Invalid UTF-8 yields nothing.
    A regex tag scanner, not a validating parser: unbalanced markup degrades, never raises."""
    text = clean.decode_utf8(raw)
    if text is None:
        return []
    segs = []
    buf = []
    cur_id = None
    skip = []  # stack of tag names being skipped

    def flush():
        nonlocal cur_id
        if buf:
            t = clean.normalize(html.unescape("".join(buf)))
            buf.clear()
            if t:
                segs.append((cur_id, t))
        cur_id = None

    pos = 0
    for m in _TAG_RE.finditer(text):
        if not skip and m.start() > pos:
            buf.append(text[pos:m.start()])
        pos = m.end()
        name = m.group(2)
        if name is None:  # comment, doctype, processing instruction
            continue
        tag = name.lower()
        closing = m.group(1) == "/"
        self_closing = m.group(3).rstrip().endswith("/")
        if skip:
            if closing:
                if skip[-1] == tag:
                    skip.pop()
                elif tag in skip:
                    while skip and skip.pop() != tag:
                        pass
            elif tag not in _VOID_TAGS and not self_closing:
                skip.append(tag)
            continue
        if closing:
            if tag in _BLOCK_TAGS:
                flush()
            continue
        raw_attrs = m.group(3)
        a = {}
        if raw_attrs and ("hidden" in raw_attrs or "class" in raw_attrs or
                          ("id" in raw_attrs and tag in _BLOCK_TAGS)):
            a = _attrs(raw_attrs)
        cls = a.get("class") or ""
        hidden = "hidden" in a and not (a.get("id") or "").startswith("default")
        if tag in _SKIP_TAGS or hidden or cls == "toc" or cls.startswith("docnav"):
            if tag not in _VOID_TAGS and not self_closing:
                skip.append(tag)
            continue
        if tag in _BLOCK_TAGS:
            flush()
            if tag not in _VOID_TAGS:
                cur_id = a.get("id")
    if not skip and pos < len(text):
        buf.append(text[pos:])
    flush()
    return segs


def pair_documents(seg_en, seg_x):
    """Pair two segment lists of one document in two languages: zipped in order when both have the
    same count, else matched on ids that occur exactly once on each side. Returns [(en, x)]."""
    if len(seg_en) == len(seg_x):
        return [(a[1], b[1]) for a, b in zip(seg_en, seg_x)]

    def unique(segs):
        seen, dup = {}, set()
        for i, t in segs:
            if i is None:
                continue
            if i in seen:
                dup.add(i)
            seen[i] = t
        return {k: v for k, v in seen.items() if k not in dup}

    ue, ux = unique(seg_en), unique(seg_x)
    return [(ue[k], ux[k]) for k in ue if k in ux]


# --- gettext .mo ---------------------------------------------------------------------------------

_CHARSET_RE = re.compile(rb"charset=([A-Za-z0-9_.:-]+)")
_TRANSLATOR_CTX = (b"NAME OF TRANSLATORS", b"EMAIL OF TRANSLATORS")
_TRANSLATOR_IDS = {b"Your names", b"Your emails", b"translator-credits", b"translator_credits"}


def mo_entries(raw):
    """(msgid, msgstr) strings from a gettext .mo file given as bytes: the header entry, translator
    credits and empty translations skipped; for plural entries the singular forms; the context
    (msgctxt) dropped. Raises ValueError on a file that is not a .mo."""
    if len(raw) < 28:
        raise ValueError("mo: too short")
    magic = struct.unpack("<I", raw[:4])[0]
    if magic == 0x950412DE:
        e = "<"
    elif magic == 0xDE120495:
        e = ">"
    else:
        raise ValueError("mo: bad magic")
    _, n, o_orig, o_tr = struct.unpack(e + "4I", raw[4:20])
    if n > 10_000_000 or o_orig + 8 * n > len(raw) or o_tr + 8 * n > len(raw):
        raise ValueError("mo: table out of bounds")
    charset = "utf-8"
    out = []
    for i in range(n):
        lo, oo = struct.unpack(e + "2I", raw[o_orig + 8 * i:o_orig + 8 * i + 8])
        lt, ot = struct.unpack(e + "2I", raw[o_tr + 8 * i:o_tr + 8 * i + 8])
        if oo + lo > len(raw) or ot + lt > len(raw):
            continue
        mid = raw[oo:oo + lo]
        mstr = raw[ot:ot + lt]
        if not mid:  # header
            m = _CHARSET_RE.search(mstr)
            if m:
                charset = m.group(1).decode("ascii", "replace").lower()
            continue
        ctx = b""
        if b"\x04" in mid:
            ctx, mid = mid.split(b"\x04", 1)
        if ctx in _TRANSLATOR_CTX or mid in _TRANSLATOR_IDS:
            continue
        mid = mid.split(b"\x00", 1)[0]
        mstr = mstr.split(b"\x00", 1)[0]
        if not mstr:
            continue
        try:
            a = mid.decode("utf-8")
            b = mstr.decode(charset if charset not in ("charset", "") else "utf-8")
        except (UnicodeDecodeError, LookupError):
            continue
        out.append((a, b))
    return out


# --- DDTP ----------------------------------------------------------------------------------------


def ddtp_records(text, lang_field):
    """{Description-md5: (short, [paragraph, ...])} from the text of a Translation-<lang> index.
    lang_field is the suffix of the Description field ('en', 'de', 'zh_CN'). Long descriptions are
    split into paragraphs on lines holding a lone ' .'; the lines of a paragraph are joined."""
    field = "Description-" + lang_field
    out = {}
    for rec in text.split("\n\n"):
        fields, name = {}, None
        for line in rec.split("\n"):
            if not line:
                continue
            if line[0] in " \t":
                if name is not None:
                    fields[name].append(line[1:])
                continue
            name, _, value = line.partition(":")
            fields[name] = [value.strip()]
        md5, desc = fields.get("Description-md5"), fields.get(field)
        if not md5 or not desc:
            continue
        paras, cur = [], []
        for ln in desc[1:]:
            if ln.strip() == ".":
                if cur:
                    paras.append(clean.normalize(" ".join(cur)))
                cur = []
            else:
                cur.append(ln)
        if cur:
            paras.append(clean.normalize(" ".join(cur)))
        out[md5[0]] = (clean.normalize(desc[0]), [p for p in paras if p])
    return out


# --- roff man pages ------------------------------------------------------------------------------

_ROFF_CHARS = {
    "em": "\u2014", "en": "\u2013", "hy": "-", "mi": "-", "aq": "'", "dq": '"', "lq": "\u201c",
    "rq": "\u201d", "oq": "\u2018", "cq": "\u2019", "bu": "\u2022", "co": "\u00a9", "rg": "\u00ae",
    "tm": "\u2122", "ha": "^", "ti": "~", ">=": "\u2265", "<=": "\u2264", "->": "\u2192",
    "<-": "\u2190", "Fo": "\u00ab", "Fc": "\u00bb", "r!": "\u00a1", "r?": "\u00bf", "lB": "[",
    "rB": "]", "rs": "\\", "dg": "\u2020", "sc": "\u00a7", "de": "\u00b0", "mu": "\u00d7",
    "pl": "+", "eq": "=", "ga": "`", "aa": "\u00b4", "at": "@", "sh": "#", "Do": "$", "lC": "{",
    "rC": "}", "ba": "|", "or": "|", "lh": "", "rh": "", "fm": "\u2032",
}
_ROFF_ESC_RE = re.compile(
    r"\\(\((..)|\[([^\]]*)\]|f(\(..|\[[^\]]*\]|.)|s[-+]?\d+|s\[[^\]]*\]|\*(\(..|\[[^\]]*\]|.)|"
    r"n(\(..|\[[^\]]*\]|.)|[kmgzYV](\(..|\[[^\]]*\]|.)|[hvwlLxbDoNRSX]'[^']*'|.)")
_FONT_MACROS = {"B", "I", "BR", "IR", "RB", "RI", "BI", "IB", "SM", "SB"}
_BREAK_MACROS = {"PP", "P", "LP", "TP", "IP", "HP", "sp", "br", "RS", "RE", "TQ", "SY", "YS", "in",
                 "ti", "bp", "PD", "ne"}


def _roff_sub(m):
    s = m.group(1)
    if m.group(2):
        return _ROFF_CHARS.get(m.group(2), "")
    if m.group(3) is not None:
        return _ROFF_CHARS.get(m.group(3), "")
    c = s[0]
    if c in "-":
        return "-"
    if c in " ~0":
        return " "
    if c == "e" or c == "\\":
        return "\\"
    if c in ".'\"":
        return c if c != '"' else ""
    return ""


def _roff_args(rest):
    args, cur, q = [], [], False
    for ch in rest:
        if ch == '"':
            q = not q
        elif ch == " " and not q:
            if cur:
                args.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        args.append("".join(cur))
    return args


def roff_paragraphs(text):
    """Plain-text paragraphs of a roff man page (a simple stripper: fill text, headings and font
    macros kept; tables, no-fill blocks, comments and requests dropped)."""
    paras, cur = [], []
    nofill = False
    tbl = False

    def flush():
        if cur:
            p = clean.normalize(" ".join(cur))
            if p:
                paras.append(p)
            cur.clear()

    for line in text.split("\n"):
        if line.startswith(('.\\"', "'\\\"", '\\"')):
            continue
        if line[:1] in (".", "'"):
            req = line[1:].lstrip()
            name, _, rest = req.partition(" ")
            name = name.strip()
            if name in ("TS",):
                tbl = True
            elif name in ("TE",):
                tbl = False
            elif name in ("nf", "EX"):
                flush()
                nofill = True
            elif name in ("fi", "EE"):
                nofill = False
            elif name in ("SH", "SS"):
                flush()
                h = _ROFF_ESC_RE.sub(_roff_sub, " ".join(_roff_args(rest)))
                if h.strip():
                    paras.append(clean.normalize(h))
            elif name in _FONT_MACROS and not (nofill or tbl):
                args = _roff_args(rest)
                joiner = " " if name in ("B", "I", "SM", "SB") else ""
                cur.append(_ROFF_ESC_RE.sub(_roff_sub, joiner.join(args)))
            elif name in _BREAK_MACROS or name == "":
                flush()
            continue
        if nofill or tbl:
            continue
        if not line.strip():
            flush()
            continue
        cur.append(_ROFF_ESC_RE.sub(_roff_sub, line))
    flush()
    return paras


def read_maybe_gz(path):
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return raw


def decode_lang(raw, lang):
    """Strict UTF-8; for zh and ru a legacy charset (GB18030, KOI8-R) is tried when UTF-8 fails
    (a real conversion, never a repair). None if neither decodes."""
    t = clean.decode_utf8(raw)
    if t is not None:
        return t
    legacy = {"zh": "gb18030", "ru": "koi8-r"}.get(lang)
    if legacy:
        try:
            return raw.decode(legacy)
        except UnicodeDecodeError:
            return None
    return None


def fortunes(text):
    """Fortunes of a fortune(6) file: entries separated by lines holding a lone '%'."""
    out, cur = [], []
    for line in text.split("\n"):
        if line.strip() == "%":
            if cur:
                out.append(clean.normalize(" ".join(cur)))
            cur = []
        else:
            cur.append(line)
    if cur:
        out.append(clean.normalize(" ".join(cur)))
    return [f for f in out if f]


def unescape(text):
    return html.unescape(text)
