"""One LightningDataModule for every text source: load with ``datasets``, tokenize, pack into blocks, cache."""

from __future__ import annotations

import hashlib
import logging
import math
import shutil
from collections.abc import Iterator
from itertools import chain, islice
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from datasets import Dataset, DatasetDict, Features, IterableDataset, Sequence, Value, load_dataset, load_from_disk
from datasets.distributed import split_dataset_by_node
from filelock import FileLock
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from attnlab.data.corpus import CORPUS_VERSION, wiki_sample_documents, write_once
from attnlab.data.registry import registry_corpus_file
from attnlab.data.text_files import corpus_sha256, resolve_text_files
from attnlab.data.tokenizer import eos_token_id, train_bpe_tokenizer
from attnlab.defaults import DATA_SEED
from attnlab.defaults import cache_dir as default_cache_dir
from attnlab.digest import digest
from attnlab.errors import ConfigError, require, require_choice
from attnlab.hub import use_cache_only_if_offline
from attnlab.models.checkpoint import load_pretrained_tokenizer

log = logging.getLogger(__name__)

SOURCES = ("wiki_sample", "registry", "files", "hub")
SEPARATORS = ("eos", "none")  # what goes between rows: WikiText rows are lines that carry their own newline
CACHE_VERSION = 2  # bump when the packing format changes (2: uint16 ids where the vocabulary fits, tokenizer.json)


class TextDataModule(L.LightningDataModule):
    """Documents -> token ids (+ end-of-text between documents) -> disjoint blocks of ``block_size + 1`` tokens.

    Each block yields inputs ``[:-1]`` and next-token targets ``[1:]``. Map-style sources are packed once and
    saved under ``cache_dir/packed/<key>``, with the key covering everything that changes the result;
    streaming sources (SlimPajama) are tokenized and packed on the fly.
    """

    def __init__(
        self,
        name: str,
        source: str,
        path: str | None = None,
        config_name: str | None = None,
        files: list[str] | str | None = None,
        text_field: str = "text",
        document_separator: str = "eos",
        document_mask: bool = False,
        train_split: str = "train",
        val_split: str | None = None,
        val_fraction: float = 0.05,
        streaming: bool = False,
        val_max_documents: int | None = None,
        tokenizer: str | None = None,
        tokenizer_vocab_size: int = 8192,
        tokenizer_train_documents: int = 20000,
        block_size: int = 256,
        batch_size: int = 16,
        num_workers: int = 0,
        shuffle_buffer: int = 10000,
        seed: int = DATA_SEED,
        shuffle_seed: int | None = None,
        cache_dir: str | None = None,
        packed_dir: str | None = None,
    ) -> None:
        super().__init__()
        require_choice(source, SOURCES, "data.source")
        require_choice(document_separator, SEPARATORS, "data.document_separator")
        require(isinstance(document_mask, bool), "data.document_mask", f"must be true or false, got {document_mask!r}")
        require(
            not document_mask or document_separator == "eos",
            "data.document_mask",
            "needs data.document_separator=eos: without a token between documents there are no boundaries to mask",
        )
        if source == "hub" and not path:
            raise ConfigError("data.path", "data.source=hub needs a dataset name, e.g. Salesforce/wikitext")
        if not 0.0 < val_fraction < 1.0 and val_split is None:
            raise ConfigError("data.val_fraction", f"must be in (0, 1), got {val_fraction}")
        self.name, self.source, self.path, self.config_name = name, source, path, config_name
        self.files = [files] if isinstance(files, str) else list(files or [])
        self.document_separator, self.document_mask = document_separator, document_mask
        self.text_field, self.train_split, self.val_split = text_field, train_split, val_split
        self.val_fraction, self.streaming, self.val_max_documents = val_fraction, streaming, val_max_documents
        self.tokenizer_name, self.tokenizer_vocab_size = tokenizer, tokenizer_vocab_size
        self.tokenizer_train_documents = tokenizer_train_documents
        self.block_size, self.batch_size, self.num_workers = block_size, batch_size, num_workers
        self.shuffle_buffer, self.seed = shuffle_buffer, seed
        # the split and tokenizer follow ``seed``; the batch order follows ``shuffle_seed`` (the run's seed)
        self.shuffle_seed = seed if shuffle_seed is None else shuffle_seed
        self.cache_dir = Path(cache_dir or default_cache_dir())
        self.packed_dir = Path(packed_dir) if packed_dir else None
        self.tokenizer: Tokenizer | None = None
        self.train_dataset: Dataset | IterableDataset | None = None
        self.val_dataset: Dataset | IterableDataset | None = None
        self.token_counts: np.ndarray | None = None  # unigram counts of the training tokens (or a sample)
        self.reused_cache = False
        self._split_by_node = False  # streaming DDP: each rank's shard is taken once

    # ---------------------------------------------------------------- public facts the model needs
    @property
    def vocab_size(self) -> int:
        self.prepare()
        return self.tokenizer.get_vocab_size()

    @property
    def document_separator_id(self) -> int | None:
        """The token that ends each document when attention is masked by document (``data.document_mask``), else
        None: the model's loss turns it into document ids (``attnlab.models.gpt.document_ids``)."""
        if not self.document_mask:
            return None
        self.prepare()
        return eos_token_id(self.tokenizer)

    def training_documents(self) -> Dataset | IterableDataset:
        """The training documents as text rows (W8A8 calibrates on them, as the reference does)."""
        return self._documents()[0]

    def validation_documents(self) -> Dataset | IterableDataset:
        """The held-out documents as text rows, for scoring with lm-eval's rolling perplexity."""
        return self._documents()[1]

    def corpus_sha256(self) -> str | None:
        """The local corpus's content name for the run's record (``text_files.corpus_sha256``); a packed folder's key
        already holds its text."""
        return corpus_sha256(self.source, self.files, self.cache_dir) if self.packed_dir is None else None

    def unigram_perplexity(self) -> float:
        """Validation perplexity of the add-one unigram model fitted on the training tokens: the baseline to beat."""
        self.prepare()
        counts = self.token_counts.astype(np.float64) + 1.0
        log_prob = np.log(counts / counts.sum())
        total, n = 0.0, 0
        for batch in self._iter_val_targets():
            total -= log_prob[batch].sum()
            n += batch.size
        return math.exp(total / max(n, 1))

    # ---------------------------------------------------------------- Lightning hooks
    def prepare_data(self) -> None:
        self.prepare()

    def setup(self, stage: str | None = None) -> None:
        self.prepare()
        if self.streaming and self.trainer is not None and self.trainer.world_size > 1 and not self._split_by_node:
            self._split_by_node = True
            rank, world = self.trainer.global_rank, self.trainer.world_size
            self.train_dataset = split_dataset_by_node(self.train_dataset, rank=rank, world_size=world)

    def train_dataloader(self) -> StatefulDataLoader:
        """Stateful: Lightning saves its position (sampler, generator, workers) in each checkpoint and restores it.

        ``batch_size`` is per process. Under DDP, process r of N takes positions r, r + N, ... of the permutation a
        single process draws for its first epoch (cut to a multiple of N, where Lightning's own sampler would pad it
        with repeated blocks): step k of N processes with batch b covers positions [kNb, (k + 1)Nb), one process's
        step k with batch N x b (or b with N accumulated batches), for as many steps. Later epochs reshuffle with
        ``shuffle_seed + epoch`` (torch's DistributedSampler), while one process goes on drawing from its generator."""
        if self.streaming:
            return StatefulDataLoader(self.train_dataset, batch_size=self.batch_size, num_workers=self.num_workers)
        generator = torch.Generator().manual_seed(self.shuffle_seed)
        sampler = None
        if self._world_size() > 1:  # Lightning leaves a DistributedSampler it is given as it is
            rank, world = self.trainer.global_rank, self._world_size()
            sampler = DistributedSampler(
                self.train_dataset, num_replicas=world, rank=rank, shuffle=True, seed=self.shuffle_seed, drop_last=True
            )
        return StatefulDataLoader(
            self.train_dataset,
            batch_size=self.batch_size,
            shuffle=sampler is None,
            sampler=sampler,
            drop_last=True,
            generator=generator,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def val_dataloader(self) -> DataLoader:
        """Under DDP each process scores every N-th block, none twice (Lightning's default sampler would repeat
        blocks to even the shares out), so the synced val/loss is the single-process one."""
        sampler = None
        if self._world_size() > 1 and not self.streaming:  # a stream is scored whole by every process
            sampler = UnrepeatedDistributedSampler(
                self.val_dataset, num_replicas=self._world_size(), rank=self.trainer.global_rank, shuffle=False
            )
        return DataLoader(self.val_dataset, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers)

    def _world_size(self) -> int:
        return self.trainer.world_size if self.trainer is not None else 1

    # ---------------------------------------------------------------- building
    def prepare(self) -> None:
        """Load, tokenize and pack once per process; the disk cache is shared between runs and ranks."""
        if self.train_dataset is not None:
            return
        if self.packed_dir is not None:
            self._load_packed_dir(self.packed_dir)
            return
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.cache_dir / "prepare.lock")):
            train_docs, val_docs = self._documents()
            self.tokenizer = self._load_tokenizer(train_docs)
            if self.streaming:
                self._prepare_streaming(train_docs, val_docs)
            else:
                self._prepare_packed(train_docs, val_docs)

    def _documents(self) -> tuple[Dataset | IterableDataset, Dataset | IterableDataset]:
        if self.source == "wiki_sample":
            raw = load_dataset("json", data_files=str(self._wiki_sample_file()), split="train")
        elif self.source == "registry":
            raw = load_dataset("json", data_files=str(registry_corpus_file(self.cache_dir)), split="train")
        elif self.source == "files":
            raw = load_dataset("text", data_files=resolve_text_files(self.files), sample_by="paragraph", split="train")
        else:
            return self._hub_split(self.train_split), self._hub_split(self.val_split or "validation")
        raw = self._non_empty(raw)
        if len(raw) < 2:
            raise ConfigError(f"data ({self.name})", f"the corpus has {len(raw)} non-empty documents; need at least 2")
        split = raw.train_test_split(test_size=self.val_fraction, seed=self.seed, shuffle=True)
        return split["train"], split["test"]

    def _wiki_sample_file(self) -> Path:
        target = self.cache_dir / "corpus" / f"wiki_sample-v{CORPUS_VERSION}.jsonl"
        if not target.exists():
            log.info("Preparing the embedded Wikipedia corpus (once) -> %s", target)
        return write_once(target, wiki_sample_documents())

    def _hub_split(self, split: str) -> Dataset | IterableDataset:
        is_local = Path(self.path).exists()
        offline = False if is_local else use_cache_only_if_offline()
        try:
            ds = load_dataset(self.path, self.config_name, split=split, streaming=self.streaming)
        except Exception as exc:
            what = f"dataset {self.path!r}" + (f" (config {self.config_name!r})" if self.config_name else "")
            if offline:
                raise ConfigError(
                    "data.path",
                    f"{what}, split {split!r}, needs the Hugging Face hub, which is unreachable, and it is not in "
                    "the local cache. Run once with internet access (it is cached under ~/.cache/huggingface), "
                    "or set data.path to a local copy with the same files.",
                ) from exc
            raise ConfigError("data.path", f"could not load {what}, split {split!r}: {exc}") from exc
        if self.streaming and split != self.train_split and self.val_max_documents:
            ds = ds.take(self.val_max_documents)
        return self._non_empty(ds)

    def _non_empty(self, ds: Dataset | IterableDataset) -> Dataset | IterableDataset:
        """Drop whitespace-only rows (blank WikiText lines, empty paragraphs)."""
        if ds.column_names is not None and self.text_field not in ds.column_names:
            raise ConfigError("data.text_field", f"{self.text_field!r} not in columns {ds.column_names}")
        return ds.filter(lambda text: bool(text.strip()), input_columns=self.text_field)

    def _load_tokenizer(self, train_docs: Dataset | IterableDataset) -> Tokenizer:
        if self.tokenizer_name:
            return load_pretrained_tokenizer(self.tokenizer_name)
        key = digest({"data": self._identity(train_docs), "vocab": self.tokenizer_vocab_size})
        path = self.cache_dir / "tokenizers" / f"bpe-{key}.json"
        if path.exists():
            return Tokenizer.from_file(str(path))
        log.info("Training a %d-token byte-level BPE on the training split", self.tokenizer_vocab_size)
        texts = (row[self.text_field] for row in self._sample(train_docs))
        tokenizer = train_bpe_tokenizer(texts, self.tokenizer_vocab_size)
        path.parent.mkdir(parents=True, exist_ok=True)
        tokenizer.save(str(path))
        return tokenizer

    def _sample(self, docs: Dataset | IterableDataset) -> Iterator[dict[str, Any]]:
        """All documents of a map-style split; the first ``tokenizer_train_documents`` of a stream."""
        return islice(iter(docs), self.tokenizer_train_documents) if self.streaming else iter(docs)

    def _identity(self, docs: Dataset | IterableDataset) -> dict[str, Any]:
        identity = {"name": self.name, "source": self.source, "path": self.path, "config": self.config_name}
        identity.update(text_field=self.text_field, seed=self.seed, val=[self.val_split, self.val_fraction])
        identity.update(train_split=self.train_split)
        if self.streaming:  # no fingerprint: the tokenizer's sample is the first documents of the stream
            identity["sample_documents"] = self.tokenizer_train_documents
        if self.source in ("registry", "files"):  # the content, not datasets' fingerprint of the files' paths and
            identity["corpus_sha256"] = self.corpus_sha256()  # mtimes: a tokenizer carried elsewhere is reused
        elif isinstance(docs, Dataset):
            identity["fingerprint"] = docs._fingerprint
        return identity

    def _tokenizer_identity(self) -> str:
        return hashlib.sha256(self.tokenizer.to_str().encode()).hexdigest()[:16]

    def _tokenize_and_pack(self, docs: Dataset | IterableDataset, **map_kwargs: Any) -> Dataset | IterableDataset:
        tokenizer, width = self.tokenizer, self.block_size + 1
        separator = [eos_token_id(tokenizer)] if self.document_separator == "eos" else []

        def tokenize(texts: list[str]) -> dict[str, list[list[int]]]:
            return {"ids": [enc.ids + separator for enc in tokenizer.encode_batch(texts)]}

        def pack(ids: list[list[int]]) -> dict[str, list[list[int]]]:
            flat = list(chain.from_iterable(ids))
            return {"input_ids": [flat[i : i + width] for i in range(0, len(flat) - width + 1, width)]}

        columns = docs.column_names
        tokens = docs.map(tokenize, batched=True, input_columns=self.text_field, remove_columns=columns, **map_kwargs)
        # uint16 where the vocabulary fits halves the cache (formatted as int64 tensors either way)
        dtype = "uint16" if tokenizer.get_vocab_size() <= 2**16 else "int32"
        features = Features({"input_ids": Sequence(Value(dtype))})
        return tokens.map(
            pack, batched=True, input_columns="ids", remove_columns="ids", features=features, **map_kwargs
        )

    def _prepare_packed(self, train_docs: Dataset, val_docs: Dataset) -> None:
        key = digest(
            {
                "v": CACHE_VERSION,
                "train": self._identity(train_docs),
                "val": self._identity(val_docs),
                "tokenizer": self._tokenizer_identity(),
                "block_size": self.block_size,
                "separator": self.document_separator,
            }
        )
        target = self.cache_dir / "packed" / key
        self.reused_cache = (target / "token_counts.npy").exists()
        if not self.reused_cache:
            log.info("Tokenizing and packing %s into blocks of %d tokens -> %s", self.name, self.block_size, target)
            build = target.with_name(key + ".building")
            shutil.rmtree(build, ignore_errors=True)
            build.mkdir(parents=True)
            packed = DatasetDict(
                train=self._tokenize_and_pack(train_docs, keep_in_memory=True),
                validation=self._tokenize_and_pack(val_docs, keep_in_memory=True),
            )
            for split, ds in packed.items():
                if len(ds) == 0:
                    raise ConfigError(
                        f"data ({self.name})",
                        f"the {split} split has fewer tokens than one block of data.block_size+1="
                        f"{self.block_size + 1}; use more text or a smaller block_size",
                    )
            packed.save_to_disk(str(build / "blocks"))
            np.save(build / "token_counts.npy", _count_tokens(packed["train"], self.tokenizer.get_vocab_size()))
            self.tokenizer.save(str(build / "tokenizer.json"))  # so the folder alone can train (data.packed_dir)
            shutil.rmtree(target, ignore_errors=True)
            build.rename(target)
        else:
            log.info("Reusing packed %s from %s", self.name, target)
        self._load_blocks(target)

    def _load_blocks(self, target: Path) -> None:
        packed = load_from_disk(str(target / "blocks")).with_format("torch")
        self.train_dataset, self.val_dataset = packed["train"], packed["validation"]
        self.token_counts = np.load(target / "token_counts.npy")

    def _load_packed_dir(self, target: Path) -> None:
        """Train from a packed cache folder carried from another machine, without its documents (a GPU machine
        with no network): blocks, token counts and the tokenizer are all in it."""
        missing = [name for name in ("blocks", "token_counts.npy", "tokenizer.json") if not (target / name).exists()]
        if missing:
            raise ConfigError(
                "data.packed_dir", f"{target} is not a packed cache folder (no {', '.join(missing)}); use a folder "
                f"under {self.cache_dir / 'packed'} written by a run with the same data option"
            )  # fmt: skip
        self.tokenizer = Tokenizer.from_file(str(target / "tokenizer.json"))
        self._load_blocks(target)
        width = len(self.train_dataset[0]["input_ids"])
        if width != self.block_size + 1:
            raise ConfigError(
                "data.packed_dir",
                f"{target} holds blocks of {width - 1} tokens, but data.block_size is {self.block_size}",
            )
        self.reused_cache = True

    def _prepare_streaming(self, train_docs: IterableDataset, val_docs: IterableDataset) -> None:
        shuffled = train_docs.shuffle(seed=self.shuffle_seed, buffer_size=self.shuffle_buffer)
        self.train_dataset = self._tokenize_and_pack(shuffled).with_format("torch")
        self.val_dataset = self._tokenize_and_pack(val_docs).with_format("torch")
        sample = Dataset.from_list(list(self._sample(train_docs)))
        self.token_counts = _count_tokens(self._tokenize_and_pack(sample), self.tokenizer.get_vocab_size())

    def _iter_val_targets(self) -> Iterator[np.ndarray]:
        for row in self.val_dataset:
            yield np.asarray(row["input_ids"])[1:]


def _count_tokens(blocks: Dataset, vocab_size: int) -> np.ndarray:
    counts = np.zeros(vocab_size, dtype=np.int64)
    for batch in blocks.with_format("numpy").iter(batch_size=4096):
        counts += np.bincount(np.asarray(batch["input_ids"]).reshape(-1), minlength=vocab_size)
    return counts
