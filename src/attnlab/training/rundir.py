"""Resuming into the interrupted run's own directory (``hydra.run.dir=<that run>``) loses nothing it wrote.

Lightning's CSV writer deletes an existing ``metrics.csv`` and Hydra overwrites ``.hydra/``; here the metrics
are appended to (a step logged twice, before the kill and after the resume, keeps both rows: the later one
counts) and the earlier ``.hydra/`` is kept as ``.hydra-1/``, ``.hydra-2/``, ...
"""

from __future__ import annotations

import csv
import io
import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from omegaconf import DictConfig, OmegaConf

from attnlab.files import write_atomic

log = logging.getLogger(__name__)


class _AppendingWriter(ExperimentWriter):
    """Continue an existing ``metrics.csv`` (its columns first) instead of deleting it; a new column replaces the
    file whole (Lightning rewrites it in place, which a kill at that moment would leave cut short)."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as fh:
                self.metrics_keys = list(csv.DictReader(fh).fieldnames or [])

    def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
        with open(self.metrics_file_path, newline="") as fh:
            reader = csv.DictReader(fh)
            rows, header = list(reader), list(reader.fieldnames or [])
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
        try:
            write_atomic(Path(self.metrics_file_path), text.getvalue())
        except BaseException:
            self.metrics_keys = header  # the file kept its columns: the next save adds the new ones again
            raise


class ResumableCSVLogger(CSVLogger):
    """Lightning's ``CSVLogger`` that appends to the metrics of an earlier part of the same run."""

    @property
    @rank_zero_experiment
    def experiment(self) -> _AppendingWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment


class KeepEarlierRunConfig(Callback):
    """Hydra callback: before Hydra writes ``.hydra/`` into a directory that has one, move the old one aside."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.output_subdir is None:  # nothing will be written: e.g. a DDP rank > 0 Lightning started
            return  # in rank 0's directory (hydra.output_subdir=null), whose .hydra/ is this run's own
        saved = Path(OmegaConf.select(config, "hydra.run.dir")) / config.hydra.output_subdir
        if not (saved / "config.yaml").is_file():
            return
        part = next(n for n in range(1, 10_000) if not saved.with_name(f"{saved.name}-{n}").exists())
        saved.rename(saved.with_name(f"{saved.name}-{part}"))
        log.info("Run directory already used: its earlier config is kept in %s-%d", saved, part)
