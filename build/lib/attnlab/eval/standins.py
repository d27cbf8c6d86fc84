"""Offline stand-ins for Table 3's hub columns, built from the embedded corpus's held-out documents.

``attnlab_lastword`` stands in for LAMBADA (perplexity and greedy accuracy of a passage's last word) and
``attnlab_continuation`` for HellaSwag (a sentence's next word among four of the same corpus frequency, scored
with acc_norm). Both are lm-eval tasks, so they run through the same harness as the real ones.
"""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter
from typing import Any

from datasets import Dataset, DatasetDict

from attnlab.defaults import EVAL_SEED
from attnlab.eval.heldout import heldout_dataset

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
LAST_WORD = re.compile(r"^(?P<context>.+\S)\s+(?P<word>[A-Za-z]{3,})[.!?]$", re.DOTALL)
MIN_WORDS, MAX_WORDS = 8, 30  # short enough that two sentences fit a 128-token window
CHOICES = 4  # one true continuation and three distractors: chance is 25%
WORD = re.compile(r"[A-Za-z]{3,}")  # candidate next words: plain words, no numbers or punctuation
FREQUENCY_WINDOW = 50  # distractors come from the 100 words nearest the target in corpus frequency rank


def heldout_sentences(metadata: dict[str, Any]) -> list[list[str]]:
    """Each held-out paragraph as its list of sentences of ``MIN_WORDS`` to ``MAX_WORDS`` words (headings dropped)."""
    docs = heldout_dataset(**metadata)["test"]["text"]
    documents = []
    for text in docs:
        for paragraph in text.split("\n"):
            sentences = [s.strip() for s in SENTENCE_END.split(paragraph) if MIN_WORDS <= len(s.split()) <= MAX_WORDS]
            if len(sentences) >= 2:
                documents.append(sentences)
    return documents


def lastword_dataset(**metadata: Any) -> DatasetDict:
    """Two consecutive sentences; the target is the final word of the second (LAMBADA-style, no hub)."""
    rows = []
    for sentences in heldout_sentences(metadata):
        for previous, sentence in itertools.pairwise(sentences):
            match = LAST_WORD.match(sentence)
            if match:
                rows.append({"context": f"{previous} {match['context']}", "target": f" {match['word']}"})
    random.Random(int(metadata.get("standin_seed", EVAL_SEED))).shuffle(rows)  # `limit` then samples every document
    return DatasetDict(test=Dataset.from_list(rows))


def continuation_dataset(**metadata: Any) -> DatasetDict:
    """HellaSwag's shape (a context, four endings, acc_norm) at a size a small model can score on: the previous
    sentence and the start of a sentence as context, the sentence's next word among three distractors of the same
    corpus frequency (so choosing the common word gains nothing: only reading the context does)."""
    documents = heldout_sentences(metadata)
    counts = Counter(word for sentences in documents for s in sentences for word in s.split() if WORD.fullmatch(word))
    by_frequency = [word for word, _ in counts.most_common()]
    rank = {word: i for i, word in enumerate(by_frequency)}
    rng = random.Random(int(metadata.get("standin_seed", EVAL_SEED)))
    rows = []
    for previous, sentence in itertools.pairwise(itertools.chain.from_iterable(documents)):
        words = sentence.split()
        positions = [i for i in range(len(words) // 2, len(words)) if WORD.fullmatch(words[i])]
        if not positions:
            continue
        at = rng.choice(positions)
        target = words[at]
        lo = max(0, rank[target] - FREQUENCY_WINDOW)
        neighbours = [w for w in by_frequency[lo : rank[target] + FREQUENCY_WINDOW + 1] if w.lower() != target.lower()]
        label = rng.randrange(CHOICES)
        distractors = rng.sample(neighbours, CHOICES - 1)
        choices = [f" {w}" for w in [*distractors[:label], target, *distractors[label:]]]
        rows.append({"context": f"{previous} {' '.join(words[:at])}", "choices": choices, "label": label})
    rng.shuffle(rows)
    return DatasetDict(test=Dataset.from_list(rows))
