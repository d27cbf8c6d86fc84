"""Reproduce a paper table: ``python experiments/reproduce_table.py table=table3 scale=cpu``.

The tables are configs in experiments/conf/table/."""

import shlex
import signal
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

import attnlab.resolvers  # noqa: F401  (registers ${run_id:} and ${cell_dir:})
from attnlab.errors import ConfigError
from attnlab.tables import render, reproduce
from attnlab.tables.engine import TableInterrupted

ROOT = Path(__file__).resolve().parents[1]


@hydra.main(version_base="1.3", config_path="conf", config_name="reproduce_table")
def main(cfg: DictConfig) -> None:
    signal.signal(signal.SIGTERM, stop_on_sigterm)  # between sweeps (evaluating, writing) as during one: one line
    try:
        if cfg.render_only:
            table = OmegaConf.to_container(cfg.table, resolve=True)
            render(table, cfg.scale, results_dir=Path(cfg.results_dir), root=ROOT)
            return
        reproduce(
            OmegaConf.to_container(cfg.table, resolve=True),
            cfg.scale,
            root=ROOT,
            runs_dir=Path(cfg.runs_dir),
            results_dir=Path(cfg.results_dir),
            force=cfg.force,
            args=shlex.split(cfg.args or ""),
            launcher=shlex.split(cfg.launcher or ""),
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
    raise TableInterrupted(signal.SIGTERM)


if __name__ == "__main__":
    main()
