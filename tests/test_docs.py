"""The manual's links hold in a clone: every relative link and image in README.md, docs/ and the results' READMEs
names a file (and, with an anchor, a heading) in the repository; every page moved out of the README is one click from
it; and no file names a path outside the repository (a clone has neither the project's working notes nor ``/work``)."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt
from mdit_py_plugins.anchors import anchors_plugin

from tests.conftest import ROOT

# written so that this file does not match them itself
OUTSIDE = re.compile(r"\.\./shar[e]d\b|(?<![\w.~-])/wor[k]/|\bspec section\b|\bseed 0\d\d\b")


def manual_pages(root: Path = ROOT) -> list[Path]:
    results = sorted(root.glob("experiments/results/*/README.md"))
    return [root / "README.md", *sorted((root / "docs").rglob("*.md")), *results]


def parse(page: Path) -> list:
    return MarkdownIt("commonmark").enable("table").use(anchors_plugin, max_level=6).parse(page.read_text())


@cache
def anchors(page: Path) -> set[str]:
    """The ids GitHub gives the page's headings (mdit-py-plugins' anchors, the same rule)."""
    return {token.attrGet("id") for token in parse(page) if token.type == "heading_open"}


def targets(page: Path) -> list[str]:
    """Every link's and image's target on the page."""
    found = []
    for token in parse(page):
        for child in token.children or []:
            if child.type == "link_open":
                found.append(str(child.attrGet("href")))
            elif child.type == "image":
                found.append(str(child.attrGet("src")))
    return found


def broken(page: Path, root: Path = ROOT) -> list[str]:
    """The page's relative links that name no file or directory of the repository, or no heading of their page."""
    found = []
    for target in targets(page):
        parts = urlsplit(target)
        if parts.scheme or parts.netloc:
            continue  # a web address: not checked offline
        path = (page.parent / unquote(parts.path)).resolve() if parts.path else page.resolve()
        if not path.is_relative_to(root.resolve()) or not path.exists():
            found.append(f"{page.relative_to(root)}: {target} (no such file in the repository)")
        elif parts.fragment and path.suffix == ".md" and parts.fragment not in anchors(path):
            found.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return found


def test_every_link_and_image_of_the_manual_resolves() -> None:
    pages = manual_pages()
    assert len(pages) > 10 and (ROOT / "docs" / "attention.md") in pages
    assert [problem for page in pages for problem in broken(page)] == []


def test_every_page_moved_out_of_the_readme_is_one_click_from_it() -> None:
    linked = {(ROOT / urlsplit(t).path).resolve() for t in targets(ROOT / "README.md") if not urlsplit(t).scheme}
    unlinked = [page.relative_to(ROOT) for page in manual_pages()[1:] if page.resolve() not in linked]
    assert unlinked == []


def test_a_broken_link_a_missing_heading_and_a_way_out_are_each_named(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title: `x`\n\n## Two words\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md#two-words) [ok](docs/a.md#title-x) [ok](#top) [web](https://example.org/x)\n\n"
        "[gone](docs/b.md) [heading](docs/a.md#three) ![figure](docs/x.png) [out](../elsewhere/spec.md)\n\n# Top\n"
    )
    assert broken(tmp_path / "README.md", tmp_path) == [
        "README.md: docs/b.md (no such file in the repository)",
        "README.md: docs/a.md#three (no such heading)",
        "README.md: docs/x.png (no such file in the repository)",
        "README.md: ../elsewhere/spec.md (no such file in the repository)",
    ]


def repository_files() -> list[Path]:
    """Tracked files and new ones git does not ignore: what a clone (or the next commit) holds."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the repository's file list is git's")
    return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def test_no_file_names_a_path_outside_the_repository() -> None:
    found = []
    for path in repository_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # a figure or another binary file
        found += [f"{path.relative_to(ROOT)}: {m[0]}" for m in OUTSIDE.finditer(text)]
    assert found == []


@pytest.mark.parametrize(  # each split in two, so that this file does not name them itself
    "text", ["see ../" + "shared/spec.md", "--out /" + "work/notes/x.md", "as spec " + "section 9", "seed " + "001"]
)
def test_a_path_outside_the_repository_is_found(text: str) -> None:
    assert OUTSIDE.search(text)
