"""Every key a run reads, checked before the run writes anything: one line naming the key and what is allowed.

Three layers, so a new key is covered by declaring it, not by adding a check here:
- types: each value against its declared type, for the dataclasses behind ``model.*`` and ``attention.*`` and the
  constructor signatures behind every ``_target_`` node (``data``, ``callbacks.*``), with pydantic's lax rules
  (an int stands for a float; ``"abc"`` for nothing numeric);
- the objects' own checks: the model config, the variant's options, the data module and our callbacks are built
  once, without data or files, so whatever their constructors refuse is refused here;
- ranges the libraries own (Lightning's trainer keys) and rules across keys.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from attnlab.errors import ConfigError, require
from attnlab.field_checks import check_fields, check_value

SEED_MAX = 2**32 - 1  # numpy and the data loaders take 32-bit seeds
# callbacks whose constructors only check and store their arguments (Lightning's own are not built here)
OWN_CALLBACKS = ("attnlab.",)
PRECISIONS = ("16-mixed", "bf16-mixed", "32-true", "64-true", "16-true", "bf16-true", "transformer-engine", "32", "16")
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")


def typed(value: Any, kind: type, key: str, allowed: str) -> Any:
    """``value`` as ``kind`` (an int may stand for a float, a bool for nothing else; a float is finite), or a
    ConfigError."""
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    require(ok, key, f"{allowed}, got {value!r}")
    if kind is float:
        require(math.isfinite(value), key, f"must be a finite number, got {value!r}")
    return value


def positive_int(value: Any, key: str, allowed: str = "must be a positive integer") -> int:
    """``value`` as an integer >= 1, or a ConfigError naming ``key`` with ``allowed``."""
    number = typed(value, int, key, allowed)
    require(number >= 1, key, f"{allowed}, got {number}")
    return number


@dataclasses.dataclass
class RunKeys:
    """train.yaml's own top-level keys, typed, so they are checked like every section (``check_fields``)."""

    seed: int
    experiment_name: str
    ckpt_path: str | None
    train_tokens: float | None
    global_batch_tokens: int | None
    compile: bool
    fused_loss: bool
    print_config: bool


def check_seed(cfg: DictConfig) -> None:
    """Both entry points: numpy and the data loaders take 32-bit seeds."""
    seed = typed(cfg.get("seed"), int, "seed", "must be an integer")
    require(0 <= seed <= SEED_MAX, "seed", f"must be in [0, {SEED_MAX}], got {seed}")


def plain_items(node: Any) -> Any:
    """A config node as plain Python; a value that does not resolve here (``${hydra:...}`` before the job runs) is
    left out, so checks read what they can and the job resolves the rest."""
    if isinstance(node, DictConfig):
        items = {}
        for key in node:
            try:
                value = node[key]
            except Exception:  # an interpolation only the running job can resolve
                continue
            items[str(key)] = plain_items(value)
        return items
    if isinstance(node, ListConfig):
        try:
            return OmegaConf.to_container(node, resolve=True)
        except Exception:
            return []
    return node


def target_of(node: Mapping[str, Any]) -> Callable[..., Any] | None:
    from hydra.utils import get_object

    try:
        return get_object(str(node["_target_"]))
    except Exception:  # an unimportable target fails where Hydra instantiates it, with Hydra's message
        return None


def check_arguments(values: Mapping[str, Any], target: Callable[..., Any], prefix: str) -> None:
    """Each argument a ``_target_`` node passes, against the type its constructor declares."""
    function = target.__init__ if inspect.isclass(target) else target
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # annotations that do not evaluate (a library's own): its constructor checks them
        return
    for key, value in values.items():
        if not key.startswith("_") and key in hints:
            check_value(value, hints[key], f"{prefix}.{key}")


def build(target: Callable[..., Any], values: Mapping[str, Any], prefix: str) -> None:
    """Run the constructor's own checks; anything it refuses becomes one line naming the node. Skipped when an
    argument only the running job can resolve (a path under its directory) is missing."""
    arguments = {k: v for k, v in values.items() if not k.startswith("_")}
    try:
        inspect.signature(target).bind(**arguments)
    except TypeError:
        return
    try:
        target(**arguments)
    except ConfigError:
        raise
    except Exception as error:  # ValueError, TypeError, Lightning's MisconfigurationException
        raise ConfigError(prefix, " ".join(str(error).split())) from None


def check_model_and_attention(cfg: DictConfig, machine: bool = True) -> None:
    from attnlab.attention.base import resolve_options
    from attnlab.models.config import ModelConfig

    model = plain_items(cfg.get("model"))
    check_fields(model, ModelConfig, "model")
    attention = plain_items(cfg.get("attention"))
    variant, _ = resolve_options({"name": attention.get("name", "vanilla")})
    check_fields(attention, variant.Options, "attention")
    resolve_options(attention)  # the variant's own range checks (__post_init__)
    variant_lr = attention.get("variant_lr")
    require(
        variant_lr is None or variant_lr > 0,
        "attention.variant_lr",
        f"must be a positive learning rate or null (the model's lr), got {variant_lr!r}",
    )
    init_from = model.get("init_from")
    if machine and init_from and not str(init_from).startswith("hf:"):
        require(Path(init_from).is_file(), "model.init_from", f"no checkpoint file at {init_from}")
    if not init_from:
        fields = {f.name for f in dataclasses.fields(ModelConfig)}
        ModelConfig.from_dict({k: v for k, v in model.items() if k in fields})


def check_targets(cfg: DictConfig) -> None:
    """``data`` and our own callbacks: types, then their constructors' checks."""
    data = plain_items(cfg.get("data")) or {}
    target = target_of(data) if "_target_" in data else None
    if target is not None:
        check_arguments(data, target, "data")
        build(target, {**data, "cache_dir": data.get("cache_dir", ".cache")}, "data")
    for name, node in (plain_items(cfg.get("callbacks")) or {}).items():
        if not isinstance(node, Mapping) or "_target_" not in node:
            continue
        target = target_of(node)
        if target is None:
            continue
        check_arguments(node, target, f"callbacks.{name}")
        if str(node["_target_"]).startswith(OWN_CALLBACKS):
            build(target, node, f"callbacks.{name}")


def check_trainer(cfg: DictConfig, machine: bool = True) -> None:
    """The trainer keys Lightning refuses with a traceback, or accepts and then ignores. ``machine``: also that the
    devices asked for are on this machine."""
    import torch

    trainer = plain_items(cfg.get("trainer"))
    positive_int(trainer.get("max_steps"), "trainer.max_steps")
    positive_int(
        trainer.get("accumulate_grad_batches", 1), "trainer.accumulate_grad_batches", "must be an integer >= 1"
    )
    interval = trainer.get("val_check_interval")
    if interval is not None:
        allowed = "must be a positive number of steps or a fraction of an epoch in (0, 1]"
        if isinstance(interval, float):
            require(0 < interval <= 1, "trainer.val_check_interval", f"{allowed}, got {interval}")
        else:
            interval = typed(interval, int, "trainer.val_check_interval", allowed)
            require(interval > 0, "trainer.val_check_interval", f"{allowed}, got {interval}")
    precision = str(trainer.get("precision", "32-true"))
    require(precision in PRECISIONS, "trainer.precision", f"got {precision!r}; allowed: {', '.join(PRECISIONS)}")
    accelerator = trainer.get("accelerator", "auto")
    allowed = ", ".join(ACCELERATORS)
    require(accelerator in ACCELERATORS, "trainer.accelerator", f"got {accelerator!r}; allowed: {allowed}")
    if machine and accelerator in ("gpu", "cuda"):
        require(
            torch.cuda.is_available(),
            "trainer.accelerator",
            f"{accelerator} asks for a GPU and torch sees none; use trainer=cpu (or trainer.accelerator=auto)",
        )
    strategy = trainer.get("strategy", "auto")
    if isinstance(strategy, Mapping):
        if str(strategy.get("_target_", "")).endswith("strategies.fsdp"):
            require(
                accelerator in ("gpu", "cuda", "auto"),
                "trainer.accelerator",
                f"trainer=fsdp runs on GPUs only (Lightning's FSDPStrategy), got {accelerator!r}; "
                "on the CPU use trainer=ddp_cpu",
            )
    elif strategy != "auto":  # Lightning's registry costs seconds of import: only a named strategy needs it
        from lightning.pytorch.strategies import StrategyRegistry

        allowed = ["auto", *StrategyRegistry.available_strategies()]
        require(strategy in allowed, "trainer.strategy", f"got {strategy!r}; allowed: {', '.join(allowed)}")
    devices = trainer.get("devices", "auto")
    if devices != "auto" and not isinstance(devices, list):
        count = devices if isinstance(devices, int) and not isinstance(devices, bool) else None
        allowed = "auto, a count >= 1 or a list of device indices"
        require(count is not None and count >= 1, "trainer.devices", f"must be {allowed}, got {devices!r}")
        on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
        if machine and on_cpu:
            cores = os.cpu_count() or 1
            require(count <= cores, "trainer.devices", f"{count} CPU processes on a machine with {cores} cores")
    clip = trainer.get("gradient_clip_val")
    require(
        clip is None or (isinstance(clip, int | float) and not isinstance(clip, bool) and 0 <= clip < math.inf),
        "trainer.gradient_clip_val",
        f"must be a norm >= 0 or null (no clipping), got {clip!r}",
    )
    limit = trainer.get("limit_val_batches", 1.0)
    allowed = "a count >= 0 or a fraction in [0, 1] (0: no validation, which the run's log says)"
    if isinstance(limit, float):
        require(0 <= limit <= 1, "trainer.limit_val_batches", f"must be {allowed}, got {limit}")
    else:
        require(isinstance(limit, int) and limit >= 0, "trainer.limit_val_batches", f"must be {allowed}, got {limit!r}")


def check_across_keys(cfg: DictConfig) -> None:
    """Ranges and rules across keys, on values whose types ``check_targets`` and ``check_fields`` have checked."""
    data = plain_items(cfg.get("data"))
    block_size = data.get("block_size")  # (data.batch_size: validate_train_config's own check)
    allowed = f"must be an integer >= 1, got {block_size!r}"
    require(isinstance(block_size, int) and block_size >= 1, "data.block_size", allowed)
    require(data.get("num_workers", 0) >= 0, "data.num_workers", f"must be >= 0, got {data.get('num_workers')}")
    vocab = data.get("tokenizer_vocab_size")
    require(
        vocab is None or vocab >= 257,
        "data.tokenizer_vocab_size",
        f"must be >= 257 (the 256 byte tokens and <|endoftext|>), got {vocab}",
    )
    for key in ("train_tokens", "global_batch_tokens"):
        value = cfg.get(key)
        require(value is None or value > 0, key, f"must be a positive number of tokens or null, got {value!r}")
    model = plain_items(cfg.get("model"))
    if model.get("init_from"):
        return  # the architecture (its block_size, vocabulary) is the start's, checked when it is read
    context = model.get("block_size")
    require(
        block_size <= context,
        "data.block_size",
        f"{block_size} exceeds the model's context model.block_size={context}; set model.block_size too",
    )
    from attnlab.models.config import ModelConfig

    default_vocab = ModelConfig.__dataclass_fields__["vocab_size"].default
    vocab_size = model.get("vocab_size")
    require(
        bool(model.get("tokenizer")) or vocab_size in (default_vocab, vocab),
        "model.vocab_size",
        f"{vocab_size} is not used: with model.tokenizer=null the vocabulary is the BPE's, whose size "
        f"data.tokenizer_vocab_size sets ({vocab}); drop model.vocab_size, or set data.tokenizer_vocab_size",
    )


def check_run_config(cfg: DictConfig, machine: bool = True) -> None:
    """All of the above, in the order a user would fix them. ``machine=False`` leaves out whether the devices and
    files the config names are on this machine now: the table engine checks cells that a launcher may run
    elsewhere, and that start from checkpoints an earlier stage has yet to write."""
    check_fields(plain_items(cfg), RunKeys, "")
    check_trainer(cfg, machine)
    check_model_and_attention(cfg, machine)
    check_targets(cfg)
    check_across_keys(cfg)


DTYPES = ("float32", "bfloat16", "float16")


def check_evaluate_config(cfg: DictConfig, machine: bool = True) -> None:
    """``evaluate.py``'s own keys (the checkpoint and task names are checked when they are read). ``machine``: also
    that the device asked for is on this machine."""
    import torch

    check_seed(cfg)
    positive_int(cfg.get("batch_size"), "batch_size")
    limit = cfg.get("limit")
    allowed = "must be null (all examples), a count >= 1 or a fraction in (0, 1)"
    if isinstance(limit, float):
        require(0 < limit < 1, "limit", f"{allowed}, got {limit}")
    elif limit is not None:
        positive_int(limit, "limit", allowed)
    if cfg.get("max_length") is not None:
        positive_int(cfg.get("max_length"), "max_length", "must be null (the model's block_size) or a positive integer")
    dtype = cfg.get("dtype")
    require(dtype in DTYPES, "dtype", f"got {dtype!r}; allowed: {', '.join(DTYPES)}")
    device = str(cfg.get("device"))
    allowed = "cpu, cuda or cuda:<index>"
    require(device == "cpu" or device.split(":")[0] == "cuda", "device", f"got {device!r}; allowed: {allowed}")
    if device != "cpu":
        index = device.partition(":")[2]
        require(index == "" or index.isdigit(), "device", f"got {device!r}; allowed: {allowed}")
        if machine:
            require(torch.cuda.is_available(), "device", f"{device} asks for a GPU and torch sees none; use device=cpu")
            count = torch.cuda.device_count()
            require(int(index or 0) < count, "device", f"{device}: torch sees {count} GPU(s)")
    suite = plain_items(cfg.get("eval"))
    tasks = suite.get("tasks")
    with_analysis = suite.get("analysis") is not None  # eval=analysis(_cpu): its analysis may be the whole set
    require(
        isinstance(tasks, list) and (len(tasks) > 0 or with_analysis) and all(isinstance(t, str) and t for t in tasks),
        "eval.tasks",
        f"must be a non-empty list of lm-eval task names (empty only with eval.analysis), got {tasks!r}",
    )
    passkey = suite.get("passkey") or {}
    positive_int(passkey.get("samples_per_length", 10), "eval.passkey.samples_per_length")
    lengths = passkey.get("context_lengths")
    require(
        lengths is None
        or (
            isinstance(lengths, list)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in lengths)
        ),
        "eval.passkey.context_lengths",
        f"must be null (the model's window) or a list of positive token counts, got {lengths!r}",
    )
