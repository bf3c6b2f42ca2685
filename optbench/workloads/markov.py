"""The embedded language-modelling corpus: token ids drawn from a sparse Markov chain whose entropy rate is exact.

Why generated: the best achievable perplexity of real text is unknown, so a perplexity alone cannot say how far
a model is from done. A first-order chain over VOCAB_SIZE token ids, each state moving to SUCCESSORS others, has
the entropy rate H = Σ_s π(s) H(P(·|s)) (π: its stationary distribution), so exp(H) is the perplexity floor no
model can beat in expectation; on a finite eval stream the floor is the true chain's own perplexity on those
tokens (`bayes_perplexity`), and the unigram perplexity of the same tokens (optbench/workloads/lm.py: the best
any model that ignores the context can score on them) is where a model that has learned nothing but token
frequencies sits. The model reads the ids directly: no tokenizer, no text.

The chain: successor sets drawn with a Zipf-like preference for popular states (as words are), the ring s -> s+1
added so every state reaches every other (irreducible), transition weights from a Dirichlet(DIRICHLET_ALPHA), so
some transitions are near-certain and others spread out. Everything comes from CHAIN_SEED: the chain is part of
the corpus's definition; the train and eval streams are drawn from it with their own seeds.
"""

from __future__ import annotations

import bisect
import functools
import math
import random
from dataclasses import dataclass

import numpy as np

VOCAB_SIZE = 1024
SUCCESSORS = 8  # out-degree of every state: a sparse chain, learnable from a few hundred thousand tokens
DIRICHLET_ALPHA = 0.5  # < 1: skewed transition weights (some near-certain, some spread), as in text
ZIPF_EXPONENT = 1.0  # popularity of a state as a successor ~ 1 / rank
CHAIN_SEED = 2024
TRAIN_TOKENS = 262_144  # 8,192 blocks of 32: the default LM job's 100 steps x 16 blocks see 20 % of them
EVAL_TOKENS = 65_536  # 2,048 blocks of 32: room for --eval-size up to 2,048 at the default sequence length
STREAM_SEED = 4096  # the train stream; the eval stream uses STREAM_SEED + 1
STATIONARY_TOLERANCE = 1e-15
STATIONARY_MAX_ITERATIONS = 200_000


@dataclass(frozen=True)
class Chain:
    successors: np.ndarray  # (VOCAB_SIZE, SUCCESSORS) int: where each state may go
    probabilities: np.ndarray  # (VOCAB_SIZE, SUCCESSORS) float: with what probability, rows summing to 1

    def matrix(self) -> np.ndarray:
        """The dense transition matrix P[s, t] = P(t | s)."""
        dense = np.zeros((len(self.successors), len(self.successors)))
        np.put_along_axis(dense, self.successors, self.probabilities, axis=1)
        return dense

    @functools.cached_property
    def stationary(self) -> np.ndarray:
        """π with π P = π, by power iteration of the lazy chain (I + P) / 2, which has the same π and converges
        for any irreducible chain (the ring makes this one irreducible), periodic or not."""
        from scipy import sparse

        size = len(self.successors)
        rows = np.repeat(np.arange(size), self.successors.shape[1])
        step = sparse.csr_matrix((self.probabilities.ravel(), (rows, self.successors.ravel())), shape=(size, size))
        step_t = step.T.tocsr()
        pi = np.full(size, 1.0 / size)
        for _ in range(STATIONARY_MAX_ITERATIONS):
            following = 0.5 * (pi + step_t @ pi)
            if np.abs(following - pi).max() < STATIONARY_TOLERANCE:
                return following / following.sum()
            pi = following
        raise RuntimeError("the chain's stationary distribution did not converge")

    @property
    def entropy_rate_nats(self) -> float:
        """H = Σ_s π(s) H(P(·|s)): the expected log-loss per token of the true chain, the floor of any model."""
        p = self.probabilities
        per_state = -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1)
        return float(self.stationary @ per_state)

    def log_probability(self, previous: np.ndarray, following: np.ndarray) -> np.ndarray:
        """log P(following | previous), element-wise (-inf where the chain has no such transition)."""
        match = self.successors[previous] == following[:, None]
        chosen = (self.probabilities[previous] * match).sum(axis=1)
        with np.errstate(divide="ignore"):
            return np.log(chosen)


@functools.cache
def chain(seed: int = CHAIN_SEED) -> Chain:
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, VOCAB_SIZE + 1) ** ZIPF_EXPONENT
    popularity = popularity[rng.permutation(VOCAB_SIZE)]
    popularity /= popularity.sum()
    successors = np.empty((VOCAB_SIZE, SUCCESSORS), dtype=np.int64)
    for state in range(VOCAB_SIZE):
        ring = (state + 1) % VOCAB_SIZE
        others = rng.choice(np.delete(np.arange(VOCAB_SIZE), ring), SUCCESSORS - 1, replace=False,
                            p=np.delete(popularity, ring) / np.delete(popularity, ring).sum())
        successors[state] = np.concatenate([[ring], others])
    probabilities = rng.dirichlet(np.full(SUCCESSORS, DIRICHLET_ALPHA), size=VOCAB_SIZE)
    return Chain(successors, probabilities)


def sample(the_chain: Chain, length: int, seed: int) -> np.ndarray:
    """`length` token ids walked from the chain, the first drawn from π (the stream starts stationary)."""
    rng = random.Random(seed)
    cumulative = np.cumsum(the_chain.probabilities, axis=1).tolist()
    successors = the_chain.successors.tolist()
    state = bisect.bisect(np.cumsum(the_chain.stationary).tolist(), rng.random())
    state = min(state, VOCAB_SIZE - 1)
    tokens = [state]
    for _ in range(length - 1):
        row = cumulative[state]
        state = successors[state][min(bisect.bisect(row, rng.random() * row[-1]), SUCCESSORS - 1)]
        tokens.append(state)
    return np.asarray(tokens, dtype=np.int64)


@functools.cache
def streams() -> tuple[np.ndarray, np.ndarray]:
    """(train, eval) token streams; built once per process (the forkserver builds them before forking trials)."""
    return sample(chain(), TRAIN_TOKENS, STREAM_SEED), sample(chain(), EVAL_TOKENS, STREAM_SEED + 1)


def bayes_perplexity(blocks: np.ndarray) -> float:
    """The true chain's perplexity on every next-token prediction inside these blocks (rows): the floor on exactly
    the tokens an eval scores (the first token of a block is context only, as the LM's eval treats it)."""
    blocks = np.asarray(blocks)
    log_p = chain().log_probability(blocks[:, :-1].reshape(-1), blocks[:, 1:].reshape(-1))
    return math.exp(float(-log_p.mean()))
