"""`adamw8bit_hf` is what HF Trainer builds for optim="adamw_bnb_8bit": same state, byte for byte, same update."""

import copy

import pytest
import torch
import transformers

from optbench import optimizers
from optbench.probes.measure import optimizer_state_bytes
from optbench.workloads import tiny_bert_config

bnb = pytest.importorskip("bitsandbytes")


@pytest.fixture
def clean_global_manager():
    """The Trainer registers its overrides with bitsandbytes' process-wide manager: start and end clean."""
    bnb.optim.GlobalOptimManager._instance = None
    yield
    bnb.optim.GlobalOptimManager._instance = None


def _one_step(model, optimizer):
    torch.manual_seed(0)  # the same dropout masks for both models
    ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=torch.tensor([0, 1])).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def test_adamw8bit_hf_reproduces_the_trainers_optimizer(tmp_path, clean_global_manager):
    torch.manual_seed(0)
    base = transformers.BertForSequenceClassification(tiny_bert_config())
    theirs_model, ours_model = copy.deepcopy(base), copy.deepcopy(base)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, optim="adamw_bnb_8bit",
                                          learning_rate=1e-3, report_to=[])
    theirs = transformers.Trainer(model=theirs_model, args=args).create_optimizer()
    ours = optimizers.resolve("adamw_bnb_8bit").build_for(ours_model, lr=1e-3)
    for model, optimizer in ((theirs_model, theirs), (ours_model, ours)):
        _one_step(model, optimizer)

    assert optimizer_state_bytes(ours) == optimizer_state_bytes(theirs)
    assert optimizer_state_bytes(ours)[0] == optimizers.resolve("adamw8bit_hf").analytic_for(ours_model).state_bytes
    for optimizer, model in ((theirs, theirs_model), (ours, ours_model)):  # the override: fp32 embedding state
        assert optimizer.state[model.bert.embeddings.word_embeddings.weight]["state1"].dtype == torch.float32
    for (name, mine), (_, trainers) in zip(ours_model.named_parameters(), theirs_model.named_parameters(), strict=True):
        torch.testing.assert_close(mine, trainers, rtol=0, atol=0, msg=name)

    # The Trainer's override sits in the global manager; the pure entry built afterwards ignores it.
    pure = optimizers.resolve("adamw8bit").build_for(theirs_model)
    _one_step(theirs_model, pure)
    assert pure.state[theirs_model.bert.embeddings.word_embeddings.weight]["state1"].dtype == torch.uint8
