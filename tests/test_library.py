"""What a user of the installed package gets besides the clone's behaviour: a per-user data cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose

import attnlab.configs
from attnlab.configs import initialized
from tests.conftest import ROOT


def cache_dir_of(overrides: list[str]) -> str:
    with initialized("conf", job_name="train"):
        return compose(config_name="train", overrides=overrides, return_hydra_config=True).paths.cache_dir


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """attnlab as ``pip install`` leaves it: configs from the package (``pkg://attnlab.conf``), started in an empty
    directory, with ``$XDG_CACHE_HOME`` at ``<tmp>/xdg``."""
    monkeypatch.setattr(attnlab.configs, "checkout", lambda: None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("ATTNLAB_CACHE", raising=False)
    return tmp_path


def test_installed_the_cache_is_per_user_not_per_directory(installed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new working directory must not prepare the corpus and train the tokenizer again (HF's cache is per user
    too): ``$XDG_CACHE_HOME/attnlab``, else ``~/.cache/attnlab``; ``ATTNLAB_CACHE`` moves it, ``paths.cache_dir``
    wins over both. Outputs still go under the directory the command starts from."""
    assert cache_dir_of([]) == str(installed / "xdg" / "attnlab")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir_of([]) == str(Path.home() / ".cache" / "attnlab")
    monkeypatch.setenv("ATTNLAB_CACHE", str(installed / "mine"))
    assert cache_dir_of([]) == str(installed / "mine")
    assert cache_dir_of([f"paths.cache_dir={installed / 'cfg'}"]) == str(installed / "cfg")
    with initialized("conf", job_name="train"):
        cfg = compose(config_name="train", return_hydra_config=True)
        assert cfg.paths.log_dir == str(installed / "outputs")


def test_a_clone_keeps_its_own_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clone's tests, tables and recorded cells read ``<repository>/.cache/attnlab`` as before."""
    monkeypatch.delenv("ATTNLAB_CACHE", raising=False)
    assert cache_dir_of([]) == str(ROOT / ".cache" / "attnlab")
    assert cache_dir_of(["paths.root_dir=/elsewhere"]) == "/elsewhere/.cache/attnlab"
