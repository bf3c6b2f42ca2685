"""Causal language modelling: a decoder-only model learns next-token prediction.

Default: a Llama-style decoder from a transformers config (4 layers, width 512, untied 1,024-token embedding and
head: 13.1 M parameters, randomly initialised, so this is training from scratch) on the embedded Markov corpus
(optbench/workloads/markov.py): token ids drawn from a sparse Markov chain, read by the model directly, whose
perplexity floor on the eval tokens is known exactly (the record's `metric_ceiling`) beside the unigram
perplexity of the same tokens (`metric_chance`: where a model that learned no context sits). `--dataset` takes
any text column (`--text-column`), tokenized with the shipped MiniLM tokenizer (its floor is unknown; its
unigram perplexity is still computed); `--model` any local or HF causal LM (its own tokenizer).

Texts are joined with the separator token and packed into blocks of `seq_len` tokens, as causal-LM
recipes do, so no step trains on padding; the Markov streams are cut into blocks the same way. Metrics: eval
loss (mean next-token cross-entropy), perplexity (its exponential; the target metric, smaller is better) and
next-token accuracy.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from optbench.workloads import markov
from optbench.workloads.base import (
    Built,
    Split,
    Workload,
    WorkloadError,
    check_batch_fits,
    check_model,
    check_positions,
    eval_batches,
    load_tokenizer,
    model_config,
    on_meta_device,
    quiet_transformers,
    split_for_stage,
    user_splits,
)

if TYPE_CHECKING:
    import torch

    from optbench.job.spec import TrialSpec

MARKOV_NAME = "markov-chain"

# ~13 M parameters, nearly all in the decoder layers: big enough that state bytes dominate the step like they do
# in real LMs, small enough for a 2-core CPU; heads of 64 dims, SwiGLU width about 2.7x hidden as in Llama.
LM_HIDDEN_SIZE = 512
LM_LAYERS = 4
LM_HEADS = 8
LM_INTERMEDIATE_SIZE = 1376


def llama_config(vocab_size: int, seq_len: int):
    """The default decoder's config: positions for `seq_len` tokens, at least 128 (rotary: no parameters)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=LM_HIDDEN_SIZE, intermediate_size=LM_INTERMEDIATE_SIZE,
                       num_hidden_layers=LM_LAYERS, num_attention_heads=LM_HEADS, num_key_value_heads=LM_HEADS,
                       max_position_embeddings=max(seq_len, 128), tie_word_embeddings=False)


def scratch_config(dataset: str | None, seq_len: int):
    """The config of the decoder a job without `--model` trains: the Markov corpus's vocabulary, or the MiniLM
    tokenizer's for a user's text (what the memory predictor and `explain` build too)."""
    vocab = markov.VOCAB_SIZE if dataset is None else len(load_tokenizer(None))
    return llama_config(vocab, seq_len)


def blocks(stream: list[int] | torch.Tensor, seq_len: int) -> Split:
    """A token stream cut into full blocks of seq_len (the tail that fills no block is dropped)."""
    import torch

    count = len(stream) // seq_len
    if count < 2:
        raise ValueError(f"the text holds {len(stream)} tokens: fewer than two blocks of --seq-len {seq_len}")
    ids = torch.as_tensor(stream[: count * seq_len], dtype=torch.long).view(count, seq_len)
    return {"input_ids": ids, "labels": ids.clone()}  # HF causal LMs shift labels themselves


def pack(tokenizer, texts: list[str], seq_len: int) -> Split:
    """Tokenize, join with the separator (or end-of-text) token and cut into full blocks of seq_len."""

    separator = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    stream: list[int] = []
    for ids in tokenizer([str(t) for t in texts], add_special_tokens=False)["input_ids"]:
        stream.extend(ids)
        if separator is not None:
            stream.append(separator)
    return blocks(stream, seq_len)


def unigram_perplexity(ids: torch.Tensor) -> float:
    """The perplexity of the predicted tokens' own frequencies on them (every token of a block but its first,
    which the eval scores only as context): the best any model that ignores the context can score on exactly these
    tokens, so a model at or above it has learned nothing of the context."""
    import torch

    targets = ids[:, 1:].reshape(-1)
    shares = torch.bincount(targets).double()
    shares = shares[shares > 0] / targets.numel()
    return math.exp(float(-(shares * shares.log()).sum()))


class CausalLM(Workload):
    name = "lm"
    target_metric = "perplexity"
    target_mode = "min"
    target_range = (1.0, math.inf)
    description = "Llama-style decoder, next-token loss on the Markov corpus or text (random init: from scratch)"

    def lr_scale(self, spec: TrialSpec) -> float:
        # The registry's lrs are for fine-tuning; from random init 20x larger (AdamW 1e-3) trains well.
        return 1.0 if spec.model else 20.0

    def model_name(self, spec: TrialSpec) -> str:
        return spec.model or f"llama-h{LM_HIDDEN_SIZE}-l{LM_LAYERS}"

    def dataset_name(self, spec: TrialSpec) -> str:
        return spec.dataset or MARKOV_NAME

    def _texts(self, spec: TrialSpec) -> tuple[list[str], list[str]]:
        train, held_out = user_splits(spec, None)
        return train["text"], held_out["text"]

    def held_out_rows(self, spec: TrialSpec) -> int | None:
        return markov.EVAL_TOKENS // spec.seq_len if spec.dataset is None else None  # text: blocks once tokenized

    def check(self, spec: TrialSpec) -> None:
        self.check_options(spec)
        if spec.dataset is not None:
            self._texts(spec)  # its blocks are known once tokenized: a batch too large for them fails the trial
        else:
            check_batch_fits(spec, markov.TRAIN_TOKENS // spec.seq_len)  # its blocks, known without building them
        if spec.model:  # a model from scratch gets positions for --seq-len (llama_config)
            check_positions(spec, check_model(spec.model), spec.model)

    def _splits(self, spec: TrialSpec) -> tuple[Split, Split, int]:
        """(train blocks, held-out blocks, vocabulary size): the Markov streams, or the user's text tokenized."""
        if spec.dataset is None:  # the Markov ids go straight in, whatever the model (its vocabulary must hold them)
            import torch

            train, held_out = markov.streams()
            return (blocks(torch.from_numpy(train), spec.seq_len), blocks(torch.from_numpy(held_out), spec.seq_len),
                    markov.VOCAB_SIZE)
        tokenizer = load_tokenizer(spec.model)
        train_texts, held_out_texts = self._texts(spec)
        return (pack(tokenizer, train_texts, spec.seq_len), pack(tokenizer, held_out_texts, spec.seq_len),
                len(tokenizer))

    def build(self, spec: TrialSpec) -> Built:
        import torch
        from transformers import AutoModelForCausalLM, LlamaForCausalLM

        quiet_transformers()
        train, held_out, vocab = self._splits(spec)
        torch.manual_seed(spec.seed)
        if spec.model:
            model = AutoModelForCausalLM.from_pretrained(spec.model)
            if model.get_input_embeddings().num_embeddings < vocab:
                raise WorkloadError(f"model {spec.model} has fewer than the Markov corpus's {vocab} token ids; "
                                    "give it text with --dataset")
        else:
            model = LlamaForCausalLM(llama_config(vocab, spec.seq_len))
        train, val, evaluation = split_for_stage(spec, train, held_out)
        ids = evaluation["input_ids"]
        floor = markov.bayes_perplexity(ids.numpy()) if spec.dataset is None else None
        return Built(model=model, model_name=self.model_name(spec), dataset_name=self.dataset_name(spec), train=train,
                     val=val, eval=evaluation, chance_loss=math.log(vocab), pretrained=bool(spec.model),
                     metric_ceiling=floor, metric_chance=unigram_perplexity(ids),
                     val_chance=None if val is None else unigram_perplexity(val["input_ids"]))

    def meta_model(self, spec: TrialSpec, local_files_only: bool = False) -> torch.nn.Module:
        if spec.model:
            config = model_config(spec.model, local_files_only)  # before the model classes' heavy import
            from transformers import AutoModelForCausalLM

            return on_meta_device(lambda: AutoModelForCausalLM.from_config(config), spec.model)
        from transformers import LlamaForCausalLM

        config = scratch_config(spec.dataset, spec.seq_len)
        return on_meta_device(lambda: LlamaForCausalLM(config), self.model_name(spec))

    def evaluate(self, model: torch.nn.Module, split: Split, device: torch.device) -> dict[str, float]:
        """Token-weighted mean cross-entropy over the split's next-token predictions."""
        import torch

        total_loss, total_tokens, correct = 0.0, 0, 0
        with torch.no_grad():
            for batch in eval_batches(split, device):
                logits = model(input_ids=batch["input_ids"]).logits[:, :-1].float()
                targets = batch["labels"][:, 1:]
                total_loss += torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum").item()
                correct += (logits.argmax(-1) == targets).sum().item()
                total_tokens += targets.numel()
        loss = total_loss / total_tokens
        return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "token_accuracy": correct / total_tokens}
