"""attnlab-export: a vanilla checkpoint of each family loads with transformers' Auto classes and computes our logits;
what HF cannot express is refused in one line, and nothing already on disk is overwritten without --force."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from attnlab.data.tokenizer import train_bpe_tokenizer
from attnlab.export import main as export_main
from attnlab.models import GPT, ModelConfig
from tests.conftest import save_run_checkpoint

transformers = pytest.importorskip("transformers")

TOL = 1e-4  # fp32, eager attention on the HF side
SMALL = {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 64}
LLAMA3_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
FAMILIES = {  # the block styles of conf/model (tiny, tiny-neox, tiny-llama), with what the HF classes also cover
    "gpt2": {"family": "gpt2"},
    "gpt2_untied": {"family": "gpt2", "tie_embeddings": False},
    "neox": {"family": "neox", "pos_encoding": "rotary", "rotary_pct": 0.25, "parallel_residual": True},
    "neox_sequential": {"family": "neox", "pos_encoding": "rotary", "rotary_pct": 0.25, "tie_embeddings": False},
    "llama_gqa_llama3_rope": {
        "family": "llama",
        "pos_encoding": "rotary",
        "bias": False,
        "n_kv_head": 2,
        "intermediate_size": 96,
        "tie_embeddings": False,
        "rope_scaling": LLAMA3_ROPE,
    },
}


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    texts = ["the cat sat on the mat", "attention is all you need", "a model of language, trained and exported"]
    return train_bpe_tokenizer(texts * 20, 300)


def random_model(tokenizer: Tokenizer, attention: str = "vanilla", **overrides: object) -> GPT:
    """A small model with O(1) activations (weights well away from the 0.02 init), so layout mistakes show."""
    torch.manual_seed(0)
    config = ModelConfig(**{**SMALL, "vocab_size": tokenizer.get_vocab_size(), **overrides})
    model = GPT(config, {"name": attention}).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.3 * torch.randn_like(param))
    return model


def export(checkpoint: Path, directory: Path, *flags: str) -> None:
    export_main([str(checkpoint), str(directory), *flags])


def refused(capsys: pytest.CaptureFixture, *args: str) -> str:
    """The one ``error:`` line of a refused export (exit status 1, no traceback)."""
    with pytest.raises(SystemExit) as stop:
        export_main(list(args))
    message = str(stop.value.code)
    assert message.startswith("error: ") and "\n" not in message and "Traceback" not in capsys.readouterr().err
    return message


@pytest.mark.parametrize("case", list(FAMILIES))
def test_export_loads_with_auto_classes_and_gives_our_logits(tokenizer, tmp_path: Path, case: str) -> None:
    model = random_model(tokenizer, **FAMILIES[case])
    checkpoint = save_run_checkpoint(model, tokenizer, tmp_path / "run" / "last.ckpt")
    export(checkpoint, tmp_path / "hf")
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in (tmp_path / "hf").iterdir()
    }
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    assert hf.dtype == torch.float32
    idx = torch.randint(0, model.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(idx), hf(idx).logits
    assert ours.abs().max() > 1.0  # a meaningful comparison, not two near-zero tensors
    torch.testing.assert_close(theirs, ours, atol=TOL, rtol=0)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "the cat sat on a mat"
    assert hf_tokenizer(text)["input_ids"] == tokenizer.encode(text).ids
    assert hf_tokenizer.eos_token == "<|endoftext|>" and hf.config.eos_token_id == tokenizer.token_to_id(
        "<|endoftext|>"
    )


def test_the_hf_config_is_saved_by_transformers(tokenizer, tmp_path: Path) -> None:
    model = random_model(tokenizer, **FAMILIES["neox"])
    export(save_run_checkpoint(model, tokenizer, tmp_path / "last.ckpt"), tmp_path / "hf")
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert saved["architectures"] == ["GPTNeoXForCausalLM"] and saved["model_type"] == "gpt_neox"
    assert saved["transformers_version"] == transformers.__version__


@pytest.mark.parametrize("attention", ["gated", "clipped_softmax"])
def test_an_attention_variant_is_refused_and_nothing_written(tokenizer, tmp_path, capsys, attention: str) -> None:
    checkpoint = save_run_checkpoint(random_model(tokenizer, attention), tokenizer, tmp_path / "last.ckpt")
    message = refused(capsys, str(checkpoint), str(tmp_path / "hf"))
    assert message.startswith(f"error: attention.name: {attention} cannot be exported: Hugging Face has no such")
    assert not (tmp_path / "hf").exists() and [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"pos_encoding": "alibi"}, "model.pos_encoding"),
        ({"family": "neox", "pos_encoding": "rotary", "n_kv_head": 2}, "model.n_kv_head"),
        ({"family": "llama", "pos_encoding": "rotary", "bias": True}, "model.bias"),
    ],
)
def test_an_architecture_hf_cannot_express_is_refused(tokenizer, tmp_path, capsys, overrides, key) -> None:
    checkpoint = save_run_checkpoint(random_model(tokenizer, **overrides), tokenizer, tmp_path / "last.ckpt")
    assert refused(capsys, str(checkpoint), str(tmp_path / "hf")).startswith(f"error: {key}: ")
    assert not (tmp_path / "hf").exists()


def test_masked_heads_are_refused(tokenizer, tmp_path, capsys) -> None:
    model = random_model(tokenizer, head_mask=[[1, 0, 1, 1], [1, 1, 1, 1]])
    checkpoint = save_run_checkpoint(model, tokenizer, tmp_path / "last.ckpt")
    assert refused(capsys, str(checkpoint), str(tmp_path / "hf")).startswith("error: model.head_mask: ")


def test_a_non_empty_directory_is_kept_unless_forced(tokenizer, tmp_path, capsys) -> None:
    checkpoint = save_run_checkpoint(random_model(tokenizer), tokenizer, tmp_path / "last.ckpt")
    target = tmp_path / "hf"
    target.mkdir()
    (target / "config.json").write_text("mine")
    message = refused(capsys, str(checkpoint), str(target))
    assert "not empty" in message and "--force" in message
    assert [p.name for p in target.iterdir()] == ["config.json"] and (target / "config.json").read_text() == "mine"
    export(checkpoint, target, "--force")
    assert json.loads((target / "config.json").read_text())["model_type"] == "gpt2"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging directory left
    (empty := tmp_path / "empty").mkdir()
    export(checkpoint, empty)  # an empty directory is as good as none
    assert (empty / "model.safetensors").is_file()


def test_a_missing_checkpoint_is_one_line(tmp_path, capsys) -> None:
    message = refused(capsys, str(tmp_path / "nope.ckpt"), str(tmp_path / "hf"))
    assert message == f"error: checkpoint: no checkpoint file at {tmp_path / 'nope.ckpt'}"


def test_a_killed_exports_staging_directory_is_removed_by_the_next_export(tokenizer, tmp_path: Path) -> None:
    """An export writes into ``.<dir>.staging-<pid>-*`` first; one whose process was killed (SIGKILL leaves it) is
    removed by the next export beside it, and one a live process writes is left alone."""
    import os
    import subprocess
    import sys

    from attnlab.files import STAGING

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    abandoned = tmp_path / f".hf{STAGING}{dead.stdout.strip()}-abc"
    abandoned.mkdir()
    (abandoned / "model.safetensors").write_bytes(b"\0" * 1000)
    alive = tmp_path / f".hf{STAGING}{os.getppid()}-def"
    alive.mkdir()
    export(save_run_checkpoint(random_model(tokenizer), tokenizer, tmp_path / "run" / "last.ckpt"), tmp_path / "hf")
    assert (tmp_path / "hf" / "config.json").is_file()
    assert not abandoned.exists() and alive.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".hf")) == [alive.name]
