"""The embedded corpus: English Wikipedia articles shipped inside gensim's wheel, cleaned with mwparserfromhell.

gensim (LGPL-2.1) ships ``enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2`` in its test data:
106 real articles (1.7 MB compressed) from a 2016 English Wikipedia dump. The text itself is Wikipedia's
(CC BY-SA 3.0). Nothing from it is committed here: it is read from the installed package at run time.
"""

from __future__ import annotations

import bz2
import contextlib
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from pathlib import Path

import mwparserfromhell

from attnlab.files import write_atomic

DUMP_GLOB = "enwiki-*-shortened.bz2"
CORPUS_VERSION = 2  # bump when the cleaning changes, so cached copies of the corpus are rebuilt
_DROP_LINK_PREFIXES = ("file:", "image:", "category:", "media:")
_DROP_TAGS = {"table", "gallery", "ref", "math", "timeline", "imagemap", "score", "chem"}
_MIN_LINE_WORDS = 4
_LEFTOVER_REF = re.compile(r"<ref[^>]*?/>|<ref[^>]*>.*?</ref>", re.DOTALL | re.IGNORECASE)
_LEFTOVER_TAG = re.compile(r"</?[a-zA-Z][^<>]*>")
_MARKUP_LINE = re.compile(r"^[|!]|^\{\||\[\[|\]\]|\{\{|\}\}|(^|\|)(thumb|upright|left|right|\d+px)\||&nbsp;")


def wiki_dump_path() -> Path:
    """Locate the Wikipedia sample inside the installed gensim package."""
    try:
        import gensim
    except ImportError as exc:  # pragma: no cover - gensim is a hard dependency
        raise FileNotFoundError("data=wiki_sample needs gensim installed (`pip install -e .`)") from exc
    matches = sorted((Path(gensim.__file__).parent / "test" / "test_data").glob(DUMP_GLOB))
    if not matches:
        raise FileNotFoundError(f"gensim {gensim.__version__} ships no {DUMP_GLOB}; install gensim>=4.4")
    return matches[0]


def iter_articles(dump: Path) -> Iterator[tuple[str, str]]:
    """Yield (title, wikitext) for main-namespace, non-redirect pages of a MediaWiki XML dump."""
    with bz2.open(dump) as fh:
        for _, element in ET.iterparse(fh, events=("end",)):
            if element.tag.rsplit("}", 1)[-1] != "page":
                continue
            namespace = element.findtext("{*}ns")
            title = element.findtext("{*}title") or ""
            text = element.findtext("{*}revision/{*}text") or ""
            if namespace == "0" and not text.lstrip().lower().startswith("#redirect"):
                yield title, text
            element.clear()


def clean_wikitext(wikitext: str) -> str:
    """Turn wiki markup into plain prose: drop files, tables, references and templates, keep paragraphs."""
    code = mwparserfromhell.parse(wikitext)
    for link in code.filter_wikilinks():
        if str(link.title).strip().lower().startswith(_DROP_LINK_PREFIXES):
            _remove(code, link)
    for tag in code.filter_tags():
        if str(tag.tag).strip().lower() in _DROP_TAGS:
            _remove(code, tag)
    for template in code.filter_templates(recursive=False):
        _remove(code, template)
    text = code.strip_code(normalize=True, collapse=True)
    # What the parser leaves of malformed markup (unclosed refs, broken tables, image captions) is dropped.
    text = _LEFTOVER_REF.sub("", text)
    lines = []
    for line in text.splitlines():
        line = re.sub(r"[ \t]+", " ", _LEFTOVER_TAG.sub("", line)).strip()
        if len(line.split()) >= _MIN_LINE_WORDS and not _MARKUP_LINE.search(line):
            lines.append(line)
    return "\n".join(lines)


def _remove(code: mwparserfromhell.wikicode.Wikicode, node: object) -> None:
    with contextlib.suppress(ValueError):  # already removed together with a parent node
        code.remove(node)


def wiki_sample_documents(dump: Path | None = None) -> Iterator[dict[str, str]]:
    """The cleaned embedded corpus as ``{"title", "text"}`` records, in dump order."""
    for title, wikitext in iter_articles(dump or wiki_dump_path()):
        text = clean_wikitext(wikitext)
        if text:
            yield {"title": title, "text": text}


def write_once(target: Path, documents: Iterable[dict[str, str]]) -> Path:
    """Write documents as JSON lines to ``target`` unless it exists, through a temporary file of this writer's own: a
    build cut short is never taken for a finished corpus, and two builds at once never write into one file."""
    if not target.exists():
        write_atomic(target, lambda fh: fh.writelines((json.dumps(doc) + "\n").encode() for doc in documents))
    return target
