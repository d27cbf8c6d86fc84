"""``hydra/launcher=slurm``: Hydra's submitit launcher with its resources taken from the trainer, and one owner of
requeue (conf/hydra/launcher/slurm.yaml).

One SLURM job per sweep point, ``trainer.num_nodes`` nodes of ``trainer.devices`` tasks each, every rank started by
``srun`` (so Lightning's ``SLURMEnvironment`` gives the ranks and no subprocess launcher re-runs the command);
rank 0 alone writes the job's ``.hydra/``, its log and its line in ``jobs.jsonl``. Resources that disagree with the
trainer (Lightning would hang waiting for ranks, or fail on the nodes) are refused in one line before anything is
submitted.

Requeue has one owner, SLURM: the job never requeues itself through submitit's checkpointing (which exits in the
middle of a step) nor through Lightning's auto-requeue (which saves an ``hpc_ckpt`` the next start would not look
for). SLURM requeues a job when it is preempted (``PreemptMode=REQUEUE``), when an admin runs ``scontrol requeue``,
and, at ``signal_delay_s`` before the time limit, when rank 0 receives the warning signal and asks it to. Each way
the ranks get SIGTERM, save ``last.ckpt`` at the end of the running step and exit; SLURM starts the job again and
it resumes from that checkpoint (``ckpt_path=${resume_ckpt:}``). A job started more than ``max_requeues`` times
over is refused, so the sweep's summary names it instead of it dying forever.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides, run_job, setup_globals
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import DictConfig, OmegaConf, open_dict

from attnlab.errors import ConfigError
from attnlab.run_directory import record_job
from attnlab.slurm import IN_LAUNCHED_JOB, TERMINATED, resource_mismatch
from attnlab.training.sweeps import SWEEP_ID

log = logging.getLogger(__name__)

WARNING_SIGNAL = signal.SIGUSR2  # submitit's --signal=USR2@<signal_delay_s>: the time limit is near


def requeue_this_job() -> None:
    """Ask SLURM to requeue this job (rank 0, on the time-limit warning): SLURM then sends the ranks SIGTERM."""
    job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if job else os.environ["SLURM_JOB_ID"]
    log.warning("Time limit near: asking SLURM to requeue job %s (it saves last.ckpt on the SIGTERM that follows)", job)
    subprocess.run(["scontrol", "requeue", job], check=False)


class RequeueLimit:
    """The task of a job started more than ``max_requeues`` times over: fails with one line, trains nothing."""

    def __init__(self, restarts: int, max_requeues: int) -> None:
        self.restarts, self.max_requeues = restarts, max_requeues

    def __call__(self, cfg: DictConfig) -> None:
        raise ConfigError(
            "hydra.launcher.max_requeues",
            f"SLURM job {os.environ.get('SLURM_JOB_ID')} was requeued {self.restarts} times, more than the "
            f"{self.max_requeues} allowed; its last.ckpt is kept: run the sweep again to resume it",
        )


class AttnlabSlurmLauncher(SlurmLauncher):
    """Hydra's ``SlurmLauncher`` (same settings, plus ``max_requeues``), checked against the trainer, one writer per
    job, SLURM as the one owner of requeue (module docstring)."""

    def __init__(self, max_requeues: int = 3, **params: Any) -> None:
        super().__init__(**params)
        if not isinstance(max_requeues, int) or max_requeues < 0:
            raise SystemExit(f"error: hydra.launcher.max_requeues: an integer >= 0, got {max_requeues!r}")
        self.max_requeues = max_requeues

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        assert self.config is not None and self.hydra_context is not None
        for overrides in job_overrides:  # each job's trainer: a sweep may vary the devices
            job_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            mismatch = resource_mismatch(self.params, job_config.trainer)
            if mismatch:
                raise SystemExit(f"error: {mismatch}")
        with open_dict(self.config):  # resolved here: its ${run_id:} would be each job's own in the job
            self.config.hydra.sweep.dir = str(self.config.hydra.sweep.dir)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        nums = range(initial_job_idx, initial_job_idx + len(job_overrides))
        state = Singleton.get_state()
        calls = []
        for num, overrides in zip(nums, job_overrides, strict=True):
            log.info("\t#%d : %s", num, " ".join(filter_overrides(overrides)))
            calls.append((list(overrides), "hydra.sweep.dir", num, f"job_id_for_{num}", state))
        jobs = self.executor().map_array(self, *zip(*calls, strict=True))
        returns: list[JobReturn] = []
        for num, overrides, job in zip(nums, job_overrides, jobs, strict=True):
            try:
                returns.append(job.results()[0])
            except (submitit.core.utils.FailedJobError, submitit.core.utils.UncompletedJobError) as exc:
                returns.append(self.lost(num, list(overrides), sweep_dir, job, exc))
        return returns

    def executor(self) -> Any:
        """submitit's SLURM executor with the launcher's settings, as Hydra's launcher builds it."""
        import submitit

        params = dict(self.params)
        executor = submitit.AutoExecutor(
            cluster="slurm", folder=params.pop("submitit_folder"), slurm_max_num_timeout=params.pop("max_num_timeout")
        )
        common = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{key if key in common else f"slurm_{key}": value for key, value in params.items()})
        return executor

    @staticmethod
    def lost(num: int, overrides: list[str], sweep_dir: Path, job: Any, exc: Exception) -> JobReturn:
        """A job that ended outside its Hydra task (killed, cancelled, out of time): failed in ``jobs.jsonl``, with
        the file its errors went to; handled, so the sweep's summary names it."""
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        error = f"error: SLURM job {job.job_id} ended without a result ({reason}); its log: {job.paths.stderr}"
        log.error("Job %d (%s) failed: %s", num, " ".join(overrides), error)
        record = {"num": num, "sweep": os.environ.get(SWEEP_ID), "overrides": overrides, "output_dir": None}
        record_job(sweep_dir, record | {"status": "failed", "error": error})
        return JobReturn(overrides=overrides, status=JobStatus.COMPLETED)

    def __call__(
        self,
        sweep_overrides: list[str],
        job_dir_key: str,
        job_num: int,
        job_id: str,
        singleton_state: dict[type, Singleton],
    ) -> JobReturn:
        """One rank of the job, in SLURM (Hydra's own, but for the rank's overrides, the signal and the bound)."""
        import submitit

        assert self.hydra_context is not None and self.config is not None and self.task_function is not None
        environment = submitit.JobEnvironment()
        rank = environment.global_rank
        IN_LAUNCHED_JOB.set()  # Lightning's auto-requeue off (attnlab.slurm.cluster_plugins)
        if rank == 0:  # replaces submitit's checkpoint-and-requeue, which would exit in the middle of a step
            signal.signal(WARNING_SIGNAL, lambda _signal, _frame: requeue_this_job())
        else:  # rank 0 writes .hydra/, its log and jobs.jsonl (as Lightning's own launcher does for its ranks)
            sweep_overrides = [*sweep_overrides, "hydra.output_subdir=null", f"hydra.job.name=train_ddp_process_{rank}"]
            signal.signal(WARNING_SIGNAL, signal.SIG_IGN)
        Singleton.set_state(singleton_state)
        setup_globals()
        sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, sweep_overrides)
        with open_dict(sweep_config.hydra.job):
            sweep_config.hydra.job.id = environment.job_id
            sweep_config.hydra.job.num = job_num
        restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        task = RequeueLimit(restarts, self.max_requeues) if restarts > self.max_requeues else self.task_function
        # SLURM's SIGTERM: requeued (or cancelled); Lightning calls this handler beside its own
        signal.signal(signal.SIGTERM, lambda signal_number, _frame: TERMINATED.append(signal_number))
        job_return = run_job(
            hydra_context=self.hydra_context,
            task_function=task,
            config=sweep_config,
            job_dir_key=job_dir_key,
            job_subdir_key="hydra.sweep.subdir",
        )
        if TERMINATED:  # however the run ended then (W&B's service gets the signal too): no result, so the launcher
            raise SystemExit(128 + signal.SIGTERM)  # waits for the job's next start, which resumes from last.ckpt
        return job_return
