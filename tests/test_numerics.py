"""The CPU kernels a seed's numbers depend on are pinned (attnlab/numerics.py), so the same seed gives the same
numbers on every x86-64 CPU with AVX2 (the README's `make train` perplexity on AVX-512 and AVX2-only machines)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from attnlab import numerics
from attnlab.errors import ConfigError
from tests.conftest import ROOT

PORTABLE = numerics.platform.machine().lower() in ("x86_64", "amd64") and numerics.cpu_has_avx2()
needs_avx2 = pytest.mark.skipif(not PORTABLE, reason="pinning applies to x86-64 CPUs with AVX2 only")


@pytest.fixture
def x86_with_avx2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(numerics.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(numerics, "cpu_has_avx2", lambda: True)


def test_pins_both_libraries_unless_the_user_chose(x86_with_avx2: None) -> None:
    environ: dict[str, str] = {}
    assert numerics.pin_cpu_kernels(environ) == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}
    assert environ == numerics.PINNED
    environ = {"MKL_CBWR": "COMPATIBLE"}  # the user's own setting wins
    assert numerics.pin_cpu_kernels(environ) == {"ATEN_CPU_CAPABILITY": "avx2"}
    assert environ["MKL_CBWR"] == "COMPATIBLE"
    environ = {numerics.SETTING: "native"}
    assert numerics.pin_cpu_kernels(environ) == {} and environ == {numerics.SETTING: "native"}


def test_nothing_is_pinned_where_avx2_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(numerics.platform, "machine", lambda: "aarch64")
    assert numerics.pin_cpu_kernels({}) == {}
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse sse2 avx\n")
    assert not numerics.cpu_has_avx2(cpuinfo)
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n")
    assert numerics.cpu_has_avx2(cpuinfo)


def test_the_processor_model_is_read_from_the_first_cpu(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    first = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n"
    cpuinfo.write_text(first + "\nprocessor\t: 1\nvendor_id\t: GenuineIntel\n")
    assert numerics.cpu_identity(cpuinfo) == "AuthenticAMD family 25 model 17"
    cpuinfo.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")  # an Arm CPU names no vendor_id
    assert numerics.cpu_identity(cpuinfo) == "unknown"
    assert numerics.cpu_identity(tmp_path / "absent") == "unknown"


def test_a_bad_choice_names_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"^ATTNLAB_CPU_KERNELS: got 'fast'; allowed: portable, native$"):
        numerics.pin_cpu_kernels({numerics.SETTING: "fast"})


def fresh_process(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")} | env
    return subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120)


def test_importing_attnlab_leaves_the_process_environment_alone() -> None:
    """A library changes nothing on import: not the kernels of the user's process and its children, and a bad
    ``ATTNLAB_CPU_KERNELS`` (read by the commands) is no error here."""
    code = "import os; before = dict(os.environ); import attnlab, attnlab.api; print(dict(os.environ) == before)"
    done = fresh_process(code, ATTNLAB_CPU_KERNELS="fast")
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]


@pytest.mark.slow
def test_a_command_with_a_bad_choice_stops_with_one_line() -> None:
    environ = os.environ | {numerics.SETTING: "fast"}
    done = subprocess.run([sys.executable, "train.py"], cwd=ROOT, env=environ, capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip() == "error: ATTNLAB_CPU_KERNELS: got 'fast'; allowed: portable, native"


@needs_avx2
@pytest.mark.slow
def test_the_commands_pin_the_kernels_after_importing_their_modules() -> None:
    """The entry point's module imports torch and attnlab; the pin at the start of ``main`` still comes before the
    first kernel, so the command's kernels are the pinned ones. A plain ``import attnlab`` keeps torch's choice."""
    capability = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    pinned = fresh_process(f"import attnlab.cli.train; attnlab.cli.reproducible_kernels(); {capability}")
    assert pinned.stdout.strip() == "AVX2", pinned.stderr[-2000:]
    native = fresh_process(f"import attnlab.cli.train; {capability}").stdout.strip()
    assert native in ("AVX2", "AVX512")  # the widest this CPU has
    assert fresh_process(f"import attnlab; attnlab.pin_cpu_kernels(); {capability}").stdout.strip() == "AVX2"


@pytest.mark.slow
@needs_avx2
@pytest.mark.skipif("avx512f" not in Path("/proc/cpuinfo").read_text(), reason="needs a CPU with AVX-512")
def test_native_kernels_change_the_numbers_and_the_pin_fixes_them(tmp_path: Path) -> None:
    """On an AVX-512 CPU, `make train`'s model trained 40 steps of 2 blocks already logs different losses with the
    native and the pinned kernels (from step 4 on, measured on a 2-core Xeon; at 8 blocks a step, from step 11), while
    two pinned runs, one with MKL told to use only AVX2 (as on an AVX2-only CPU), log the same losses to the last bit.
    (2 blocks a step and one validation batch: the test took 79 s here where 8 blocks and 4 batches took 187 s.)"""

    def losses(name: str, **env: str) -> list[float]:
        environ = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")} | env
        command = [sys.executable, "train.py", "trainer=cpu", "trainer.max_steps=40", "trainer.log_every_n_steps=1"]
        command += ["trainer.limit_val_batches=1", "data.batch_size=2", "print_config=false"]
        command += ["callbacks.progress_bar.refresh_rate=0"]
        command += [f"hydra.run.dir={tmp_path}/{name}", f"paths.cache_dir={tmp_path}/cache"]
        done = subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        logged = pd.read_csv(tmp_path / name / "csv" / "metrics.csv")
        return logged["train/loss"].dropna().tolist()

    pinned = losses("pinned")
    assert len(pinned) == 40
    assert losses("pinned-mkl-avx2-only", MKL_ENABLE_INSTRUCTIONS="AVX2") == pinned
    assert losses("native", ATTNLAB_CPU_KERNELS="native") != pinned


def test_a_runs_record_names_the_code_it_ran() -> None:
    """results.json's commit (of this clone, ``+dirty`` with uncommitted changes) and package versions: what the
    table's as-run lines (cells.jsonl) carry for each cell."""
    import re

    from attnlab.numerics import code_record

    record = code_record()
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", record["commit"]) and record["attnlab"]
    assert record["packages"]["lightning"] and record["packages"]["hydra-core"]
