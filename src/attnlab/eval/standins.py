"""Offline stand-ins for Table 3's hub columns, built from the embedded corpus's held-out documents.

``attnlab_lastword`` stands in for LAMBADA (perplexity and greedy accuracy of a passage's last word) and
``attnlab_continuation`` for HellaSwag (pick a sentence's true continuation among distractors from other
documents, scored with acc_norm). Both are lm-eval tasks, so they run through the same harness as the real ones.
"""

from __future__ import annotations

import itertools
import random
import re
from typing import Any

from datasets import Dataset, DatasetDict

from attnlab.eval.heldout import heldout_dataset

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
LAST_WORD = re.compile(r"^(?P<context>.+\S)\s+(?P<word>[A-Za-z]{3,})[.!?]$", re.DOTALL)
MIN_WORDS, MAX_WORDS = 8, 30  # short enough that two sentences fit a 128-token window
CHOICES = 4  # one true continuation and three distractors: chance is 25%


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
    random.Random(int(metadata.get("standin_seed", 1234))).shuffle(rows)  # `limit` then samples every document
    return DatasetDict(test=Dataset.from_list(rows))


def continuation_dataset(**metadata: Any) -> DatasetDict:
    """A sentence, its true next sentence, and next sentences drawn from other documents (HellaSwag-style)."""
    documents = heldout_sentences(metadata)
    rng = random.Random(int(metadata.get("standin_seed", 1234)))
    rows = []
    for index, sentences in enumerate(documents):
        others = [i for i in range(len(documents)) if i != index]
        for context, ending in itertools.pairwise(sentences):
            distractors = [rng.choice(documents[i][1:]) for i in rng.sample(others, CHOICES - 1)]
            label = rng.randrange(CHOICES)
            choices = [*distractors[:label], ending, *distractors[label:]]
            rows.append({"context": context, "choices": choices, "label": label})
    rng.shuffle(rows)
    return DatasetDict(test=Dataset.from_list(rows))
