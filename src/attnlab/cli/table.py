"""``attnlab-table`` and ``python experiments/reproduce_table.py``: reproduce a paper table (``table=table3
scale=cpu``); the tables are configs in experiments/conf/table/."""

from __future__ import annotations

import shlex
import signal
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

import attnlab.resolvers  # noqa: F401  (registers ${run_id:} and ${cell_dir:})
from attnlab.cli import ctrl_c_stops, reproducible_kernels
from attnlab.configs import config_source, run_hydra
from attnlab.errors import ConfigError


def launcher_overrides(launcher: str | None) -> list[str]:
    """``launcher``'s words as sweep overrides; a bare name is the preset (``slurm``: ``hydra/launcher=slurm``)."""
    return [word if "=" in word else f"hydra/launcher={word}" for word in shlex.split(launcher or "")]


def task(cfg: DictConfig) -> None:
    """Runs (or, ``render_only``, writes again) the table; a bad setting or a signal ends it with one line.

    The engine is imported here, not at the top: ``--help`` and shell completion compose the config only."""
    from attnlab.tables import render, reproduce
    from attnlab.tables.engine import TableInterrupted

    signal.signal(signal.SIGTERM, stop_on_sigterm)  # between sweeps (evaluating, writing) as during one: one line
    table = OmegaConf.to_container(cfg.table, resolve=True)
    root = Path(cfg.root_dir)
    try:
        if cfg.render_only:
            render(table, cfg.scale, results_dir=Path(cfg.results_dir), root=root)
            return
        reproduce(
            table,
            cfg.scale,
            root=root,
            runs_dir=Path(cfg.runs_dir),
            results_dir=Path(cfg.results_dir),
            force=cfg.force,
            args=shlex.split(cfg.args or ""),
            launcher=launcher_overrides(cfg.launcher),
            partial=cfg.partial,
        )
    except ConfigError as exc:
        sys.exit(f"error: {exc}")
    except (KeyboardInterrupt, TableInterrupted) as exc:
        stop = exc if isinstance(exc, TableInterrupted) else TableInterrupted(signal.SIGINT)
        print(
            f"interrupted ({stop}): {cfg.table.name} at scale {cfg.scale}; finished cells are kept and a cell that was "
            "training resumes from its checkpoints/last.ckpt: run the same command again",
            file=sys.stderr,
        )
        sys.exit(stop.exit_status)


def stop_on_sigterm(_signal_number: int, _frame: object) -> None:
    from attnlab.tables.engine import TableInterrupted

    raise TableInterrupted(signal.SIGTERM)


def main(config_dir: str | None = None) -> None:
    """``config_dir``: the script's own ``experiments/conf``; by default the checkout's, else the installed one."""
    reproducible_kernels()
    ctrl_c_stops()
    source = config_dir or config_source("experiments/conf")
    run_hydra(source, "reproduce_table", task)


if __name__ == "__main__":
    main()
