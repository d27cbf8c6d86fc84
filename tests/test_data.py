"""The data module: packing, determinism, the disk cache, the embedded corpus and the hub sources offline."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from itertools import chain
from pathlib import Path

import numpy as np
import pytest
from datasets import load_from_disk
from hydra.utils import instantiate

import attnlab.data.datamodule as datamodule_module
from attnlab.data import TextDataModule
from attnlab.data.tokenizer import eos_token_id
from attnlab.errors import ConfigError
from tests.hub_fixtures import make_slimpajama, make_wikitext


@pytest.fixture
def text_file(tmp_path: Path, wiki_docs) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(d["text"] for d in wiki_docs[:8]))
    return path


def files_module(path: Path, cache: Path, **kwargs) -> TextDataModule:
    params = dict(
        name="files",
        source="files",
        files=[str(path)],
        block_size=16,
        batch_size=4,
        tokenizer_vocab_size=300,
        cache_dir=str(cache),
    )
    return TextDataModule(**{**params, **kwargs})


@pytest.mark.slow
def test_blocks_are_the_tokenized_documents_in_order(text_file: Path, tmp_path: Path) -> None:
    dm = files_module(text_file, tmp_path / "cache")
    dm.prepare_data()
    train_docs, _ = dm._documents()
    eos = eos_token_id(dm.tokenizer)
    stream = list(chain.from_iterable([*dm.tokenizer.encode(t).ids, eos] for t in train_docs["text"]))
    blocks = [row["input_ids"].tolist() for row in dm.train_dataset]
    assert all(len(b) == 17 for b in blocks)
    # batches of 1000 documents are packed separately; with fewer documents the blocks tile the stream
    assert list(chain.from_iterable(blocks)) == stream[: 17 * len(blocks)]
    assert len(stream) - 17 * len(blocks) < 17


@pytest.mark.slow
def test_text_files_are_named_by_their_content_not_their_paths_or_times(
    text_file: Path, tmp_path: Path, make_config
) -> None:
    """A user's corpus edited in place keeps its file names, so a cell and its caches are named by the files' content:
    an edit gets a new cell and a new tokenizer, a copy elsewhere (new path, new time) reuses the packed cache."""
    import os
    import shutil

    from attnlab.cells import cell_name

    cache = tmp_path / "cache"

    def named(path: Path) -> tuple[str, str]:
        cfg = make_config(["data=text_files", f"data.files=[{path}]"])
        cfg.data.cache_dir = str(cache)
        return files_module(path, cache).corpus_sha256(), cell_name(cfg)

    sha, name = named(text_file)
    first = files_module(text_file, cache)
    first.prepare()
    copy = tmp_path / "copy" / text_file.name
    copy.parent.mkdir()
    shutil.copyfile(text_file, copy)
    os.utime(copy, ns=(text_file.stat().st_mtime_ns + 10**9,) * 2)
    moved = files_module(copy, cache)
    moved.prepare()
    assert moved.corpus_sha256() == sha and moved.reused_cache
    assert len(list((cache / "sha256").iterdir())) == 2  # each file read once, then remembered
    text_file.write_text(text_file.read_text().replace("the", "a"))
    edited, edited_name = named(text_file)
    assert edited != sha and edited_name != name and edited_name.rsplit("-", 1)[0] == name.rsplit("-", 1)[0]
    again = files_module(text_file, cache)
    again.prepare()
    assert not again.reused_cache and len(list((cache / "tokenizers").iterdir())) == 2


@pytest.mark.slow
def test_split_and_batches_are_deterministic_for_a_seed(text_file: Path, tmp_path: Path) -> None:
    first = files_module(text_file, tmp_path / "a", seed=3)
    again = files_module(text_file, tmp_path / "b", seed=3)
    other = files_module(text_file, tmp_path / "c", seed=4)
    batches = [next(iter(dm.train_dataloader()))["input_ids"] for dm in (first, again, other) if dm.setup() is None]
    assert batches[0].equal(batches[1])
    assert not batches[0].equal(batches[2])
    assert first._documents()[1]["text"] == again._documents()[1]["text"]


def test_second_run_reuses_the_cache_without_tokenizing(text_file: Path, tmp_path: Path, monkeypatch) -> None:
    first = files_module(text_file, tmp_path / "cache")
    first.prepare_data()
    assert not first.reused_cache

    def fail(*args, **kwargs):
        raise AssertionError("re-tokenized although the cache holds this exact result")

    monkeypatch.setattr(datamodule_module, "train_bpe_tokenizer", fail)
    monkeypatch.setattr(TextDataModule, "_tokenize_and_pack", fail)
    second = files_module(text_file, tmp_path / "cache")
    second.prepare_data()
    assert second.reused_cache
    assert second.train_dataset[:]["input_ids"].equal(first.train_dataset[:]["input_ids"])
    assert np.array_equal(second.token_counts, first.token_counts)


@pytest.mark.slow
def test_changing_block_size_builds_a_new_cache(text_file: Path, tmp_path: Path) -> None:
    files_module(text_file, tmp_path / "cache").prepare_data()
    other = files_module(text_file, tmp_path / "cache", block_size=8)
    other.prepare_data()
    assert not other.reused_cache and other.train_dataset[0]["input_ids"].shape == (9,)


def test_changing_the_document_separator_builds_a_new_cache(text_file: Path, tmp_path: Path) -> None:
    files_module(text_file, tmp_path / "cache").prepare_data()
    other = files_module(text_file, tmp_path / "cache", document_separator="none")
    other.prepare_data()
    assert not other.reused_cache
    assert not (other.train_dataset[:]["input_ids"] == eos_token_id(other.tokenizer)).any()


def test_unigram_baseline_matches_direct_computation(text_file: Path, tmp_path: Path) -> None:
    dm = files_module(text_file, tmp_path / "cache")
    dm.prepare_data()
    train = dm.train_dataset[:]["input_ids"].reshape(-1).numpy()
    counts = np.bincount(train, minlength=dm.vocab_size) + 1.0
    targets = dm.val_dataset[:]["input_ids"][:, 1:].reshape(-1).numpy()
    expected = np.exp(-np.log(counts[targets] / counts.sum()).mean())
    assert dm.unigram_perplexity() == pytest.approx(expected, rel=1e-9)


@pytest.mark.slow
def test_packed_folder_trains_without_documents_and_stores_uint16(text_file: Path, tmp_path: Path) -> None:
    built = files_module(text_file, tmp_path / "cache")
    built.prepare_data()
    [folder] = (tmp_path / "cache" / "packed").iterdir()
    assert load_from_disk(str(folder / "blocks"))["train"].features["input_ids"].feature.dtype == "uint16"
    carried = shutil.copytree(folder, tmp_path / "elsewhere" / "packed")
    text_file.unlink()  # no documents on the other machine
    dm = files_module(text_file, tmp_path / "empty", packed_dir=str(carried))
    dm.prepare_data()
    assert dm.reused_cache and dm.vocab_size == built.vocab_size
    assert dm.train_dataset[:]["input_ids"].equal(built.train_dataset[:]["input_ids"])
    assert dm.unigram_perplexity() == pytest.approx(built.unigram_perplexity())
    with pytest.raises(ConfigError, match=r"blocks of 16 tokens, but data\.block_size is 8"):
        files_module(text_file, tmp_path / "empty", packed_dir=str(carried), block_size=8).prepare_data()
    with pytest.raises(ConfigError, match="is not a packed cache folder"):
        files_module(text_file, tmp_path / "empty", packed_dir=str(tmp_path)).prepare_data()


def test_embedded_corpus_is_clean_real_text(data_cache: Path) -> None:
    dm = TextDataModule(
        name="wiki_sample", source="wiki_sample", block_size=64, tokenizer_vocab_size=512, cache_dir=str(data_cache)
    )
    train_docs, val_docs = dm._documents()
    assert len(train_docs) + len(val_docs) == 106
    text = "\n".join(train_docs["text"])
    assert len(text) > 2_000_000
    for markup in ("[[", "]]", "{{", "}}", "<ref", "thumb|", "&nbsp;"):
        assert markup not in text, markup
    assert "alphabet" in text


def test_wikitext_loads_from_a_local_copy_in_the_hub_layout(make_config, tmp_path: Path, wiki_docs) -> None:
    repo = make_wikitext(tmp_path / "wikitext", wiki_docs)
    cfg = make_config(
        [
            "data=wikitext2",
            f"data.path={repo}",
            "data.block_size=32",
            "data.tokenizer_vocab_size=400",
            "data.num_workers=0",
        ]
    )
    dm = instantiate(cfg.data)
    dm.prepare_data()
    assert len(dm.train_dataset) > 10 and len(dm.val_dataset) > 0
    eos = eos_token_id(dm.tokenizer)
    assert not (dm.train_dataset[:]["input_ids"] == eos).any()  # WikiText rows are lines: no separator
    held_out = dm.tokenizer.decode(dm.val_dataset[0]["input_ids"].tolist())
    assert held_out.strip() and held_out.split()[0] in " ".join(wiki_docs[-2]["text"].split()[:200]) + " = \n"


@pytest.mark.slow
def test_slimpajama_streams_from_a_local_copy_in_the_hub_layout(make_config, tmp_path: Path, wiki_docs) -> None:
    repo = make_slimpajama(tmp_path / "slimpajama", wiki_docs)
    cfg = make_config(
        [
            "data=slimpajama",
            f"data.path={repo}",
            "data.block_size=32",
            "data.batch_size=4",
            "data.tokenizer_vocab_size=400",
            "data.num_workers=0",
            "data.shuffle_buffer=50",
        ]
    )
    dm = instantiate(cfg.data)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (4, 33)
    assert sum(1 for _ in dm.val_dataloader()) > 0
    assert dm.token_counts.sum() > 1000 and dm.unigram_perplexity() > 1


def test_hub_dataset_offline_fails_fast_saying_what_is_missing(make_config) -> None:
    cfg = make_config(["data=wikitext103", "data.num_workers=0"])
    with pytest.raises(ConfigError) as err:
        instantiate(cfg.data).prepare_data()
    message = str(err.value)
    assert "Salesforce/wikitext" in message and "wikitext-103-raw-v1" in message
    assert "Run once with internet access" in message and err.value.key == "data.path"


def test_missing_files_and_empty_corpus_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data\.files: no files match"):
        files_module(tmp_path / "nope" / "*.txt", tmp_path / "cache").prepare_data()
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n\n")
    with pytest.raises(ConfigError, match=r"data\.files: .*empty\.txt is empty"):  # the file is named now
        files_module(empty, tmp_path / "cache").prepare_data()
    short = tmp_path / "short.txt"
    short.write_text("one paragraph.\n\nanother paragraph.\n\na third one.")
    with pytest.raises(ConfigError, match="fewer tokens than one block"):
        files_module(short, tmp_path / "cache", block_size=64).prepare_data()


def test_hub_tokenizer_offline_fails_fast_naming_the_key(tmp_path: Path) -> None:
    from attnlab.models.checkpoint import load_pretrained_tokenizer

    with pytest.raises(ConfigError) as err:
        load_pretrained_tokenizer("attnlab-tests/not-a-cached-repo")
    assert err.value.key == "model.tokenizer" and "not in the local cache" in str(err.value)
    with pytest.raises(ConfigError, match=r"no tokenizer\.json"):
        load_pretrained_tokenizer(str(tmp_path))


# ---------------------------------------------------------------- Bigram-Backcopy (Guo et al. 2024)


def test_backcopy_sequences_follow_the_bigram_except_after_a_trigger_which_copies_the_token_before_it() -> None:
    """Guo et al.'s rule: the first token is never a trigger; after a trigger (ids below ``triggers``) comes the token
    before it; any other token is followed by a draw from its bigram row (here: only its two successors)."""
    from attnlab.data.backcopy import backcopy_sequences

    vocabulary, triggers = 8, 2
    transition = np.zeros((vocabulary, vocabulary))
    for token in range(vocabulary):
        transition[token, [(token + 1) % vocabulary, (token + 3) % vocabulary]] = 0.5
    marginal = np.full(vocabulary, 1 / vocabulary)
    sequences = backcopy_sequences(marginal, transition, triggers, count=300, length=40, seed=0)
    assert sequences.shape == (300, 40) and (sequences[:, 0] >= triggers).all()
    previous, current, following = sequences[:, :-2], sequences[:, 1:-1], sequences[:, 2:]
    after_trigger = current < triggers
    assert after_trigger.mean() > 0.1  # the rule is exercised
    assert (following[after_trigger] == previous[after_trigger]).all()
    steps = (following[~after_trigger] - current[~after_trigger]) % vocabulary
    assert set(np.unique(steps)) == {1, 3}


def test_the_bigram_backcopy_option_packs_one_sequence_per_block_bos_first(data_cache: Path) -> None:
    """``data=bigram_backcopy``: each block is <s> and block_size tokens of one sequence; the held-out analysis
    regenerates the same held-out sequences from the run's recorded settings."""
    from attnlab.data.backcopy import bigram_backcopy_datamodule
    from attnlab.eval.heldout import heldout_dataset

    settings = {"block_size": 16, "train_sequences": 60, "val_sequences": 12, "source": "bigram_backcopy"}
    datamodule = bigram_backcopy_datamodule(**settings, cache_dir=str(data_cache), batch_size=4)
    datamodule.prepare()
    bos = datamodule.tokenizer.token_to_id("<s>")
    blocks = np.stack([row["input_ids"].numpy() for row in datamodule.train_dataset])
    assert blocks.shape == (60, 17) and (blocks[:, 0] == bos).all() and not (blocks[:, 1:] == bos).any()
    held_out = heldout_dataset(data={**settings, "batch_size": 4}, cache_dir=str(data_cache))
    assert sorted(held_out["test"]["text"]) == sorted(datamodule.validation_documents()["text"])
    assert len(held_out["test"]) == 12


def test_two_builds_of_one_corpus_at_once_leave_one_whole_file(tmp_path: Path) -> None:
    """Jobs sharing a cache build the same corpus side by side (a sweep's first jobs): each writes through a temporary
    file of its own, so neither writes into the other's file nor loses its rename to it."""
    from attnlab.data.corpus import write_once

    target = tmp_path / "corpus.jsonl"
    documents = [{"title": str(index), "text": f"document {index}"} for index in range(4)]

    def while_another_job_builds() -> Iterator[dict[str, str]]:
        for index, document in enumerate(documents):
            if index == 2:  # the other job starts and finishes while this one is halfway
                write_once(target, iter(documents))
            yield document

    assert write_once(target, while_another_job_builds()) == target
    assert [json.loads(line) for line in target.read_text().splitlines()] == documents
    assert [path.name for path in tmp_path.iterdir()] == ["corpus.jsonl"]  # no temporary file left behind
