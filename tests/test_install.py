"""``pip install .`` gives a working tool: the wheel carries the code, conf/ and experiments/conf/ (one copy each,
mapped into the package by pyproject), and its console scripts write under the current directory's outputs/."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path

import pytest
from setuptools import find_namespace_packages

from tests.conftest import MICRO_DATA, MICRO_MODEL, ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
PYPROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_the_wheel_lists_every_package_and_maps_the_config_directories() -> None:
    """Packages are listed (find cannot map conf/ into attnlab), so a new one under src/ has to join the list."""
    mapped = {name for name in PYPROJECT["package-dir"] if name}
    assert set(PYPROJECT["packages"]) == set(find_namespace_packages("src")) | mapped
    for package, directory in PYPROJECT["package-dir"].items():
        assert package == "" or (ROOT / directory / "__init__.py").is_file()  # Hydra's pkg:// wants a package
        if package not in ("", "attnlab.report_templates"):
            assert PYPROJECT["package-data"][package] == ["**/*.yaml"]
    assert PYPROJECT["package-data"]["attnlab.report_templates"] == ["*.j2"]


@pytest.mark.slow
def test_the_installed_tool_trains_evaluates_and_lists_tables_from_an_empty_directory(
    tmp_path: Path, data_cache: Path
) -> None:
    wheels, env_dir, work = tmp_path / "wheels", tmp_path / "venv", tmp_path / "work"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels)]
    source = tmp_path / "source"  # the files the wheel is built from, so the build leaves nothing in the checkout
    for name in ("pyproject.toml", "README.md", "LICENSE", "src", "conf", "experiments/conf", "experiments/templates"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-r", str(ROOT / name), str(source / name)], check=True)
    subprocess.run([*build, str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("attnlab-*.whl")

    venv.create(env_dir, with_pip=False)  # offline: the dependencies are this interpreter's, attnlab the wheel's
    bin_dir = env_dir / "bin"
    site = Path(sysconfig.get_path("purelib", vars={"base": str(env_dir), "platbase": str(env_dir)}))
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    install = [str(bin_dir / "python"), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)]
    subprocess.run(install, check=True, capture_output=True, env=env, timeout=300)
    work.mkdir()

    def run(*command: str) -> str:
        done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    where = run(
        str(bin_dir / "python"), "-c", "import attnlab, attnlab.configs as c; print(attnlab.__file__, c.checkout())"
    )
    assert where.split() == [str(site / "attnlab" / "__init__.py"), "None"]

    quiet = ["logger=csv", "trainer=cpu", "callbacks.progress_bar.refresh_rate=0", "print_config=false"]
    tiny = [*MICRO_MODEL, "model.block_size=256", *MICRO_DATA, "trainer.max_steps=3", "trainer.limit_val_batches=2"]
    run("attnlab-train", *quiet, *tiny, f"paths.cache_dir={data_cache}")
    (trained,) = (work / "outputs" / "default").iterdir()
    assert (trained / "train.log").is_file() and (trained / "checkpoints" / "last.ckpt").is_file()

    passkey = ["eval.passkey.context_lengths=[200]", "eval.passkey.samples_per_length=2"]
    checkpoint = f"ckpt_path={trained / 'checkpoints' / 'last.ckpt'}"
    shown = run("attnlab-eval", checkpoint, "eval=quick", "limit=2", *passkey, f"paths.cache_dir={data_cache}")
    assert "heldout_word_ppl" in shown
    (evaluation,) = (work / "outputs" / "eval").glob("*/results.json")
    assert evaluation.parent.joinpath("evaluate.log").is_file()
    assert sorted(p.name for p in work.iterdir()) == ["outputs"]  # nothing beside outputs/, nothing in site-packages
    assert not (site / "outputs").exists() and not (site / "attnlab" / "outputs").exists()

    listed = run("attnlab-table", "--help")
    assert (
        "table: gating, outliers, pruning, table3" in listed
        and "table_protocol: bigram_backcopy, cpu_long, from_scratch" in listed
    )
    assert "model: gpt2" in run("attnlab-train", "--help")

    # attnlab-report: the committed table3 as a table's results in this directory, its pages from the package's
    # templates and its cells' configs composed from the package's table configs
    assert run("attnlab-report", "--version").strip() == f"attnlab {PYPROJECT_VERSION}"
    results = work / "experiments" / "results"
    results.mkdir(parents=True)
    subprocess.run(["cp", "-r", str(ROOT / "experiments/results/table3"), str(results)], check=True)
    assert "report: " in run("attnlab-report")
    page = (work / "outputs" / "report" / "table3-cpu.html").read_text()
    assert "configs/table3-cpu/" in page and (work / "outputs" / "report" / "configs" / "table3.yaml").is_file()
