"""Shared fixtures. The hub is never reached from tests: offline mode is set before any HF import."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

import attnlab.resolvers  # noqa: F401
from attnlab.numerics import pin_cpu_kernels

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
USER_THREADS = {name: os.environ.get(name) for name in THREAD_VARIABLES}


def share_cores_among_workers() -> None:
    """Under pytest-xdist (`make test` runs one worker per core) each worker and the commands it starts get their share
    of the cores: torch's default of a thread per core in every worker oversubscribes the machine, and a training run
    then slows ~4x (measured on 2 cores)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers:
        return
    threads = max(1, len(os.sched_getaffinity(0)) // int(workers))
    os.environ.update(dict.fromkeys(THREAD_VARIABLES, str(threads)))
    import torch

    torch.set_num_threads(threads)


def user_environment() -> dict[str, str]:
    """The environment a user's shell gives a command: the thread settings as they were before the workers' share, for
    the tests whose numbers depend on the summation order a thread count sets (`make train`'s recorded perplexity)."""
    environment = dict(os.environ)
    for name, value in USER_THREADS.items():
        environment.pop(name, None)
        if value is not None:
            environment[name] = value
    return environment


pin_cpu_kernels()  # the numbers the commands give (importing attnlab does not pin them): before any torch operation
share_cores_among_workers()

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def long_modules_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The modules holding a `long` test, then the rest, each in collection order: `make test-slow` hands whole
    modules to its workers in this order, and a test of ten minutes started last keeps one worker busy long after the
    other has finished (CI's slow suite ended on `make train`'s numbers test, alone, for ~17 minutes)."""
    long_modules = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("long")}
    return sorted(items, key=lambda item: item.nodeid.split("::")[0] not in long_modules)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items[:] = long_modules_first(items)


# A model small enough that a CPU step takes milliseconds.
MICRO_MODEL = ["model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=64"]
MICRO_DATA = ["data.block_size=32", "data.batch_size=4", "data.tokenizer_vocab_size=512"]


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One corpus/tokenizer/blocks cache for the whole session, so the embedded corpus is prepared once."""
    return tmp_path_factory.mktemp("attnlab-cache")


@pytest.fixture
def registry_corpus(monkeypatch: pytest.MonkeyPatch) -> str:
    """A stand-in fingerprint of data=registry_text's corpus, whose content names its cells: naming a cpu_long or gpu
    grid then needs no built corpus (a fresh clone has none, and building it downloads packages)."""
    import attnlab.data.registry

    monkeypatch.setattr(attnlab.data.registry, "corpus_fingerprint", lambda cache_dir: "0123456789ab")
    return "0123456789ab"


def compose_config(overrides: list[str], output_dir: Path, cache_dir: Path) -> DictConfig:
    """Compose conf/train.yaml as ``python train.py <overrides>`` would, with outputs under ``output_dir``."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.paths.log_dir = str(output_dir)
        cfg.paths.cache_dir = str(cache_dir)
        cfg.paths.root_dir = str(ROOT)
        cfg.hydra.runtime.output_dir = str(output_dir)
        cfg.hydra.runtime.cwd = str(ROOT)
        cfg.hydra.job.num = 0
    HydraConfig().set_config(cfg)
    return cfg


@pytest.fixture
def make_config(tmp_path: Path, data_cache: Path):
    """``make_config([...overrides])`` -> a composed config writing into this test's tmp dir."""

    def make(overrides: list[str], output_dir: Path | None = None) -> DictConfig:
        return compose_config(overrides, output_dir or tmp_path / "run", data_cache)

    return make


@pytest.fixture(scope="session")
def wiki_docs() -> list[dict[str, str]]:
    """A dozen real articles from the embedded corpus (parsing stops early)."""
    from itertools import islice

    from attnlab.data.corpus import wiki_sample_documents

    return list(islice(wiki_sample_documents(), 12))


def save_run_checkpoint(model, tokenizer, path: Path) -> Path:
    """``model`` saved as training saves it (the Lightning layout with attnlab's record), without a training run."""
    from dataclasses import asdict

    import torch

    from attnlab.models.checkpoint import RECORD_KEY, record
    from attnlab.validation import OptimSpec

    spec = {
        "model": model.config.to_dict(),
        "model_request": model.config.to_dict(),
        "attention": dict(model.attention_config),
        "optim": asdict(OptimSpec()),
        "schedule_steps": 1,
    }
    state = {f"model.{key}": value for key, value in model.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": state, "global_step": 0, RECORD_KEY: record(spec, tokenizer, {})}, path)
    return path
