"""Datasets: the embedded review-sentiment task, and loaders for user files and HF datasets.

The embedded task is generated, seeded and offline. It is built to need more than word spotting:
- negation flips a clause ("was not great" is negative),
- counterfactual comparisons invert the adjective ("could have been better" is negative),
- in a contrast ("X, but Y", "although X, Y", "Y, even though X") the main clause Y decides,
- three classes (negative / neutral / positive), several templates and filler phrases,
- 5 % of the labels are redrawn at random, so even a perfect model tops out near 95 % accuracy and
  the metric does not saturate — optimizers stay distinguishable.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import datasets

LABELS = ("negative", "neutral", "positive")
LABEL_NOISE = 0.05
DATA_SEED = 1234  # fixed: every trial of a sweep trains and evaluates on the same examples
TRAIN_SIZE = 4000
EVAL_SIZE = 1000

_ASPECTS = ["the food", "the service", "the staff", "the room", "the price", "the plot", "the acting",
            "the battery", "the screen", "the delivery", "the support team", "the design", "the sound",
            "the checkout", "the manual", "the location"]
_POSITIVE = ["great", "excellent", "wonderful", "superb", "delightful", "friendly", "reliable",
             "impressive", "fantastic", "pleasant", "outstanding", "helpful"]
_NEGATIVE = ["terrible", "awful", "disappointing", "rude", "broken", "bland", "slow", "dreadful",
             "poor", "useless", "unpleasant", "frustrating"]
_NEUTRAL = ["average", "ordinary", "standard", "typical", "unremarkable", "as expected", "adequate",
            "middle of the road"]
_NEGATORS = ["not", "never", "hardly", "not at all"]
_BETTER = ["better", "nicer", "friendlier", "smoother", "more reliable"]
_WORSE = ["worse", "slower", "ruder", "more broken", "more disappointing"]
_VERBS = ["was", "is", "seemed", "felt", "turned out to be"]
_FILLERS = ["", "", "", "honestly, ", "to be fair, ", "overall, ", "after two visits, ", "in short, ",
            "for what it is worth, "]


def _counterfactual(aspect: str, rng: random.Random, polarity: int) -> str:
    """'could (not) have been better/worse': the comparison, not the adjective, carries the meaning."""
    if polarity > 0:
        return f"{aspect} could not have been {rng.choice(_BETTER)}"
    if polarity < 0:
        if rng.random() < 0.5:
            return f"{aspect} could have been {rng.choice(_BETTER)}"
        return f"{aspect} could not have been {rng.choice(_WORSE)}"
    return f"{aspect} could have been {rng.choice(_WORSE)}"


def _clause(rng: random.Random, polarity: int) -> str:
    """A clause whose meaning has the given polarity (-1, 0, +1): by an adjective, a negated adjective
    of the opposite sign, or a counterfactual comparison."""
    aspect, verb = rng.choice(_ASPECTS), rng.choice(_VERBS)
    if rng.random() < 0.25:
        return _counterfactual(aspect, rng, polarity)
    if polarity == 0:
        return f"{aspect} {verb} {rng.choice(_NEUTRAL)}"
    negate = rng.random() < 0.4
    lexicon_sign = -polarity if negate else polarity
    adjective = rng.choice(_POSITIVE if lexicon_sign > 0 else _NEGATIVE)
    return f"{aspect} {verb} {rng.choice(_NEGATORS) + ' ' if negate else ''}{adjective}"


def _example(rng: random.Random) -> tuple[str, int]:
    polarity = rng.choice((-1, 0, 1))
    main = _clause(rng, polarity)
    other = _clause(rng, rng.choice([p for p in (-1, 0, 1) if p != polarity]))
    template = rng.randrange(5)
    if template == 0:
        text = main
    elif template == 1:
        text = f"{other}, but {main}"
    elif template == 2:
        text = f"although {other}, {main}"
    elif template == 3:
        text = f"{main}, even though {other}"
    else:
        text = f"{main} and {_clause(rng, polarity)}"  # agreeing clauses
    return rng.choice(_FILLERS) + text + ".", polarity + 1


def generate_reviews(size: int, seed: int) -> datasets.Dataset:
    """`size` labelled reviews; the same (size, seed) always gives the same dataset."""
    import datasets  # here, not at import: the registry's names and metadata need no dataset library

    rng = random.Random(seed)
    texts, labels = [], []
    for _ in range(size):
        text, label = _example(rng)
        if rng.random() < LABEL_NOISE:
            label = rng.randrange(len(LABELS))
        texts.append(text)
        labels.append(label)
    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=list(LABELS))})
    return datasets.Dataset.from_dict({"text": texts, "label": labels}, features=features)


@functools.cache
def embedded_splits() -> tuple[datasets.Dataset, datasets.Dataset]:
    """Train and eval splits of the embedded task, drawn from disjoint seeds. Built once per process (the
    forkserver builds it before forking trials: process/warm.py); datasets are immutable, so sharing is safe."""
    return generate_reviews(TRAIN_SIZE, DATA_SEED), generate_reviews(EVAL_SIZE, DATA_SEED + 1)


class DatasetError(ValueError):
    """A dataset that cannot be found, read or used; the message says what to do instead."""


_FILE_BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
OFFLINE_HINT = "the offline default is the embedded dataset (omit --dataset)"


def _load(source: str) -> datasets.DatasetDict:
    """A local csv/json/parquet file, or an HF dataset `name[:config]` (from the hub or its local cache)."""
    import datasets

    path = Path(source)
    if path.suffix.lower() in _FILE_BUILDERS:
        if not path.is_file():
            raise DatasetError(f"dataset file not found: {source}")
        try:
            return datasets.load_dataset(_FILE_BUILDERS[path.suffix.lower()], data_files=str(path))
        except Exception as exc:  # datasets raises many types for a malformed file
            raise DatasetError(f"cannot read dataset file {source}: {type(exc).__name__}: {exc}") from exc
    name, _, config = source.partition(":")
    try:
        return datasets.load_dataset(name, config or None)
    except Exception as exc:
        raise DatasetError(f"cannot load dataset '{source}' from the Hugging Face hub "
                           f"({type(exc).__name__}); {OFFLINE_HINT}") from exc


def _encode_labels(train: datasets.Dataset, held_out: datasets.Dataset | None, column: str
                   ) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    """String (or any non-class) labels as class ids, one mapping for both splits."""
    import datasets

    combined = train if held_out is None else datasets.concatenate_datasets([train, held_out])
    names = sorted({str(v) for v in combined[column]})
    to_id = {n: i for i, n in enumerate(names)}

    def encode(batch: dict[str, list]) -> dict[str, list]:
        return {column: [to_id[str(v)] for v in batch[column]]}

    def encoded(split: datasets.Dataset) -> datasets.Dataset:
        return split.map(encode, batched=True).cast_column(column, datasets.ClassLabel(names=names))

    return encoded(train), None if held_out is None else encoded(held_out)


def load_user_dataset(source: str, text_column: str, label_column: str | None
                      ) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Train/eval splits from a local csv/json/parquet file or an HF dataset `name[:config]`.

    Uses the dataset's validation (or test) split when it has one, else holds out 10 % of train.
    String labels are encoded to class ids; `label_column=None` reads text only (language modelling).
    """
    import datasets

    # Our own one-line error says what failed; datasets' log lines and progress bars would only repeat it.
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    datasets.disable_progress_bars()
    loaded = _load(source)
    train = loaded["train"] if "train" in loaded else next(iter(loaded.values()))
    for column in (text_column, label_column) if label_column else (text_column,):
        if column not in train.column_names:
            raise DatasetError(f"dataset {source} has no column '{column}' "
                               f"(columns: {', '.join(train.column_names)}); "
                               "pick one with --text-column / --label-column")
    if len(train) < 2:
        raise DatasetError(f"dataset {source} has {len(train)} rows; need at least 2")
    held_out = next((loaded[s] for s in ("validation", "test") if s in loaded), None)
    if label_column and not isinstance(train.features[label_column], datasets.ClassLabel):
        train, held_out = _encode_labels(train, held_out, label_column)
    if label_column and len(set(train[label_column])) < 2:
        raise DatasetError(f"dataset {source} has a single class in '{label_column}'; a classifier needs at "
                           "least 2 (pick another --label-column or dataset)")
    if held_out is None:
        split = train.train_test_split(test_size=0.1, seed=DATA_SEED)
        train, held_out = split["train"], split["test"]
    return train, held_out
