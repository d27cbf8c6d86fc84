"""A run's identity: the deterministic directory of one grid cell, keyed by a hash of what decides its result.

Registered as the ``${cell_dir:}`` resolver, so a training job (any launcher, any machine) and the table engine
name the same directory for the same cell: re-running a table finds its finished cells, and two tables that need
the same cell share it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from attnlab.digest import digest, start_identity

# What decides a run's numbers; logger, paths, progress bar, experiment name and checkpoint to resume do not.
IDENTITY_KEYS = ("model", "attention", "data", "optim", "seed", "train_tokens", "cell_salt")
TRAINER_KEYS = ("max_steps", "precision", "accumulate_grad_batches", "gradient_clip_val", "val_check_interval")
NOT_IDENTITY = {"cache_dir", "num_workers"}
# attention options added after cells were named, at the value that runs the rule those cells ran: dropped from the
# identity at that value, so the cells keep their names (any other value names new cells). diff's subln_affine is
# listed at false, the old rule: its new default (true, the reference's affine norm) names new cells, as it should.
ATTENTION_OPTIONS_ADDED = {
    "subln_affine": False,
    "key_shift": False,
    "value_shift": False,
    "qk_norm": False,
    "output_norm": False,
    "output_gate": False,
    "norm_eps": 1e-6,
    "attend_current": False,
    "gate_init": "every_gate",
    "gate_bias": True,
}


def _resolved(node: Any) -> Any:
    """``node`` resolved, without keys that are places rather than settings (their ``${hydra:}`` is not needed)."""
    if isinstance(node, DictConfig):
        return {key: _resolved(node[key]) for key in node if key not in NOT_IDENTITY}
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def identity(root: DictConfig) -> dict[str, Any]:
    """The identity-relevant part of a composed ``train.yaml`` config."""
    ident = {key: _resolved(root[key]) for key in IDENTITY_KEYS if key in root}
    if ident.get("model", {}).get("init_from"):
        ident["model"]["init_from"] = start_identity(str(ident["model"]["init_from"]))
    attention = ident.get("attention", {})
    for key, value in ATTENTION_OPTIONS_ADDED.items():
        if key in attention and attention[key] == value:
            del attention[key]
    if not ident.get("data", {}).get("document_mask", True):  # off: cells named before the key existed keep names
        del ident["data"]["document_mask"]
    if root.get("global_batch_tokens") is not None:  # only when set: cells named before the key existed keep names
        ident["global_batch_tokens"] = root.global_batch_tokens
    data = ident.get("data", {})
    if data.get("source") in ("registry", "files") and not data.get("packed_dir"):  # text that moves under its name
        from attnlab.data.text_files import corpus_sha256  # here: resolvers register before any heavy import

        data["corpus_sha256"] = corpus_sha256(data["source"], data.get("files") or [], Path(root.data.cache_dir))
    trainer = root.get("trainer") or {}
    ident["trainer"] = {key: _resolved(trainer[key]) for key in TRAINER_KEYS if key in trainer}
    return ident


def cell_name(root: DictConfig) -> str:
    """``<model>-<attention>-s<seed>-<hash>``: readable, and unique per identity."""
    return f"{root.model.name}-{root.attention.name}-s{root.seed}-{digest(identity(root), 10)}"


def cell_dir_resolver(*, _root_: DictConfig) -> str:
    return cell_name(_root_)


def resume_ckpt() -> str | None:
    """``ckpt_path=${resume_ckpt:}``: this job's own ``checkpoints/last.ckpt`` when an earlier attempt left one."""
    from hydra.core.hydra_config import HydraConfig

    from attnlab.run_directory import LAST_CHECKPOINT  # imported here: resolvers register before any heavy import

    if not HydraConfig.initialized():
        return None
    last = Path(HydraConfig.get().runtime.output_dir) / LAST_CHECKPOINT
    return str(last) if last.is_file() else None


def register() -> None:
    """``${cell_dir:}`` (a table cell's directory name) and ``${resume_ckpt:}``."""
    if not OmegaConf.has_resolver("cell_dir"):
        OmegaConf.register_new_resolver("cell_dir", cell_dir_resolver)
    if not OmegaConf.has_resolver("resume_ckpt"):
        OmegaConf.register_new_resolver("resume_ckpt", resume_ckpt)
