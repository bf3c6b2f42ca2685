"""The embedded LM corpus: a Markov chain whose entropy rate, and so the perplexity floor, is exact."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from optbench.job.spec import TrialSpec
from optbench.workloads import lm, markov


def test_the_stationary_distribution_is_stationary():
    chain = markov.chain()
    pi = chain.stationary
    assert pi.sum() == pytest.approx(1.0) and (pi >= 0).all()
    assert np.abs(pi @ chain.matrix() - pi).max() < 1e-12
    assert np.allclose(chain.probabilities.sum(axis=1), 1.0)


def test_the_entropy_rate_matches_a_monte_carlo_estimate_of_the_true_chains_log_loss():
    """The per-token log-loss of the true transition table on a long sampled stream converges to the entropy rate
    (ergodic theorem); its standard error on 200,000 tokens is about 0.3 % of the rate."""
    chain = markov.chain()
    stream = markov.sample(chain, 200_000, seed=99)
    losses = -chain.log_probability(stream[:-1], stream[1:])
    assert np.isfinite(losses).all()  # every sampled transition is one the chain has
    assert losses.mean() == pytest.approx(chain.entropy_rate_nats, rel=0.02)


def test_the_floor_on_eval_blocks_is_the_true_chains_perplexity_there_and_sits_far_under_the_unigram():
    _, held_out = markov.streams()
    blocks = held_out[: 256 * 32].reshape(256, 32)
    chain = markov.chain()
    expected = math.exp(float(-chain.log_probability(blocks[:, :-1].ravel(), blocks[:, 1:].ravel()).mean()))
    assert markov.bayes_perplexity(blocks) == pytest.approx(expected)
    unigram = lm.unigram_perplexity(torch.from_numpy(blocks))
    assert markov.bayes_perplexity(blocks) * 10 < unigram  # room for a model to learn the context
    assert markov.bayes_perplexity(blocks) == pytest.approx(math.exp(chain.entropy_rate_nats), rel=0.1)


def test_unigram_perplexity_is_the_predicted_tokens_own_frequencies():
    ids = torch.tensor([[9, 1, 1, 2], [9, 1, 2, 2]])  # predicted: 1,1,2 and 1,2,2 -> shares 1/2, 1/2
    assert lm.unigram_perplexity(ids) == pytest.approx(2.0)


def test_the_lm_workload_records_the_floor_and_the_unigram_perplexity():
    spec = TrialSpec(optimizer="adamw", workload="lm", device="cpu", steps=2, warmup_steps=0, batch_size=2,
                     seq_len=16, eval_size=8)
    built = lm.CausalLM().build(spec)
    assert built.model.get_input_embeddings().num_embeddings == markov.VOCAB_SIZE
    assert built.metric_ceiling == pytest.approx(markov.bayes_perplexity(built.eval["input_ids"].numpy()))
    assert built.metric_chance == pytest.approx(lm.unigram_perplexity(built.eval["input_ids"]))
    assert built.metric_ceiling < built.metric_chance
    assert built.dataset_name == lm.MARKOV_NAME
    assert built.val_chance is None  # a plain run has no validation split
    tune = lm.CausalLM().build(dataclasses.replace(spec, stage="tune"))
    assert tune.val_chance == pytest.approx(lm.unigram_perplexity(tune.val["input_ids"]))
