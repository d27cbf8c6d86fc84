"""A variant from outside the package (``tests/fixtures/external_variant``: a package of its own with an
``attnlab.attention`` entry point), pip-installed from a temporary copy, runs in train.py, evaluation and a table with
no edit to attnlab. It is installed into a temporary target directory on ``PYTHONPATH``, which Python's entry point
discovery reads like site-packages, so the shared venv is left as it was."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MICRO_DATA, MICRO_MODEL, ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "external_variant"
QUIET = ["logger=csv", "trainer=cpu", "callbacks.progress_bar.refresh_rate=0", "print_config=false"]


def install(source: Path, tmp_path: Path) -> dict[str, str]:
    """``pip install`` the package at ``source`` (offline, no dependencies) -> the environment that sees it."""
    copy, site = tmp_path / "build" / source.name, tmp_path / "site"
    shutil.copytree(source, copy)  # pip's build writes beside the sources: never into the repository
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*pip, "--target", str(site), str(copy)], check=True, capture_output=True, timeout=300)
    paths = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return install(FIXTURE, tmp_path_factory.mktemp("plugin"))


@pytest.mark.slow
def test_an_installed_variant_is_registered_and_offered_to_hydra(plugin_env: dict[str, str]) -> None:
    code = (
        "import attnlab.resolvers\n"
        "from hydra.core.config_store import ConfigStore\n"
        "from attnlab.attention import available_attention\n"
        "print('head_scale' in available_attention(), 'head_scale.yaml' in ConfigStore.instance().repo['attention'])"
    )
    done = python(code, plugin_env)
    assert done.stdout.split() == ["True", "True"], done.stderr
    assert "head_scale" not in python(code, {**os.environ, "PYTHONPATH": ""}).stdout.split()[0]


@pytest.mark.slow
def test_an_installed_variant_trains_and_its_bad_option_is_one_line(
    plugin_env: dict[str, str], tmp_path: Path, data_cache: Path
) -> None:
    run = [sys.executable, "train.py", f"paths.cache_dir={data_cache}", *QUIET, *MICRO_MODEL, *MICRO_DATA]
    done = subprocess.run(
        [*run, "attention=head_scale", "trainer.max_steps=2", f"hydra.run.dir={tmp_path}/run"],
        cwd=ROOT,
        env=plugin_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "results.json").is_file() and (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    bad = subprocess.run(
        [*run, "attention=head_scale", "attention.init=-1", f"hydra.run.dir={tmp_path}/bad"],
        cwd=ROOT,
        env=plugin_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "error: attention.init: must be > 0, got -1" in bad.stderr


@pytest.mark.slow
def test_a_broken_plugin_is_named_and_the_other_variants_still_work(tmp_path: Path) -> None:
    broken = tmp_path / "broken_variant"
    (broken / "attnlab_broken").mkdir(parents=True)
    (broken / "attnlab_broken" / "__init__.py").write_text("raise RuntimeError('needs a GPU library')\n")
    (broken / "pyproject.toml").write_text(
        (FIXTURE / "pyproject.toml")
        .read_text()
        .replace("attnlab-head-scale", "attnlab-broken")
        .replace('head_scale = "attnlab_head_scale"', 'broken = "attnlab_broken"')
    )
    env = install(broken, tmp_path)
    done = python("from attnlab.attention import available_attention; print(len(available_attention()))", env)
    assert done.returncode == 0 and int(done.stdout) > 10
    assert "the attention plugin broken (attnlab_broken, package attnlab-broken) did not load" in done.stderr
    assert "RuntimeError: needs a GPU library" in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_an_installed_variant_runs_in_a_table_and_its_evaluation(plugin_env: dict[str, str], tmp_path: Path) -> None:
    """Table 3's smoke scale with ``variants=[vanilla,head_scale]``: trained, evaluated and compared like ours."""
    command = [
        sys.executable,
        "experiments/reproduce_table.py",
        "table=table3",
        "scale=smoke",
        "table.scales.smoke.variants=[vanilla,head_scale]",
        f"runs_dir={tmp_path}/runs",
        f"results_dir={tmp_path}/results",
        f"hydra.run.dir={tmp_path}/engine",
        f"args='paths.cache_dir={tmp_path}/cache'",
    ]
    done = subprocess.run(command, cwd=ROOT, env=plugin_env, capture_output=True, text=True, timeout=1700)
    assert done.returncode == 0, done.stderr[-3000:]
    import pandas as pd

    runs = pd.read_csv(tmp_path / "results" / "runs.csv")
    assert sorted(runs[runs["attention"] == "head_scale"]["stage"]) == ["finetune", "pretrain"]
    assert "head_scale" in (tmp_path / "results" / "table3.md").read_text()
    evaluated = list((tmp_path / "runs").glob("*head_scale*/eval/*/results.json"))
    assert len(evaluated) == 2  # pretrain and fine-tune cells, evaluated by the table's suite
