"""Start-up cost of the console scripts: ``--help`` (and shell completion, which composes the same config on every
TAB) must not pay for torch or Lightning where it can avoid them. CPU time is measured as a ratio to
``python -c "import hydra"`` in the same test, so a slower or busier machine does not change the verdict."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

BIN = Path(sys.executable).parent
# main's ratios before the lazy imports: train/eval/table ~48 (Lightning through Hydra's plugin discovery), compare ~14
HELP_RATIO = {"attnlab-train": 35, "attnlab-eval": 35, "attnlab-table": 35, "attnlab-compare": 8}


def child_cpu_seconds(command: list[str]) -> float:
    """User plus system CPU time of one child process (all its threads)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, capture_output=True, check=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


@pytest.mark.parametrize("script", sorted(HELP_RATIO))
@pytest.mark.slow
def test_help_costs_a_few_imports_of_hydra(script: str) -> None:
    if not (BIN / script).is_file():
        pytest.skip(f"{script} is not installed beside {sys.executable}")
    hydra = min(child_cpu_seconds([sys.executable, "-c", "import hydra"]) for _ in range(3))
    help_cpu = min(child_cpu_seconds([str(BIN / script), "--help"]) for _ in range(2))
    ratio = help_cpu / hydra
    assert ratio < HELP_RATIO[script], (
        f"{script} --help: {help_cpu:.2f} s CPU, {ratio:.1f}x `import hydra` ({hydra:.2f} s)"
    )


@pytest.mark.parametrize(
    "module",
    [
        "hydra_plugins.attnlab_launcher.joblib_launcher",
        "hydra_plugins.attnlab_launcher.slurm_launcher",
        "attnlab.compare",
    ],
)
def test_what_every_command_imports_leaves_torch_and_lightning_out(module: str) -> None:
    """Hydra's plugin discovery imports our launchers on every command, ``--help`` included."""
    code = f"import sys, {module}; print(sorted({{'torch', 'lightning'}} & set(sys.modules)))"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert imported == "[]", f"importing {module} imports {imported}"


@pytest.mark.parametrize("module", ["attnlab.compare", "attnlab.report"])
def test_the_argparse_commands_say_their_version(module: str, capsys: pytest.CaptureFixture) -> None:
    import importlib
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        importlib.import_module(module).main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"attnlab {version('attnlab')}\n"


@pytest.mark.parametrize(
    ("script", "override", "key"),
    [
        ("train.py", "optim.lr=abc", "optim.lr"),
        ("train.py", "model.n_head=5", "model.n_embd"),
        ("evaluate.py", "batch_size=0", "batch_size"),
    ],
)
@pytest.mark.slow
def test_a_bad_value_is_refused_before_lightning_is_imported(
    script: str, override: str, key: str, tmp_path: Path
) -> None:
    """A refusal costs ~2 s, not Lightning's import (~5 s more): the callbacks Hydra starts every run with and the
    checks of plain values import none of it; only a value whose check needs a class (data, callbacks) does."""
    argv = [script, override, f"hydra.run.dir={tmp_path}/run", f"paths.log_dir={tmp_path}/outputs"]
    code = (
        f"import runpy, sys\nsys.argv = {argv!r}\ntry:\n    runpy.run_path({script!r}, run_name='__main__')\n"
        "except SystemExit as exc:\n    print(str(exc).split(':')[0:2], 'lightning' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.stdout.strip() == f"['error', ' {key}'] False", done.stdout + done.stderr[-2000:]
