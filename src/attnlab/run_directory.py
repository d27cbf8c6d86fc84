"""A run's directory: where it is, who trains in it, what a refused run leaves there, and its ``results.json``.

Below everything that writes into a run directory (training, evaluation, sweeps, the table engine), so each of them
asks here and nothing here asks them.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from filelock import lock_descriptor
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from attnlab.errors import ConfigError, require
from attnlab.files import write_atomic

log = logging.getLogger(__name__)

# Inside a run directory: the latest state (always written) and the final metrics (written once, when fit ends).
LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"
RESULTS_FILE = "results.json"
JOBS_FILE = "jobs.jsonl"  # in a sweep's directory: one JSON line per job, its outcome (training.sweeps)


def output_dir(cfg: DictConfig) -> Path:
    """The run's own directory: Hydra's when running under it, else ``paths.output_dir``."""
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(cfg.paths.output_dir)


def in_multirun() -> bool:
    """True inside a Hydra ``-m`` job, where a failure must stay an exception for the sweep to record it."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


@contextmanager
def locked(path: Path, mode: str = "a+") -> Iterator[IO[str]]:
    """``path`` opened in ``mode`` (created if missing) and locked (filelock's ``lock_descriptor``: the file itself,
    so no ``.lock`` file is left beside it) until it is closed, so writers that share a file (sweep jobs,
    evaluations) take turns. A writer that replaces the file (``write_atomic``) does so while holding the lock; one
    that was waiting then finds its lock on the old file and opens the new one, so no row goes to a file that is no
    longer there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fh = path.open(mode, newline="")
        lock_descriptor(fh.fileno())
        try:
            current = path.stat().st_ino == os.fstat(fh.fileno()).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        fh.close()
    with fh:  # closing the file releases the lock
        yield fh


# run directory -> the names it held before Hydra wrote into it (recorded by ValidateBeforeWriting); a directory
# that is not here did not exist before this run
EXISTING_BEFORE: dict[str, set[str]] = {}
# run directory -> its nearest ancestor that existed before this run (the parents made for it are removed with it)
EXISTING_ANCESTOR: dict[str, Path] = {}


def record_existing(directory: Path) -> None:
    """What was there before Hydra makes ``directory`` (its entries, the ancestor it will be made under), so that a
    refused run removes what it made and nothing else."""
    resolved = directory.resolve()
    if directory.is_dir():
        EXISTING_BEFORE[str(resolved)] = {entry.name for entry in directory.iterdir()}
    EXISTING_ANCESTOR[str(resolved)] = next(parent for parent in (resolved, *resolved.parents) if parent.exists())


def remove_stub(directory: Path) -> None:
    """Remove what Hydra wrote before the task failed (``.hydra/``, the job's log), and the directory itself only
    if this run created it: a directory that was there before (a user's own, passed as ``hydra.run.dir``) keeps
    everything it held."""
    if not directory.is_dir():
        return
    before = EXISTING_BEFORE.get(str(directory.resolve()))
    created = [entry for entry in directory.iterdir() if before is None or entry.name not in before]
    if not all(entry.name == ".hydra" or (entry.is_file() and entry.suffix == ".log") for entry in created):
        return
    if before is None:
        shutil.rmtree(directory)
        remove_empty_parents(directory)
        return
    for entry in created:
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def remove_empty_parents(directory: Path) -> None:
    """The parents made for a removed run directory (``outputs/``, ``outputs/eval/``), while they are empty and below
    the nearest ancestor that existed before the run."""
    resolved = directory.resolve()
    existing = EXISTING_ANCESTOR.get(str(resolved))
    if existing is None:
        return
    for parent in resolved.parents:
        if parent == existing or not parent.is_relative_to(existing):
            return
        try:
            parent.rmdir()
        except OSError:  # not empty (another run's, a user's file) or gone: it stays
            return


def check_writable(directory: Path, key: str) -> None:
    """The run directory can be made and written (a read-only or full filesystem), found before Hydra writes its
    files there with a traceback: the directory is made, a page written, flushed and removed."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory) as probe:
            probe.write(b"\0" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        raise ConfigError(key, f"cannot write in {directory}: {exc.strerror or exc}") from None


# run directory -> an open descriptor holding its flock while this process trains in it
CLAIMED: dict[str, int] = {}


class RunDirectoryInUse(ConfigError):
    """Another process trains in the directory now: this process refuses it, and nothing there is its to remove
    (a sweep reports the job as held elsewhere, not as failed)."""


def claim_run_directory(directory: Path, key: str) -> None:
    """Hold an exclusive ``flock`` on the run directory while this process trains in it, so a second process (a
    second table sharing the cell, the same resume typed twice) is refused instead of writing into the same files.
    The kernel drops the lock when the process ends, however it ends; a claim this process holds is kept."""
    import fcntl  # not filelock's exclusive lock_descriptor: run_directory_in_use probes with a shared lock

    resolved = str(directory.resolve())
    if resolved in CLAIMED:
        return
    directory.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise RunDirectoryInUse(
            key,
            f"{directory} is in use: another process is training in it now; wait for it to end (its last.ckpt resumes "
            "it), or choose another directory",
        ) from None
    except OSError as exc:  # a filesystem without flock on directories (some NFS mounts): train unclaimed, and say so
        os.close(descriptor)
        log.warning("%s cannot be claimed (%s): two processes could train in it at once", directory, exc.strerror)
        return
    CLAIMED[resolved] = descriptor


def release_run_directory(directory: Path) -> None:
    descriptor = CLAIMED.pop(str(directory.resolve()), None)
    if descriptor is not None:
        os.close(descriptor)


def run_directory_in_use(directory: Path) -> bool:
    """Whether another process holds the directory's claim now (this one's own claims do not count)."""
    import fcntl

    if not directory.is_dir() or str(directory.resolve()) in CLAIMED:
        return False
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no flock on this filesystem: no claim can be seen either
        return False
    finally:
        os.close(descriptor)  # closing drops the shared lock just taken
    return False


def check_run_directory(directory: Path, ckpt_path: str | None) -> None:
    """A new run never writes into another run's directory: one that finished (``results.json``) or holds a run's
    checkpoints is refused, unless this run resumes from that directory's own checkpoint."""
    finished, saved = (directory / RESULTS_FILE).is_file(), (directory / LAST_CHECKPOINT).is_file()
    if not (finished or saved):
        return
    resuming_here = bool(ckpt_path) and Path(ckpt_path).resolve().is_relative_to(directory.resolve())
    what = "a finished run (results.json)" if finished else "a run's checkpoints (checkpoints/last.ckpt)"
    require(
        resuming_here,
        "hydra.run.dir",
        f"{directory} holds {what}; a new run would overwrite it. Choose another directory, or continue that run "
        f"with ckpt_path={directory / LAST_CHECKPOINT}",
    )


def write_results(path: Path, results: dict[str, Any]) -> None:
    """``results.json`` as strict JSON: a NaN or infinite number becomes null and is listed under ``non_finite``."""
    non_finite: list[str] = []

    def finite(value: Any, key: str) -> Any:
        if isinstance(value, dict):
            return {k: finite(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [finite(v, f"{key}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, float) and not math.isfinite(value):
            non_finite.append(key)
            return None
        return value

    cleaned = finite(results, "")
    if non_finite:
        cleaned["non_finite"] = non_finite
    write_atomic(path, json.dumps(cleaned, indent=2, allow_nan=False, default=str))


def read_jobs(sweep_dir: Path, sweep: str | None = None) -> list[dict[str, Any]]:
    """The outcome of every job recorded in ``sweep_dir`` (of sweep id ``sweep`` only, when given), in job order;
    for a job recorded twice (a resumed sweep), its last record. Empty when nothing was recorded."""
    path = sweep_dir / JOBS_FILE
    if not path.is_file():
        return []
    jobs = [job for line in path.read_text(errors="replace").splitlines() if (job := job_record(line)) is not None]
    if sweep is not None:
        jobs = list({job["num"]: job for job in jobs if job.get("sweep") == sweep}.values())
    return sorted(jobs, key=lambda job: job["num"])


def job_record(line: str) -> dict[str, Any] | None:
    """One line of ``jobs.jsonl`` as a record, or None for a line that is not one (a write cut by a kill, a file
    edited by hand): such a job counts as unrecorded, and its directory still says what it left."""
    try:
        job = json.loads(line)
    except ValueError:
        return None
    fields = {"num": int, "status": str, "overrides": list, "output_dir": (str, type(None))}  # None: a lost worker's
    if not isinstance(job, dict) or not all(isinstance(job.get(key), kind) for key, kind in fields.items()):
        return None
    return job


def record_job(sweep_dir: Path, record: dict[str, Any]) -> None:
    """One line of ``jobs.jsonl``, the file locked while it is written (parallel jobs share it)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with locked(sweep_dir / JOBS_FILE, "a") as fh:
        fh.write(json.dumps(record) + "\n")


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
