"""Causal language modelling: a decoder-only model learns next-token prediction on text.

Default: a Llama-style decoder from a transformers config (4 layers, width 256, untied 30,522-token
embedding and head: 18.8 M parameters, randomly initialised, so this is training from scratch) on the
embedded review corpus, tokenized with the shipped MiniLM tokenizer. `--model` takes any local or HF
causal LM (its own tokenizer), `--dataset` any text column (`--text-column`).

Texts are joined with the separator token and packed into blocks of `seq_len` tokens, as causal-LM
recipes do, so no step trains on padding. Metrics: eval loss (mean next-token cross-entropy),
perplexity (its exponential; the target metric, smaller is better) and next-token accuracy.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from optbench.workloads import data
from optbench.workloads.base import (
    Built,
    Split,
    Workload,
    check_model,
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

# ~19 M parameters: big enough that state bytes dominate the step like they do in real LMs, small enough
# for a 2-core CPU; heads of 64 dims, SwiGLU width about 2.7x hidden as in Llama.
LM_HIDDEN_SIZE = 256
LM_LAYERS = 4
LM_HEADS = 4
LM_INTERMEDIATE_SIZE = 688


def llama_config(vocab_size: int, seq_len: int):
    """The default decoder's config: positions for `seq_len` tokens, at least 128 (rotary: no parameters)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=LM_HIDDEN_SIZE, intermediate_size=LM_INTERMEDIATE_SIZE,
                       num_hidden_layers=LM_LAYERS, num_attention_heads=LM_HEADS, num_key_value_heads=LM_HEADS,
                       max_position_embeddings=max(seq_len, 128), tie_word_embeddings=False)


def pack(tokenizer, texts: list[str], seq_len: int) -> Split:
    """Tokenize, join with the separator (or end-of-text) token and cut into full blocks of seq_len."""
    import torch

    separator = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    stream: list[int] = []
    for ids in tokenizer([str(t) for t in texts], add_special_tokens=False)["input_ids"]:
        stream.extend(ids)
        if separator is not None:
            stream.append(separator)
    blocks = len(stream) // seq_len
    if blocks < 2:
        raise ValueError(f"the text holds {len(stream)} tokens: fewer than two blocks of --seq-len {seq_len}")
    ids = torch.tensor(stream[: blocks * seq_len], dtype=torch.long).view(blocks, seq_len)
    return {"input_ids": ids, "labels": ids.clone()}  # HF causal LMs shift labels themselves


class CausalLM(Workload):
    name = "lm"
    target_metric = "perplexity"
    target_mode = "min"
    description = "Llama-style decoder, next-token loss on text (random init: trained from scratch)"

    def lr_scale(self, spec: TrialSpec) -> float:
        # The registry's lrs are for fine-tuning; from random init 20x larger (AdamW 1e-3) trains well.
        return 1.0 if spec.model else 20.0

    def model_name(self, spec: TrialSpec) -> str:
        return spec.model or f"llama-h{LM_HIDDEN_SIZE}-l{LM_LAYERS}"

    def dataset_name(self, spec: TrialSpec) -> str:
        return spec.dataset or "embedded-reviews (text)"

    def _texts(self, spec: TrialSpec) -> tuple[list[str], list[str], str]:
        if spec.dataset is None:
            train, held_out = data.embedded_splits()
            return train["text"], held_out["text"], "embedded-reviews (text)"
        train, held_out = user_splits(spec, None)
        return train["text"], held_out["text"], spec.dataset

    def check(self, spec: TrialSpec) -> None:
        self.check_options(spec)
        self._texts(spec)
        if spec.model:
            check_model(spec.model)

    def build(self, spec: TrialSpec) -> Built:
        import torch
        from transformers import AutoModelForCausalLM, LlamaForCausalLM

        quiet_transformers()
        train_texts, held_out_texts, dataset_name = self._texts(spec)
        tokenizer = load_tokenizer(spec.model)
        torch.manual_seed(spec.seed)
        if spec.model:
            model = AutoModelForCausalLM.from_pretrained(spec.model)
        else:
            model = LlamaForCausalLM(llama_config(len(tokenizer), spec.seq_len))
        train, val, evaluation = split_for_stage(spec, pack(tokenizer, train_texts, spec.seq_len),
                                                 pack(tokenizer, held_out_texts, spec.seq_len))
        return Built(model=model, model_name=self.model_name(spec), dataset_name=dataset_name, train=train, val=val,
                     eval=evaluation, chance_loss=math.log(len(tokenizer)), pretrained=bool(spec.model))

    def meta_model(self, spec: TrialSpec, local_files_only: bool = False) -> torch.nn.Module:
        if spec.model:
            config = model_config(spec.model, local_files_only)  # before the model classes' heavy import
            from transformers import AutoModelForCausalLM

            return on_meta_device(lambda: AutoModelForCausalLM.from_config(config), spec.model)
        from transformers import LlamaForCausalLM

        config = llama_config(len(load_tokenizer(None)), spec.seq_len)
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
