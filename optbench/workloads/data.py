"""Datasets: the embedded tasks' splits, and loaders for user files and HF datasets.

The embedded classification task is generated (optbench/workloads/reviews.py: compositional reviews with an
invented lexicon, whose exact accuracy ceiling comes from the generator); the embedded language-modelling corpus
is a generated Markov chain (optbench/workloads/markov.py, whose perplexity floor is its entropy rate).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import datasets

from optbench.workloads import reviews

LABELS = reviews.LABELS
DATA_SEED = 1234  # fixed: every trial of a sweep trains and evaluates on the same examples
TRAIN_SIZE = 4000
EVAL_SIZE = 4000  # the study scores on all of it: a point is 40 rows, not 10 (presets.toml)


def generate_reviews(size: int, seed: int) -> datasets.Dataset:
    """`size` labelled reviews with their clean labels (`clean_label`: the label before noise, which the ceiling
    reads); the same (size, seed) always gives the same dataset."""
    import datasets  # here, not at import: the registry's names and metadata need no dataset library

    texts, labels, clean = reviews.generate(size, seed)
    label = datasets.ClassLabel(names=list(LABELS))
    features = datasets.Features({"text": datasets.Value("string"), "label": label, "clean_label": label})
    return datasets.Dataset.from_dict({"text": texts, "label": labels, "clean_label": clean}, features=features)


@functools.cache
def embedded_splits() -> tuple[datasets.Dataset, datasets.Dataset]:
    """Train and eval splits of the embedded task, drawn from disjoint seeds. Built once per process (the
    forkserver builds it before forking trials: sweep/warm.py); datasets are immutable, so sharing is safe."""
    return generate_reviews(TRAIN_SIZE, DATA_SEED), generate_reviews(EVAL_SIZE, DATA_SEED + 1)


class DatasetError(ValueError):
    """A dataset that cannot be found, read or used; the message says what to do instead."""


# A label column with more distinct values than half its rows is text given as labels: most classes would have one
# training example (checked from this many rows on, so that a small hand-made file of a few classes still runs).
MIN_ROWS_FOR_TEXT_CHECK = 10
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
            raise DatasetError(f"cannot read dataset file {source}: {_file_fault(exc)}") from exc
    name, _, config = source.partition(":")
    try:
        return datasets.load_dataset(name, config or None)
    except Exception as exc:
        raise DatasetError(f"cannot load dataset '{source}' from the Hugging Face hub "
                           f"({type(exc).__name__}); {OFFLINE_HINT}") from exc


def _file_fault(exc: BaseException) -> str:
    """What is wrong with a file `datasets` could not read. Its own error ("An error occurred while generating the
    dataset") wraps the reader's, which names the fault: the first error in the chain from outside `datasets`."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    fault = next((e for e in chain if not type(e).__module__.startswith("datasets")), chain[0])
    if isinstance(fault, UnicodeDecodeError):
        return f"it is not UTF-8 text (it holds byte {fault.object[fault.start]:#04x}); save it as UTF-8"
    if type(fault).__name__ == "EmptyDataError":  # pandas: no header line at all
        return "it is empty (not even a header line)"
    return f"{type(fault).__name__}: {fault}"


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


def _refuse_empty_cells(source: str, name: str, split: datasets.Dataset | None, column: str) -> None:
    """Empty cells (None; -1, a ClassLabel's "no label", as in a benchmark's unlabelled test split) made a class
    named "None" (or a label no loss takes) and a text "None", silently: refused, counted, the first one named."""
    import datasets

    if split is None or column not in split.column_names:  # a held-out split without it: said where it is selected
        return
    empty_id = -1 if isinstance(split.features[column], datasets.ClassLabel) else None
    empty = [row for row, value in enumerate(split[column], start=1) if value is None or value == empty_id]
    if empty:
        raise DatasetError(f"dataset {source}: '{column}' is empty in {len(empty)} of its {len(split)} {name} rows "
                           f"(the first: row {empty[0]}); fill or drop them")


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
    columns = (text_column, label_column) if label_column else (text_column,)
    for column in columns:
        if column not in train.column_names:
            raise DatasetError(f"dataset {source} has no column '{column}' "
                               f"(columns: {', '.join(train.column_names)}); "
                               "pick one with --text-column / --label-column")
    if len(train) < 2:
        raise DatasetError(f"dataset {source} has {len(train)} rows; need at least 2")
    if label_column == text_column:
        raise DatasetError(f"--label-column {label_column} is the --text-column too: the model would read its label "
                           "as its input (pick the column that holds the classes)")
    if label_column and not isinstance(train.features[label_column], datasets.ClassLabel):
        classes = len(set(map(str, train[label_column])))
        if len(train) >= MIN_ROWS_FOR_TEXT_CHECK and classes > len(train) / 2:
            raise DatasetError(f"'{label_column}' in {source} has {classes} distinct values in {len(train)} rows: "
                               "text, not classes, which no classifier can learn from one example each (pick the "
                               "column that holds the classes with --label-column)")
    held_out = next((loaded[s] for s in ("validation", "test") if s in loaded), None)
    for name, split in (("train", train), ("held-out", held_out)):
        for column in columns:
            _refuse_empty_cells(source, name, split, column)
    if label_column and not isinstance(train.features[label_column], datasets.ClassLabel):
        train, held_out = _encode_labels(train, held_out, label_column)
    if label_column and len(set(train[label_column])) < 2:
        raise DatasetError(f"dataset {source} has a single class in '{label_column}'; a classifier needs at "
                           "least 2 (pick another --label-column or dataset)")
    if held_out is None:
        split = train.train_test_split(test_size=0.1, seed=DATA_SEED)
        train, held_out = split["train"], split["test"]
    return train, held_out
