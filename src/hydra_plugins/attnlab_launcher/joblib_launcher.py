"""``hydra/launcher=joblib`` that outlives a killed job (conf/hydra/launcher/joblib.yaml).

Hydra's joblib launcher runs the jobs on loky workers; when one worker dies (the OOM killer, a SIGKILL) loky breaks
the pool, every job in flight dies with it and the launcher raises ``TerminatedWorkerError``: no other job finishes
and the sweep ends without its summary. Here the jobs that were running when a worker died are run again one at a
time, so the one that kills its worker is found: it is recorded as failed in ``jobs.jsonl`` (the sweep's summary
names it) and the others go on. A job re-run this way continues from its own ``last.ckpt`` when the sweep resumes
(``ckpt_path=${resume_ckpt:}``, as the table engine's sweeps do), so it loses at most the steps since its last save.

A SIGTERM or SIGINT to the sweep stops it as it stops a sweep run in one process: every job in flight is told
(SIGTERM in its worker: it saves its last.ckpt), no other job starts, and the sweep exits with 128 + the signal once
they have saved. Hydra's launcher died at once and left its workers training, orphaned, beside a resumed sweep.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra_plugins.hydra_joblib_launcher._core import execute_job, process_joblib_cfg
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
from joblib import Parallel, delayed
from joblib.externals.loky import get_reusable_executor
from joblib.externals.loky.process_executor import TerminatedWorkerError

from attnlab.run_directory import record_job
from attnlab.training.sweeps import SWEEP_ID

log = logging.getLogger(__name__)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_POLL_SECONDS = 0.5


def execute_marked(marker: Path | None, stop: Path, *job: Any) -> tuple[int, JobReturn | None]:
    """Hydra's ``execute_job`` in a worker, after leaving ``marker``: the launcher's record that the job started.
    None when the sweep was stopped (``stop`` exists) before the job began, or while it ran: then the job was sent
    SIGTERM (it saves its last.ckpt and records itself interrupted). (Unpickling this imports the package, which
    silences Hydra's schema-matching warning in the worker.)"""
    if stop.exists():
        return job[0], None
    if marker is not None:
        marker.touch()
    finished = threading.Event()
    threading.Thread(target=stop_when_told, args=(stop, finished), daemon=True).start()
    try:
        return job[0], execute_job(*job)
    except SystemExit:  # the job's end after the signal ("the sweep stops here"): the launcher stops the sweep
        return job[0], None
    finally:
        finished.set()


def stop_when_told(stop: Path, finished: threading.Event) -> None:
    """In a worker: SIGTERM this process (the job's training saves and stops) once the launcher writes ``stop``."""
    while not finished.wait(STOP_POLL_SECONDS):
        if stop.exists():
            os.kill(os.getpid(), signal.SIGTERM)
            return


class ResilientJoblibLauncher(JoblibLauncher):
    """Hydra's ``JoblibLauncher`` (same settings) that survives a worker's death (module docstring)."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        settings = {**self.joblib, "backend": "loky"}  # as Hydra's: its threading backend cannot run Hydra jobs
        process_joblib_cfg(settings)
        log.info("Joblib.Parallel(%s) is launching %d jobs", settings, len(job_overrides))
        for idx, overrides in enumerate(job_overrides):
            log.info("\t#%d : %s", initial_job_idx + idx, " ".join(filter_overrides(overrides)))
        jobs = {initial_job_idx + idx: list(overrides) for idx, overrides in enumerate(job_overrides)}
        returns: dict[int, JobReturn] = {}
        with tempfile.TemporaryDirectory(prefix=".started-", dir=sweep_dir) as started:
            self.stop = Path(started) / "stop"
            self.stopped_by: int | None = None
            in_main_thread = threading.current_thread() is threading.main_thread()  # only it may set handlers
            previous = {s: signal.signal(s, self.on_signal) for s in STOP_SIGNALS} if in_main_thread else {}
            try:
                pending = list(jobs)
                while pending and self.stopped_by is None:
                    suspects = self.run_jobs(pending, jobs, settings, Path(started), returns)
                    for num in suspects:  # alone, so a death is that job's own
                        if self.stopped_by is None and not self.run_alone(num, jobs[num], returns):
                            returns[num] = self.lost(num, jobs[num], sweep_dir)
                    pending = [num for num in pending if num not in returns]
            finally:
                for signal_number, handler in previous.items():
                    signal.signal(signal_number, handler)
        if self.stopped_by is not None:
            name = signal.Signals(self.stopped_by).name
            log.error("Stopped by %s: the jobs in flight saved their last.ckpt; the sweep stops here", name)
            raise SystemExit(128 + self.stopped_by)
        return [returns[num] for num in jobs]

    def on_signal(self, signal_number: int, _frame: object) -> None:
        """Tell every job in flight to save and stop, and start no other (the first signal; later ones are the same)."""
        if self.stopped_by is None:
            self.stopped_by = signal_number
            self.stop.touch()

    def calls(self, nums: list[int], jobs: dict[int, list[str]], started: Path) -> Iterator[Any]:
        """The jobs as joblib calls, until the sweep is stopped (joblib draws them as workers free up)."""
        state = Singleton.get_state()
        for num in nums:
            if self.stopped_by is not None:
                return
            marker = started / str(num)
            yield delayed(execute_marked)(
                marker, self.stop, num, jobs[num], self.hydra_context, self.config, self.task_function, state
            )

    def run_jobs(
        self, nums: list[int], jobs: dict[int, list[str]], settings: dict, started: Path, returns: dict
    ) -> list[int]:
        """Run ``nums`` in parallel into ``returns``; the jobs that were running when a worker died (else [], and
        none once the sweep is stopped: a worker told to stop outside a job's training dies of it)."""
        try:
            for num, job_return in Parallel(**settings, return_as="generator_unordered")(
                self.calls(nums, jobs, started)
            ):
                if job_return is not None:
                    returns[num] = job_return
        except TerminatedWorkerError as error:
            if self.stopped_by is not None:
                return []
            suspects = [num for num in nums if num not in returns and (started / str(num)).exists()]
            for num in suspects:
                (started / str(num)).unlink()
            log.warning("A worker died (%s); re-running job(s) %s one at a time", str(error).splitlines()[-1], suspects)
            return suspects
        return []

    def run_alone(self, num: int, overrides: list[str], returns: dict) -> bool:
        """The job on a worker of its own (joblib runs ``n_jobs=1`` in this process, where a death is the sweep's);
        False when that worker died too."""
        job = (num, overrides, self.hydra_context, self.config, self.task_function, Singleton.get_state())
        future = get_reusable_executor(max_workers=1).submit(execute_marked, None, self.stop, *job)
        try:
            job_return = future.result()[1]
        except TerminatedWorkerError:
            return self.stopped_by is not None  # told to stop: not a death of its own
        if job_return is not None:
            returns[num] = job_return
        return True

    @staticmethod
    def lost(num: int, overrides: list[str], sweep_dir: Path) -> JobReturn:
        """A job whose worker died even alone: failed in ``jobs.jsonl``; handled, so the sweep goes on."""
        error = "error: its worker process died (killed, or out of memory) even when run alone"
        log.error("Job %d (%s) failed: %s", num, " ".join(overrides), error)
        record = {"num": num, "sweep": os.environ.get(SWEEP_ID), "overrides": overrides, "output_dir": None}
        record_job(sweep_dir, record | {"status": "failed", "error": error})
        return JobReturn(overrides=overrides, status=JobStatus.COMPLETED)
