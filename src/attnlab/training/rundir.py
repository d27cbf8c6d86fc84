"""Resuming into the interrupted run's own directory (``hydra.run.dir=<that run>``) loses nothing it wrote.

Lightning's CSV writer deletes an existing ``metrics.csv``; here the metrics are appended to (a step logged twice,
before the kill and after the resume, keeps both rows: the later one counts). The earlier ``.hydra/`` is kept by
``attnlab.run_directory.KeepEarlierRunConfig``.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

from attnlab.files import write_atomic


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
