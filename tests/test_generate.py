"""GPT.generate decodes from the KV cache: greedy is what HF generate picks on the exported model, sampling is
repeatable with a seeded generator, top_k / top_p restrict the support, eos stops; and the attnlab-generate CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.export import export
from attnlab.generate import main as generate_main
from attnlab.models.gpt import sample_next
from tests.conftest import save_run_checkpoint
from tests.test_export import FAMILIES, random_model, tokenizer  # noqa: F401  (tokenizer: the fixture)

transformers = pytest.importorskip("transformers")

NEW = 20


def prompt(batch: int = 1, length: int = 8) -> torch.Tensor:
    return torch.randint(0, 300, (batch, length), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("case", ["gpt2", "neox", "llama_gqa_llama3_rope"])
def test_greedy_equals_hf_generate_on_the_exported_model(tokenizer, tmp_path: Path, case: str) -> None:  # noqa: F811
    model = random_model(tokenizer, **FAMILIES[case])
    export(save_run_checkpoint(model, tokenizer, tmp_path / "last.ckpt"), tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    idx = prompt(2)
    expected = hf.generate(
        idx, attention_mask=torch.ones_like(idx), max_new_tokens=NEW, do_sample=False, eos_token_id=None
    )
    assert torch.equal(model.generate(idx, NEW, temperature=0.0), expected)


def test_sampling_with_a_seeded_generator_is_repeatable(tokenizer) -> None:  # noqa: F811
    model = random_model(tokenizer)
    runs = [model.generate(prompt(2), NEW, generator=torch.Generator().manual_seed(seed)) for seed in (0, 0, 1)]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
    assert runs[0].shape == (2, 8 + NEW)


def test_top_k_one_and_a_tiny_top_p_are_greedy(tokenizer) -> None:  # noqa: F811
    model = random_model(tokenizer)
    greedy = model.generate(prompt(), NEW, temperature=0.0)
    assert torch.equal(model.generate(prompt(), NEW, top_k=1, generator=torch.Generator().manual_seed(0)), greedy)
    assert torch.equal(model.generate(prompt(), NEW, top_p=1e-6, generator=torch.Generator().manual_seed(0)), greedy)


def test_top_k_and_top_p_restrict_the_support() -> None:
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.06, 0.04]])
    logits = probs.log().expand(4000, -1)
    generator = torch.Generator().manual_seed(0)
    assert set(sample_next(logits, 1.0, generator=generator).tolist()) == {0, 1, 2, 3, 4}
    assert set(sample_next(logits, 1.0, top_k=2, generator=generator).tolist()) == {0, 1}
    assert set(sample_next(logits, 1.0, top_p=0.65, generator=generator).tolist()) == {0, 1}  # 0.4 + 0.3 >= 0.65
    assert set(sample_next(logits, 1.0, top_p=0.7, generator=generator).tolist()) == {0, 1}  # reached exactly
    assert set(sample_next(logits, 1.0, top_p=0.75, generator=generator).tolist()) == {0, 1, 2}
    assert set(sample_next(logits, 1.0, top_k=3, top_p=0.95, generator=generator).tolist()) == {0, 1, 2}
    counts = torch.bincount(sample_next(logits, 1.0, top_k=2, generator=generator), minlength=5)
    assert counts[0] / counts[:2].sum() == pytest.approx(0.4 / 0.7, abs=0.03)  # renormalised over the kept tokens


def test_eos_stops_each_row_and_pads_it(tokenizer) -> None:  # noqa: F811
    model = random_model(tokenizer)
    idx = prompt(2)
    greedy = model.generate(idx, NEW, temperature=0.0)
    eos = int(greedy[0, 8 + 2])  # the first row's third new token
    out = model.generate(idx, NEW, temperature=0.0, eos=eos)
    first_eos = [int((row[8:] == eos).nonzero()[0]) if (row[8:] == eos).any() else None for row in greedy]
    assert first_eos[0] <= 2
    ends = [8 + NEW if first is None else 8 + first + 1 for first in first_eos]  # each row's end, its eos included
    assert out.shape[1] == max(ends)  # decoding ends when the last row stops (or at max_new_tokens)
    for row, end in enumerate(ends):
        assert torch.equal(out[row, :end], greedy[row, :end]) and (out[row, end:] == eos).all()
    single = model.generate(idx[:1], NEW, temperature=0.0, eos=eos)
    assert torch.equal(single, greedy[:1, : 8 + first_eos[0] + 1])


def test_bad_settings_name_the_key(tokenizer) -> None:  # noqa: F811
    model = random_model(tokenizer)
    with pytest.raises(ConfigError, match=r"max_new_tokens: 8 prompt \+ 57 new tokens exceed the learned positions"):
        model.generate(prompt(), 57)
    for kwargs, key in [({"temperature": -1.0}, "temperature"), ({"top_k": 0}, "top_k"), ({"top_p": 0.0}, "top_p")]:
        with pytest.raises(ConfigError, match=f"^{key}: "):
            model.generate(prompt(), 4, **kwargs)


def test_cli_continues_a_prompt_with_the_checkpoints_tokenizer(tokenizer, tmp_path, capsys) -> None:  # noqa: F811
    checkpoint = str(save_run_checkpoint(random_model(tokenizer), tokenizer, tmp_path / "last.ckpt"))
    outputs = []
    for seed in ("5", "5"):
        generate_main([checkpoint, "the cat sat", "--max-new-tokens", "12", "--seed", seed, "--top-k", "20"])
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0].startswith("the cat sat")
    with pytest.raises(SystemExit) as stop:
        generate_main([checkpoint, "the cat sat", "--top-p", "2", "--max-new-tokens", "99"])
    assert stop.value.code == "error: top_p: must be in (0, 1] or None, got 2.0"  # the first problem, in one line
