"""The command lines' own refusals: Hydra's errors about an override (an option, a key, a value its grammar cannot
read) are one attnlab line, and a refused command leaves nothing under the outputs, its parents included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

QUICK = ["trainer=cpu", "model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=64"]
REFUSALS = [  # (script, overrides, the one line)
    ("train.py", ["attention=nosuch"], "error: attention: no option 'nosuch'; allowed: clipped_softmax, diff"),
    (
        "train.py",
        ["nosuchkey=1"],
        "error: nosuchkey: not a key of this config (a typo?); to add a new key on purpose: +nosuchkey=<value>",
    ),
    (
        "train.py",
        ["experiment_name=été"],
        "error: experiment_name: Hydra's override grammar reads an unquoted value in ASCII only; quote it for Hydra "
        "inside the shell's quotes: 'experiment_name=\"été\"'",
    ),
    ("train.py", ["experiment_name=" + "a" * 300], "error: experiment_name: at most 200 bytes (a directory name)"),
    ("train.py", ["data.block_size=512"], "error: data.block_size: 512 exceeds the model's context"),
    ("train.py", ["data.num_workers=abc"], "error: data.num_workers: must be int, got 'abc'"),
    (
        "train.py",
        ["eval=quick", "eval.after_train=true", "eval.tasks=[nosuch_task]", "print_config=false"],
        "error: eval.tasks: 'nosuch_task': no such task in lm-eval's registry",
    ),
    ("evaluate.py", ["eval=nosuch"], "error: eval: no option 'nosuch'; allowed:"),
    ("experiments/reproduce_table.py", ["table=nosuch"], "error: table: no option 'nosuch'; allowed: gating"),
]


@pytest.mark.parametrize(("script", "overrides", "line"), REFUSALS, ids=[" ".join(r[1])[:40] for r in REFUSALS])
@pytest.mark.slow
def test_a_refused_command_is_one_line_and_leaves_nothing(
    script: str, overrides: list[str], line: str, tmp_path: Path
) -> None:
    outputs = tmp_path / "outputs"
    paths = [f"paths.log_dir={outputs}"] if script != "experiments/reproduce_table.py" else []
    refused = run(script, *(QUICK if script == "train.py" else []), *overrides, *paths)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), refused.stderr[-2000:]
    assert not outputs.exists()


def test_a_quoted_non_ascii_experiment_name_is_a_directory_name(tmp_path: Path) -> None:
    """Quoted for Hydra, a name in another script is allowed (the check is the directory name's)."""
    from attnlab.validation import check_common
    from tests.conftest import compose_config

    check_common(compose_config(['experiment_name="été-1"'], tmp_path, tmp_path))


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, script, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
    )
