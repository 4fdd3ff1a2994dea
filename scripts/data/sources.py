"""The corpus sources and the two tiers: which Debian packages (and DDTP indexes) each tier reads,
how each is read, and its licence. Data only; build.py runs it.
"""

# Job kinds: "ddtp" (apt's Translation-* indexes), "doc" (a documentation tree in several
# languages; path regex yields lang and a relative name shared across languages), "mo" (gettext
# catalogues of one package), "man" (roff man pages), "fortune" (fortune files).

LO_LANGS = ("en-us", "de", "fr", "ru", "es", "zh-cn")
LO_L10N = ("de", "fr", "ru", "es", "zh-cn", "fa")
GIMP_LANGS = ("en", "de", "fr", "ru", "es", "zh-cn")

DOCS = {
    "debian-handbook": dict(
        packages=["debian-handbook"],
        regex=r"usr/share/doc/debian-handbook/html/(?P<lang>[a-z]{2}-[A-Z]{2})/(?P<rel>[^/]+\.html)$",
        licence="GPL-2+ or CC-BY-SA-3.0"),
    "libreoffice-help": dict(
        packages=["libreoffice-help-" + l for l in LO_LANGS],
        regex=r"usr/share/libreoffice/help/(?P<lang>[^/]+)/(?P<rel>text/.+\.html)$",
        licence="MPL-2.0"),
    "gimp-help": dict(
        packages=["gimp-help-" + l for l in GIMP_LANGS],
        regex=r"usr/share/gimp/2\.0/help/(?P<lang>[^/]+)/(?P<rel>.+\.html)$",
        licence="GFDL-1.2"),
    "debian-reference": dict(
        packages=["debian-reference-" + l for l in ("en", "de", "fr", "es", "zh-cn")],
        regex=r"usr/share/debian-reference/(?P<rel>[^/.]+)\.(?P<lang>[a-z]{2}(-[a-z]{2})?)\.html$",
        licence="GPL-2+"),
    "installation-guide": dict(
        packages=["installation-guide-amd64"],
        regex=r"usr/share/doc/installation-guide-amd64/(?P<lang>[a-zA-Z_]+)/(?P<rel>[^/]+\.html)$",
        licence="GPL-2+"),
    "gnome-user-docs": dict(
        packages=["gnome-user-docs"],
        regex=r"usr/share/help/(?P<lang>[^/]+)/(?P<rel>.+\.page)$",
        licence="CC-BY-SA-3.0"),
    "debian-faq": dict(
        packages=["debian-faq", "debian-faq-de", "debian-faq-fr", "debian-faq-ru", "debian-faq-zh-cn"],
        regex=r"usr/share/doc/debian/FAQ/(?:[a-zA-Z_]+/)?(?P<rel>[^/.]+)\.(?P<lang>[a-zA-Z_-]+)\.html$",
        licence="verbatim and modified copies permitted (see copyright)"),
    "developers-reference": dict(
        packages=["developers-reference", "developers-reference-de", "developers-reference-fr",
                  "developers-reference-ru"],
        regex=r"usr/share/developers-reference/(?:(?P<lang>[a-z]{2}(_[A-Z]{2})?)/)?(?P<rel>[^/]+\.html)$",
        default_lang="en",
        licence="GPL-2"),
}

MO_QUICK = ["libreoffice-l10n-" + l for l in LO_L10N] + ["libgtk-3-common", "aegisub-l10n"]
MO_FULL = MO_QUICK + [
    "vlc-l10n", "gnucash-common", "evolution-common", "krita-l10n", "cinnamon-l10n",
    "freeciv-data", "digikam-data", "kdevelop-l10n", "k3b-i18n", "wordpress-l10n",
    "libvirt-l10n", "claws-mail-i18n", "util-linux-locales", "gnupg-l10n", "kile-l10n",
    "sylpheed-i18n", "e2fsprogs-l10n", "gutenprint-locales", "gnumeric-common", "pidgin-data",
    "gnome-control-center-data", "evolution-data-server-common", "geany-common", "mc-data",
    "nautilus-data", "gedit-common", "abiword-common", "rhythmbox-data", "kdenlive-data",
    "gramps", "gimp-data",
]

# (package, lang or None = language from /usr/share/man/<lang>/)
MAN = [("manpages", "en"), ("manpages-dev", "en"), ("manpages-de", None), ("manpages-de-dev", None),
       ("manpages-fr", None), ("manpages-fr-dev", None), ("manpages-ru", None),
       ("manpages-es", None), ("manpages-es-dev", None), ("manpages-zh", None)]
FORTUNE = [("fortunes", "en"), ("fortunes-min", "en"), ("fortunes-de", "de"),
           ("fortunes-ru", "ru"), ("fortunes-es", "es"), ("fortunes-zh", "zh")]

LICENCES = {
    "ddtp": "DDTP translations of Debian package descriptions (each package's own licence; DDTP "
            "translations are contributed under the package's terms)",
    "mo": "each catalogue under its package's licence (GPL/LGPL/MPL family); see manifest versions",
    "man": "man-pages project licences (English); manpages-l10n: GPL-3+; manpages-zh: GPL",
    "fortune": "fortunes: BSD / public domain; fortunes-ru: GPL-2+; fortunes-zh: GPL-3+",
}


DDTP_JOBS = [("ddtp", "ddtp-" + l, {"lang": l}) for l in ("en", "fr", "de", "ru", "es", "zh")]


def jobs_for(tier):
    """The ordered job list of a tier; expensive jobs first so two workers stay balanced."""
    if tier == "quick":
        jobs = [("doc", "debian-handbook", DOCS["debian-handbook"])] + DDTP_JOBS
        jobs += [("mo", p, {"packages": [p]}) for p in MO_QUICK]
        return jobs
    if tier != "full":
        raise ValueError("unknown tier %r (quick or full)" % tier)
    order = ["gimp-help", "libreoffice-help", "debian-handbook", "gnome-user-docs",
             "installation-guide", "debian-reference", "developers-reference", "debian-faq"]
    jobs = [("doc", n, DOCS[n]) for n in order[:2]] + DDTP_JOBS
    jobs += [("doc", n, DOCS[n]) for n in order[2:]]
    jobs += [("man", p, {"packages": [p], "lang": l}) for p, l in MAN]
    jobs += [("mo", p, {"packages": [p]}) for p in MO_FULL]
    jobs += [("fortune", p, {"packages": [p], "lang": l}) for p, l in FORTUNE]
    return jobs


def packages_for(tier):
    out = []
    for kind, name, spec in jobs_for(tier):
        for p in spec.get("packages", []):
            if p not in out:
                out.append(p)
    return out


DATACENTERS = {"dc-a": ["en", "de", "fr", "es"], "dc-b": ["en", "ru", "zh", "fa"]}
