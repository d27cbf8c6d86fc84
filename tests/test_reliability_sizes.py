"""Sizes from files, checked before anything is built: a Hugging Face config.json or a checkpoint's record that
claims a million layers, a 10^12 vocabulary or a 10^10 MLP is one line naming the file, through every way in
(``attnlab.load``, ``model.init_from=hf:``, ``evaluate.py pretrained=hf:``, ``attnlab-generate``, export,
``LanguageModel.load_from_checkpoint``), and never an allocation that takes the machine down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.errors import ConfigError
from tests.conftest import ROOT
from tests.test_reliability_inputs import fake_checkpoint


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 saved as on the hub (two layers, width 32)."""
    import transformers

    directory = tmp_path_factory.mktemp("tiny-gpt2")
    config = transformers.GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(directory)
    return directory


def crafted_copy(source: Path, target: Path, **changes: object) -> Path:
    """``source`` with its config.json edited (a value of None deletes the key)."""
    import shutil

    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text()) | changes
    config = {key: value for key, value in config.items() if value is not None}
    (target / "config.json").write_text(json.dumps(config))
    return target


HF_CLAIMS = [  # (config.json changes, what the one line says)
    ({"n_layer": 10**6, "n_embd": 8192}, "its config.json says model.n_layer=1000000 but its weights have 2"),
    ({"n_embd": 8192}, "its config.json says model.n_embd=8192 but its weights have 32"),
    ({"n_positions": 10**9}, "its config.json says model.block_size=1000000000 but its weights have 64"),
    ({"n_inner": 10**10}, "its config.json says model.intermediate_size=10000000000 but its weights have 128"),
    ({"vocab_size": 10**12}, "its config.json says model.vocab_size=1000000000000 but its weights have 300"),
    ({"model_type": "nosuch"}, "model_type: got 'nosuch'; supported: gpt2, gpt_neox, llama"),
    ({"n_layer": "abc"}, "model.n_layer: must be int, got 'abc'"),
    ({"n_embd": None}, "no 'n_embd', which the model needs"),
]


@pytest.mark.parametrize(("changes", "problem"), HF_CLAIMS, ids=[str(c) for c, _ in HF_CLAIMS])
def test_a_crafted_hf_config_is_one_line_before_anything_is_built(
    hf_dir: Path, tmp_path: Path, changes: dict, problem: str
) -> None:
    import attnlab
    from attnlab.models import build_gpt

    crafted = crafted_copy(hf_dir, tmp_path / "crafted", **changes)
    for load in (lambda: attnlab.load(crafted), lambda: build_gpt({"init_from": f"hf:{crafted}"})):
        with pytest.raises(ConfigError) as refused:
            load()
        assert refused.value.key == "model.init_from" and problem in str(refused.value)
        assert "\n" not in str(refused.value)


def test_hf_weights_of_the_wrong_shape_are_one_line(hf_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from attnlab.models import build_gpt

    crafted = crafted_copy(hf_dir, tmp_path / "crafted")
    weights = load_file(crafted / "model.safetensors")
    weights["transformer.h.1.mlp.c_fc.weight"] = torch.zeros(32, 100)  # layer 1's MLP narrower than layer 0's
    save_file(weights, crafted / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"blocks\.1\.mlp\.fc\.weight: checkpoint \(100, 32\) vs model \(128, 32\)"):
        build_gpt({"init_from": f"hf:{crafted}"})
    (crafted / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ConfigError, match=r"model\.safetensors is not a readable weights file"):
        build_gpt({"init_from": f"hf:{crafted}"})


def test_a_neox_fused_qkv_that_does_not_fit_its_heads_is_one_line(tmp_path: Path) -> None:
    import transformers

    from attnlab.models import build_gpt

    config = transformers.GPTNeoXConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64
    )
    transformers.GPTNeoXForCausalLM(config).save_pretrained(tmp_path / "neox")
    crafted = crafted_copy(tmp_path / "neox", tmp_path / "crafted", num_attention_heads=32, hidden_size=64)
    with pytest.raises(ConfigError) as refused:
        build_gpt({"init_from": f"hf:{crafted}"})
    assert "does not fit the config" in str(refused.value) or "its weights have" in str(refused.value)


@pytest.mark.slow
def test_a_model_larger_than_the_memory_available_is_refused_before_it_is_built(
    hf_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sizes the weights agree with, but more than this machine holds: refused from the sizes alone (also for a
    model from scratch, which has no weights to compare with)."""
    from attnlab.models import build_gpt, sizes

    monkeypatch.setattr(sizes, "available_memory", lambda: 100_000)
    with pytest.raises(ConfigError, match=r"^model\.init_from: .* GiB for its weights alone; this machine has"):
        build_gpt({"init_from": f"hf:{hf_dir}"})
    with pytest.raises(ConfigError, match=r"^model: model tiny: a model of n_layer=4"):
        build_gpt({"name": "tiny"})
    with torch.device("meta"):  # counting parameters allocates nothing: any size is allowed
        assert build_gpt({"name": "tiny", "n_layer": 1000}).num_parameters() > 10**8


def test_the_parameter_count_from_sizes_matches_the_built_model() -> None:
    from attnlab.models import GPT, ModelConfig
    from attnlab.models.sizes import parameter_count

    for config in (
        ModelConfig(),
        ModelConfig(family="llama", bias=False, pos_encoding="rotary", n_kv_head=2, tie_embeddings=False),
        ModelConfig(family="neox", pos_encoding="rotary", rotary_pct=0.25, tie_embeddings=False, intermediate_size=96),
    ):
        built = sum(p.numel() for p in GPT(config).parameters())
        assert built <= parameter_count(config) <= built + config.vocab_size


CHECKPOINT_CLAIMS = [
    ({"model": {"n_layer": 10**6}}, False, "its record says model.n_layer=1000000 but its weights have 1"),
    ({"model": {"n_layer": 10**6}}, True, "holds no model weights"),
    (
        {"model": {"vocab_size": 10**12}},
        False,
        "its record says model.vocab_size=1000000000000 but its weights have 10",
    ),
    ({"model": {"intermediate_size": 10**10}}, False, "model.intermediate_size=10000000000 but its weights have 16"),
    ({"model": {"block_size": 10**9}}, False, "model.block_size=1000000000 but its weights have 8"),
]


def crafted_checkpoint(path: Path, model: dict, empty: bool) -> Path:
    """``fake_checkpoint`` with the MLP and positions a record's sizes are checked against, or with no weights."""
    fake_checkpoint(path, model=model)
    raw = torch.load(path, weights_only=True)
    raw["state_dict"] = (
        {}
        if empty
        else raw["state_dict"]
        | {
            "model.wpe.weight": torch.zeros(8, 4),
            "model.blocks.0.mlp.fc.weight": torch.zeros(16, 4),
        }
    )
    torch.save(raw, path)
    return path


@pytest.mark.parametrize(("model", "empty", "problem"), CHECKPOINT_CLAIMS, ids=lambda v: str(v)[:40])
@pytest.mark.slow
def test_a_checkpoint_claiming_sizes_is_one_line_through_every_reader(
    tmp_path: Path, model: dict, empty: bool, problem: str
) -> None:
    import attnlab
    from attnlab.export import main as export_main
    from attnlab.training.module import LanguageModel

    path = crafted_checkpoint(tmp_path / "last.ckpt", model["model"], empty)
    for load in (lambda: attnlab.load(path), lambda: LanguageModel.load_from_checkpoint(path)):
        with pytest.raises(ConfigError) as refused:
            load()
        assert problem in str(refused.value) and str(path) in str(refused.value)
    with pytest.raises(SystemExit) as export:  # attnlab-export
        export_main([str(path), str(tmp_path / "hf")])
    assert problem in str(export.value.code) and "\n" not in str(export.value.code)
    assert not (tmp_path / "hf").exists()
    generate = subprocess.run(
        [sys.executable, "-m", "attnlab.generate", str(path), "hello"], capture_output=True, text=True, cwd=ROOT
    )
    assert generate.returncode == 1 and "Traceback" not in generate.stderr
    assert len(generate.stderr.strip().splitlines()) == 1 and problem in generate.stderr


def test_a_checkpoint_with_a_broken_tokenizer_is_one_line(tmp_path: Path) -> None:
    from attnlab.models.checkpoint import load_checkpoint

    run = load_checkpoint(fake_checkpoint(tmp_path / "last.ckpt"))
    with pytest.raises(ConfigError, match=r"^tokenizer: .*last\.ckpt: its tokenizer does not load"):
        run.tokenizer  # noqa: B018 (the property reads the JSON)


def test_load_from_checkpoint_refuses_a_pickle_payload_with_our_line(tmp_path: Path) -> None:
    from attnlab.training.module import LanguageModel
    from tests.test_runs import Payload

    crafted, marker = tmp_path / "evil.ckpt", tmp_path / "pwned"
    torch.save({"state_dict": {}, "payload": Payload(marker)}, crafted)
    with pytest.raises(ConfigError, match=r"^checkpoint: .*evil\.ckpt holds objects other than tensors"):
        LanguageModel.load_from_checkpoint(crafted)
    assert not marker.exists()


@pytest.mark.slow
def test_evaluate_py_on_a_crafted_hf_directory_is_one_line_and_leaves_nothing(hf_dir: Path, tmp_path: Path) -> None:
    crafted = crafted_copy(hf_dir, tmp_path / "crafted", n_layer=10**6, n_embd=8192)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    refused = subprocess.run(
        [sys.executable, "evaluate.py", f"pretrained=hf:{crafted}", "eval=quick", f"paths.log_dir={tmp_path / 'out'}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines() == [
        f"error: model.init_from: {crafted}: its config.json says model.n_layer=1000000 but its weights have 2; the "
        "file is inconsistent"
    ]
    assert not (tmp_path / "out").exists()
