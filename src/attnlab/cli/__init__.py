"""The console scripts: ``attnlab-train``, ``attnlab-eval`` and ``attnlab-table``, which the repository's
``train.py``, ``evaluate.py`` and ``experiments/reproduce_table.py`` call with their own config directories."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from attnlab.errors import ConfigError


def reproducible_kernels() -> None:
    """What every command does first: the CPU kernels that take the instruction set out of a seed's numbers
    (``attnlab/numerics.py``; importing attnlab leaves the process alone). A bad setting is one line."""
    from attnlab.numerics import pin_cpu_kernels

    try:
        pin_cpu_kernels()
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None


def ctrl_c_stops() -> None:
    """Ctrl-C (SIGINT) stops the command however it was started. A script's background job (``cmd &``) starts with
    SIGINT ignored and Python keeps that, so a ``kill -INT`` was ignored while the data was prepared and honoured
    once training ran (``CtrlCAtStepEnd`` installs its own handler), and the table engine's sweeps inherited it."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


@contextmanager
def one_line_errors() -> Iterator[None]:
    """A job's ``ConfigError`` or ``RunStopped`` ends the command with one line and its exit status, not a traceback
    (the library raises them); inside a ``-m`` sweep the job fails alone and the sweep's summary reports it."""
    from attnlab.run_directory import in_multirun
    from attnlab.training.guards import RunStopped

    try:
        yield
    except (ConfigError, RunStopped) as exc:
        if in_multirun():
            raise
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_status if isinstance(exc, RunStopped) else 1) from None
