"""Where things go: outputs and the cache under the project root whichever directory a command starts from, debug
runs apart from the real ones."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from tests.conftest import CONF, ROOT


def test_paths_are_anchored_to_the_directory_that_holds_conf(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["debug=fdr"], return_hydra_config=True)
    assert cfg.paths.root_dir == str(ROOT) and cfg.paths.cache_dir == str(ROOT / ".cache" / "attnlab")
    assert cfg.experiment_name == "debug"  # debug=fdr runs go to outputs/debug/, apart from the real runs
    assert Path(cfg.hydra.run.dir).parent == Path(cfg.hydra.sweep.dir).parent == ROOT / "outputs" / "debug"
