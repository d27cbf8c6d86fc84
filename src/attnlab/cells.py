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
IDENTITY_KEYS = ("model", "attention", "data", "optim", "seed", "train_tokens", "cell_salt", "global_batch_tokens")
TRAINER_KEYS = ("max_steps", "precision", "accumulate_grad_batches", "gradient_clip_val", "val_check_interval")
NOT_IDENTITY = {"cache_dir", "num_workers"}
# Keys added after cells were named, each at the value that runs what those cells ran: dropped from the identity at
# that value, so the cells keep their names (any other value names new cells). A key added to an identity group
# belongs here with its old behaviour's value, or every committed cell gets a new name (tests/test_as_run.py holds
# committed tables' names to today's configs). diff's subln_affine is listed at false, the old rule: its new default
# (true, the reference's affine norm) names new cells, as it should.
ADDED_SINCE = {
    "attention.subln_affine": False,
    "attention.key_shift": False,
    "attention.value_shift": False,
    "attention.qk_norm": False,
    "attention.output_norm": False,
    "attention.output_gate": False,
    "attention.norm_eps": 1e-6,
    "attention.attend_current": False,
    "attention.gate_init": "every_gate",
    "attention.gate_bias": True,
    "data.document_mask": False,  # off, as before the key existed
    "global_batch_tokens": None,  # unset: the batch is data.batch_size, as before the key existed
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
    for dotted, old_value in ADDED_SINCE.items():
        *groups, key = dotted.split(".")
        node = ident
        for group in groups:
            node = node.get(group) if isinstance(node, dict) else None
        if isinstance(node, dict) and key in node and node[key] == old_value:
            del node[key]
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
