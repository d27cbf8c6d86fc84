"""Where the Hydra configs are: a checkout's ``conf/`` and ``experiments/conf/``, or the same files installed inside
the package (``attnlab.conf``, ``attnlab.tables.conf``: pyproject maps the directories there, one copy of each YAML).

A checkout's own directories come first, so its outputs land in the repository (``${project_root:}`` follows a
file-based config directory up to ``pyproject.toml``); an installed attnlab composes from ``pkg://``, and its outputs
land under the directory the command starts from."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PACKAGES = {"conf": "attnlab.conf", "experiments/conf": "attnlab.tables.conf"}  # repository directory -> package


def checkout() -> Path | None:
    """The repository this attnlab runs from (``src/attnlab`` beside ``conf/``), None when it is installed."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "conf" / "train.yaml").is_file() else None


def project_root() -> Path:
    """Where outputs go when nothing says otherwise: the checkout, else the current directory."""
    return checkout() or Path.cwd()


def config_source(directory: str) -> str:
    """Hydra's search path for ``directory`` (``conf`` or ``experiments/conf``): a path, or ``pkg://`` installed."""
    root = checkout()
    return str(root / directory) if root is not None else f"pkg://{PACKAGES[directory]}"


def config_files(directory: str) -> Path:
    """``directory``'s files on disk, for the configs read without Hydra (an evaluation suite)."""
    root = checkout()
    if root is not None:
        return root / directory
    from importlib.resources import files

    return Path(str(files(PACKAGES[directory])))


@contextmanager
def initialized(directory: str, job_name: str) -> Iterator[None]:
    """Hydra's compose API on ``directory`` (``job_name`` names the run's log file, as the console script's would)."""
    from hydra import initialize_config_dir, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    source = config_source(directory)
    if source.startswith("pkg://"):
        init = initialize_config_module(source.removeprefix("pkg://"), version_base="1.3", job_name=job_name)
    else:
        init = initialize_config_dir(source, version_base="1.3", job_name=job_name)
    with init:
        yield
