"""Where the Hydra configs are: a checkout's ``conf/`` and ``experiments/conf/``, or the same files installed inside
the package (``attnlab.conf``, ``attnlab.tables.conf``: pyproject maps the directories there, one copy of each YAML).

A checkout's own directories come first, so its outputs land in the repository (``${project_root:}`` follows a
file-based config directory up to ``pyproject.toml``); an installed attnlab composes from ``pkg://``, and its outputs
land under the directory the command starts from."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# repository directory -> package
PACKAGES = {
    "conf": "attnlab.conf",
    "experiments/conf": "attnlab.tables.conf",
    "experiments/templates": "attnlab.report_templates",
}


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


def run_hydra(config_path: str, config_name: str, task: Callable[[Any], Any]) -> None:
    """``hydra.main``'s run of ``task``, with Hydra's own errors about the command line (an option or a key that
    does not exist, an override its grammar cannot read) said in one attnlab line instead of Hydra's several: Hydra
    raises them instead of printing them while ``HYDRA_FULL_ERROR`` is set, and they are all raised before the run
    directory is made."""
    import os

    import hydra
    import yaml
    from hydra.errors import ConfigCompositionException, OverrideParseException

    previous = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        hydra.main(version_base="1.3", config_path=config_path, config_name=config_name)(task)()
    except (ConfigCompositionException, OverrideParseException) as exc:
        raise SystemExit(f"error: {command_line_error(exc)}") from None
    except yaml.YAMLError as exc:  # a config file of bad syntax (or a tag Hydra's loader refuses)
        mark = getattr(exc, "problem_mark", None)
        where = f"{mark.name}, line {mark.line + 1}" if mark is not None else "a config file"
        problem = getattr(exc, "problem", None) or first_line(exc)
        raise SystemExit(f"error: {where}: not valid YAML ({problem})") from None
    finally:
        if previous is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = previous


def command_line_error(exc: Exception) -> str:
    """Hydra's message about an override as ``key: what is wrong; what is allowed``."""
    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file and exc.options:
        group, _, name = exc.missing_cfg_file.rpartition("/")
        return f"{group}: no option {name!r}; allowed: {', '.join(exc.options)}"
    if isinstance(exc, OverrideParseException):
        key, _, value = exc.override.partition("=")
        if not exc.override.isascii():
            return (
                f"{key}: Hydra's override grammar reads an unquoted value in ASCII only; quote it for Hydra inside "
                f"the shell's quotes: '{key}=\"{value}\"'"
            )
        return f"{key or exc.override}: Hydra cannot read the override {exc.override!r} ({first_line(exc)})"
    missing_key = re.match(r"Could not override '([^']+)'", str(exc))
    if missing_key:
        key = missing_key[1]
        return f"{key}: not a key of this config (a typo?); to add a new key on purpose: +{key}=<value>"
    return " ".join(str(exc).split("\nConfig search path:")[0].split())


def first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
