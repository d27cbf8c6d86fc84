"""The slow suite's order: the modules of its longest tests start first, so its workers finish together."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

from tests.conftest import ROOT, long_modules_first


def item(nodeid: str, long: bool = False) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: object() if long and name == "long" else None)


def test_the_modules_of_long_tests_come_first_whole_and_otherwise_in_collection_order() -> None:
    items = [
        item("tests/test_a.py::test_one"),
        item("tests/test_b.py::test_quick"),
        item("tests/test_b.py::test_minutes", long=True),
        item("tests/test_c.py::test_one"),
        item("tests/test_d.py::test_minutes[x]", long=True),
    ]
    ordered = [each.nodeid for each in long_modules_first(items)]  # type: ignore[arg-type]
    assert ordered == [
        "tests/test_b.py::test_quick",
        "tests/test_b.py::test_minutes",
        "tests/test_d.py::test_minutes[x]",
        "tests/test_a.py::test_one",
        "tests/test_c.py::test_one",
    ]


def test_make_test_slow_keeps_that_order() -> None:
    """pytest-xdist's loadscope reorders modules by their number of tests unless told not to."""
    recipe = subprocess.run(["make", "-n", "test-slow"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "--dist loadscope" in recipe and "--no-loadscope-reorder" in recipe
