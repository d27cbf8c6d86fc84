"""A run directory is trained in by one process at a time: a second process (the same resume typed twice, two tables
sharing a cell) is refused in one line, and the table engine waits for a cell another process is training."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnlab.errors import ConfigError
from attnlab.run_directory import claim_run_directory, release_run_directory, run_directory_in_use
from attnlab.tables.engine import Cell, wait_while_trained_elsewhere
from tests.conftest import ROOT
from tests.reliability import train_command


def hold(directory: Path, seconds: float) -> subprocess.Popen:
    """Another process that claims ``directory`` for ``seconds`` (it prints once it holds the claim)."""
    code = (
        "import sys, time; from pathlib import Path; from attnlab.run_directory import claim_run_directory; "
        f"claim_run_directory(Path({str(directory)!r}), 'hydra.run.dir'); print('held', flush=True); "
        f"time.sleep({seconds})"
    )
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_directory_another_process_trains_in_is_refused_until_it_ends(tmp_path: Path) -> None:
    other = hold(tmp_path / "run", 60)
    try:
        assert run_directory_in_use(tmp_path / "run")
        with pytest.raises(ConfigError, match=r"^hydra.run.dir: .* is in use: another process is training in it now"):
            claim_run_directory(tmp_path / "run", "hydra.run.dir")
    finally:
        other.kill()  # however it ends, the kernel drops its lock
        other.wait()
    assert not run_directory_in_use(tmp_path / "run")
    claim_run_directory(tmp_path / "run", "hydra.run.dir")
    claim_run_directory(tmp_path / "run", "hydra.run.dir")  # this process's own claim is kept, not refused
    assert not run_directory_in_use(tmp_path / "run")  # nor counted as another's
    release_run_directory(tmp_path / "run")


def test_the_engine_waits_for_a_cell_another_process_trains(tmp_path: Path) -> None:
    cell = Cell("pretrain", "GPT2", "tiny", "vanilla", 1, tmp_path / "cell", (), "")
    other = hold(cell.directory, 1.5)
    started = time.monotonic()
    wait_while_trained_elsewhere([cell], poll_seconds=0.1)
    assert time.monotonic() - started > 0.5 and not run_directory_in_use(cell.directory)
    other.wait()
    wait_while_trained_elsewhere([cell], poll_seconds=0.1)  # a free cell: no wait


@pytest.mark.slow
def test_the_same_resume_typed_twice_is_refused_while_the_first_trains(tmp_path: Path, data_cache: Path) -> None:
    run_dir = tmp_path / "run"
    steps = "trainer.max_steps=100000"  # the first still trains when stopped, however slowly the second starts
    first = subprocess.Popen(
        train_command([steps], run_dir, data_cache),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        for line in first.stdout:
            if "Saved step 4" in line:
                break
        resume = [f"ckpt_path={run_dir}/checkpoints/last.ckpt", steps]
        second = subprocess.run(
            train_command(resume, run_dir, data_cache), cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert second.returncode == 1
        assert second.stderr.strip().startswith(f"error: hydra.run.dir: {run_dir} is in use"), second.stderr[-2000:]
        assert "Traceback" not in second.stderr
        assert not (run_dir / ".hydra-1").exists()  # it wrote nothing, not even a copy of its config
    finally:
        first.terminate()
        output, _ = first.communicate(timeout=120)
    assert first.returncode == 143, output[-2000:]  # stopped by SIGTERM inside fit: its checkpoint saved


def test_a_filesystem_without_flock_trains_unclaimed_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Some NFS mounts refuse flock on a directory: a cluster run must still train, with a warning, not fail."""
    import errno
    import fcntl

    def unsupported(*_args: object) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", unsupported)
    with caplog.at_level("WARNING"):
        claim_run_directory(tmp_path / "run", "hydra.run.dir")
    assert "cannot be claimed (No locks available)" in caplog.text
    assert not run_directory_in_use(tmp_path / "run")
    release_run_directory(tmp_path / "run")  # nothing held: a no-op
