"""Every option of every config group composes, resolves and builds what it names."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ThroughputMonitor
from omegaconf import OmegaConf

from attnlab.attention import available_attention, resolve_options
from attnlab.models import ModelConfig
from tests.conftest import CONF, ROOT

GROUPS = ["model", "attention", "data", "trainer", "logger", "callbacks", "paths", "hydra", "experiment", "debug"]


def options(group: str) -> list[str]:
    """The group's options: its YAML files; attention's are generated from the variant registry."""
    if group == "attention":
        return available_attention()
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_every_group_has_options() -> None:
    for group in GROUPS:
        assert options(group), f"conf/{group} is empty"


@pytest.mark.parametrize(("group", "option"), [(g, o) for g in GROUPS for o in options(g)])
def test_option_composes_and_resolves(make_config, group: str, option: str) -> None:
    cfg = make_config([f"{group}={option}"])
    resolved = OmegaConf.to_container(cfg, resolve=True)
    ModelConfig.from_dict(resolved["model"])
    resolve_options(resolved["attention"])
    assert resolved["data"]["block_size"] <= resolved["model"]["block_size"]


def test_model_and_attention_compose_together(make_config) -> None:
    cfg = make_config(["model=tiny", "attention=vanilla", "data=wiki_sample", "trainer=cpu", "logger=none"])
    assert cfg.model.name == "tiny" and cfg.attention.name == "vanilla" and cfg.trainer.accelerator == "cpu"


def test_trainer_and_callbacks_instantiate(make_config, tmp_path) -> None:
    cfg = make_config(["trainer=cpu", "logger=csv"])
    callbacks = [instantiate(c) for c in cfg.callbacks.values()]
    loggers = [instantiate(c) for c in cfg.logger.values()]
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers)
    assert trainer.max_steps == cfg.trainer.max_steps
    assert {type(c).__name__ for c in callbacks} >= {"ModelCheckpoint", "LearningRateMonitor"}
    assert any(isinstance(c, ThroughputMonitor) for c in callbacks)  # Lightning's, counting tokens (TokenThroughput)


def test_wandb_logger_is_offline_without_key(make_config, monkeypatch) -> None:
    from attnlab.training.loggers import wandb_mode

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"
    cfg = make_config(["logger=wandb", "attention=vanilla", "experiment_name=abl"])
    assert cfg.logger.wandb.experiment == "abl"  # a single run's group (tests/test_tables_wandb.py: a sweep's)
    assert "vanilla" in OmegaConf.to_container(cfg.logger.wandb, resolve=True)["tags"]


def test_experiment_overrides_are_global(make_config) -> None:
    cfg = make_config(["experiment=wikitext103_gpt2"])
    assert cfg.experiment_name == "wikitext103_gpt2"
    assert cfg.data.name == "wikitext103" and cfg.model.name == "gpt2"
    assert cfg.trainer.precision == "bf16-mixed"


@pytest.mark.parametrize("model", ["tiny", "tiny-neox", "tiny-llama"])
def test_build_model_returns_logits_for_a_composed_config(make_config, model: str) -> None:
    import torch

    import attnlab

    cfg = make_config([f"model={model}", "attention=ssa"])
    gpt = attnlab.build_model(cfg)
    assert gpt.config.family == cfg.model.family
    assert gpt(torch.zeros(2, 5, dtype=torch.long)).shape == (2, 5, cfg.model.vocab_size)


def test_token_frequencies_fit_a_model_vocabulary_larger_than_the_tokenizer() -> None:
    """Pythia pads 50,277 tokenizer ids to 50,304 embeddings: frequency features must still be set."""
    import torch

    from attnlab.models import GPT, ModelConfig

    model = GPT(ModelConfig(vocab_size=64, n_embd=32, n_head=2, n_layer=1, block_size=16), {"name": "ssa_feature"})
    counts = torch.arange(60)
    model.set_token_frequencies(counts)
    phi = model.token_log_frequency
    assert phi[60:].eq(phi[0]).all()  # padded ids count as never seen, like id 0
    assert phi[59] > phi[1] > phi[0]


def test_rotary_frequencies_stay_fp32_when_the_model_is_cast() -> None:
    import torch

    from attnlab.models import GPT, ModelConfig

    model = GPT(ModelConfig(family="llama", pos_encoding="rotary", vocab_size=64, n_embd=256, n_head=2, n_layer=1))
    exact = model.rope_inv_freq.clone()
    model.to(torch.bfloat16)
    assert model.rope_inv_freq.dtype == torch.float32 and model.rope_inv_freq.equal(exact)


def test_clipped_softmax_gamma_uses_the_training_context(make_config) -> None:
    from attnlab import build_model

    cfg = make_config(["attention=clipped_softmax", "model.block_size=256", "data.block_size=128"])
    variant = build_model(cfg).blocks[0].attn.variant
    assert variant.gamma == pytest.approx(-12.0 / 128)


# ------------------------------------------------------------------------------------------------ documented keys
KEY = re.compile(r"^(?P<indent> *)(?P<item>- )?(?P<key>[A-Za-z_][\w.@/-]*|\"[^\"]+\"):(?P<value>.*)$")
# Keys whose children are data, said once on the parent's line: the papers' numbers, the stand-ins per paper column.
DATA_NODES = {"paper", "standins"}


def brackets(line: str) -> int:
    """How many ``[`` / ``{`` the line leaves open (outside quotes and comments): a flow collection's next lines."""
    depth, quote = 0, None
    for char in line:
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "#":
            break
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
    return depth


def undocumented(path: Path) -> list[str]:
    """Leaf keys without a comment on their line or on the line above, unless the same key at the same depth is
    commented earlier in the file (said once per file). Hydra's ``defaults`` lists, ``_target_`` and mappings
    (whose leaves carry the comments) are exempt; so are conf/model presets' fields, commented on ModelConfig."""
    lines = path.read_text().splitlines()
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    documented: set[tuple[int, str]] = set()
    stack: list[tuple[int, str]] = []
    missing, depth = [], 0
    for number, line in enumerate(lines):
        match = None if depth > 0 else KEY.match(line)
        depth += brackets(line)
        if match is None:
            continue
        indent = len(match["indent"]) + (2 if match["item"] else 0)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parents = {key for _, key in stack}
        key = match["key"]
        stack.append((indent, key))
        value = match["value"].split(" #")[0].strip()
        later = [n for n in lines[number + 1 :] if n.strip() and not n.strip().startswith("#")]
        mapping = not value and bool(later) and len(later[0]) - len(later[0].lstrip()) > indent
        commented = " #" in line or (number > 0 and lines[number - 1].strip().startswith("#"))
        if commented:
            documented.add((indent, key))
        exempt = key in ("_target_", "defaults") or "defaults" in parents or parents & DATA_NODES or mapping
        exempt = exempt or (path.parent.name == "model" and key in model_fields)
        if not (commented or exempt or (indent, key) in documented):
            missing.append(f"{path.relative_to(ROOT)}:{number + 1}: {line.strip()}")
    return missing


def test_every_config_key_says_what_it_does() -> None:
    """Each key a user may set carries a comment: what it does, its unit or allowed values."""
    configs = [*CONF.rglob("*.yaml"), *(ROOT / "experiments" / "conf").rglob("*.yaml")]
    missing = [entry for path in sorted(configs) for entry in undocumented(path)]
    assert missing == [], "keys without a comment:\n" + "\n".join(missing)


def option_classes() -> list[type]:
    """The dataclasses whose fields are config keys: ModelConfig (model.*) and every variant's Options (attention.*)."""
    classes = {ModelConfig, *(resolve_options({"name": name})[0].Options for name in available_attention())}
    return sorted({k for c in classes for k in c.__mro__ if dataclasses.is_dataclass(k)}, key=lambda k: k.__name__)


@pytest.mark.parametrize("cls", option_classes(), ids=lambda c: c.__name__)
def test_every_dataclass_option_says_what_it_does(cls: type) -> None:
    """model.* and attention.* keys come from dataclasses: each field's line (or the one above) has a comment."""
    source, _ = inspect.getsourcelines(cls)
    own = [f for f in dataclasses.fields(cls) if f.name in inspect.get_annotations(cls)]
    missing = []
    for f in own:
        if f.name == "name" and cls is not ModelConfig:
            continue  # attention.name is the option itself (attention=<name>)
        index = next(i for i, line in enumerate(source) if re.match(rf"\s+{f.name}\s*:", line))
        if "#" not in source[index] and not source[index - 1].strip().startswith("#"):
            missing.append(f.name)
    assert missing == [], f"{cls.__name__} fields without a comment: {missing}"
