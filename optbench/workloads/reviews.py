"""The embedded review task: generated, seeded, offline, with a ceiling computed from its generator.

Every review is built from a polarity (-1 negative, 0 neutral, +1 positive) down to words, so its *clean* label is
a function of its text; a share of the labels is then redrawn at random (label noise). What a model must learn:

- an **invented lexicon**: nonce adjectives ("vorbish", "klemmy") whose polarity the generator assigns at random.
  A pretrained model cannot know them; it must learn each from the training rows, where it sees each a few dozen
  times in a study's run. 30 % of the adjectives come from it.
- the usual lexicon (real adjectives), which pretraining gives away;
- **negation** ("was not great" is negative; "was not vorbish" flips a nonce word's polarity),
- **counterfactual comparisons** ("could have been better" is negative),
- **clause frames** that flip a clause ("it is not true that X", "nobody would say X"),
- **contrast** ("X, but Y", "although X, Y", "Y, even though X": the main clause Y decides) and agreement.

The ceiling is exact. Noise redraws a label uniformly over the three classes, so for every text the clean label
stays the most likely one: the Bayes-optimal prediction is the clean label, and the best achievable eval accuracy
is the share of eval rows whose label equals their clean label (`accuracy_ceiling`). That holds while the model
sees the whole text: every review is at most MAX_WORDS words, which the MiniLM tokenizer keeps within 32 tokens
(tests/test_data.py checks it); the workload drops the ceiling where a row is cut (optbench/workloads/classify.py).
A model can beat the ceiling on a finite eval split only by luck on the noisy rows.
"""

from __future__ import annotations

import functools
import random

LABELS = ("negative", "neutral", "positive")
LABEL_NOISE = 0.05  # share of labels redrawn uniformly over the classes (a third of those keep their label)
# The difficulty, set with AdamW alone (docs/study.md): at half the adjectives invented, AdamW at 3e-4 ended 19 points
# under the ceiling after the study's 150 steps; at 30 %, 10.6 points (5-15 was the aim). Fewer invented words (10
# per class at half the adjectives) did not make it easier: 20 points under.
NONCE_SHARE = 0.3  # share of adjectives drawn from the invented lexicon
NONCE_PER_POLARITY = 16  # invented adjectives per polarity: 48 in all, each seen a few dozen times in training
FRAME_SHARE = 0.15  # share of polar clauses wrapped in a flipping frame ("it is not true that ...")
COUNTERFACTUAL_SHARE = 0.2
NEGATION_SHARE = 0.4
MAX_WORDS = 19  # longer drafts are redrawn: every review fits 32 MiniLM tokens (nonce words take 2-4 pieces)
LEXICON_SEED = 97  # fixed: the invented lexicon is part of the task's definition, like its templates

_ASPECTS = ["the food", "the service", "the staff", "the room", "the price", "the plot", "the acting",
            "the battery", "the screen", "the delivery", "the design", "the sound", "the checkout", "the manual",
            "the location", "the menu", "the ending", "the keyboard", "the camera", "the app"]
_POSITIVE = ["great", "excellent", "wonderful", "superb", "delightful", "friendly", "reliable", "impressive",
             "fantastic", "pleasant", "outstanding", "helpful"]
_NEGATIVE = ["terrible", "awful", "disappointing", "rude", "broken", "bland", "slow", "dreadful", "poor",
             "useless", "unpleasant", "frustrating"]
_NEUTRAL = ["average", "ordinary", "standard", "typical", "unremarkable", "adequate", "okay", "fine"]
_NEGATORS = ["not", "never", "hardly", "not at all"]
_BETTER = ["better", "nicer", "friendlier", "smoother"]
_WORSE = ["worse", "slower", "ruder", "blander"]
_VERBS = ["was", "is", "seemed", "felt"]
_FRAMES = ["it is not true that", "nobody would say", "i would not claim"]
_FILLERS = ["", "", "", "", "honestly, ", "overall, ", "in short, "]
# Syllables of the invented words: onsets, vowels and endings that spell no English adjective in these combinations
_ONSETS = ["bl", "br", "dr", "fl", "gl", "gr", "kl", "pl", "sk", "sl", "sn", "sp", "tr", "v", "z", "qu", "thr", "m"]
_VOWELS = ["a", "e", "i", "o", "u", "oo", "ai"]
_MIDDLES = ["b", "d", "g", "k", "l", "m", "n", "p", "r", "t", "v", "z", "ck", "st"]
_ENDINGS = ["ish", "y", "ic", "ant", "ous", "en", "al"]


@functools.cache
def invented_lexicon(seed: int = LEXICON_SEED) -> dict[int, tuple[str, ...]]:
    """NONCE_PER_POLARITY invented adjectives per polarity (-1, 0, +1), drawn without repeats from the syllables."""
    rng = random.Random(seed)
    words: list[str] = []
    taken = set(_POSITIVE + _NEGATIVE + _NEUTRAL)
    while len(words) < 3 * NONCE_PER_POLARITY:
        word = rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_MIDDLES) + rng.choice(_ENDINGS)
        if word not in taken:
            taken.add(word)
            words.append(word)
    return {polarity: tuple(words[i::3]) for i, polarity in enumerate((-1, 0, 1))}


def _adjective(rng: random.Random, sign: int) -> str:
    """An adjective of the given lexical sign: real half the time, invented (learnable only from data) otherwise."""
    if rng.random() < NONCE_SHARE:
        return rng.choice(invented_lexicon()[sign])
    return rng.choice({1: _POSITIVE, -1: _NEGATIVE, 0: _NEUTRAL}[sign])


def _counterfactual(aspect: str, rng: random.Random, polarity: int) -> str:
    """'could (not) have been better/worse': the comparison, not the adjective, carries the meaning."""
    if polarity > 0:
        return f"{aspect} could not have been {rng.choice(_BETTER)}"
    if polarity < 0:
        if rng.random() < 0.5:
            return f"{aspect} could have been {rng.choice(_BETTER)}"
        return f"{aspect} could not have been {rng.choice(_WORSE)}"
    return f"{aspect} could have been {rng.choice(_WORSE)}"


def _clause(rng: random.Random, polarity: int, framed: bool = True) -> str:
    """A clause whose meaning has the given polarity: an adjective, a negated adjective of the opposite sign, a
    counterfactual comparison, or (polar clauses) a frame that flips a clause of the opposite polarity."""
    if framed and polarity and rng.random() < FRAME_SHARE:
        return f"{rng.choice(_FRAMES)} {_clause(rng, -polarity, framed=False)}"
    aspect, verb = rng.choice(_ASPECTS), rng.choice(_VERBS)
    if rng.random() < COUNTERFACTUAL_SHARE:
        return _counterfactual(aspect, rng, polarity)
    if polarity == 0:
        return f"{aspect} {verb} {_adjective(rng, 0)}"
    negate = rng.random() < NEGATION_SHARE
    sign = -polarity if negate else polarity
    return f"{aspect} {verb} {rng.choice(_NEGATORS) + ' ' if negate else ''}{_adjective(rng, sign)}"


def _draft(rng: random.Random) -> tuple[str, int]:
    polarity = rng.choice((-1, 0, 1))
    main = _clause(rng, polarity)
    other = _clause(rng, rng.choice([p for p in (-1, 0, 1) if p != polarity]))
    template = rng.randrange(5)
    text = {0: main, 1: f"{other}, but {main}", 2: f"although {other}, {main}",
            3: f"{main}, even though {other}", 4: f"{main} and {_clause(rng, polarity)}"}[template]
    return rng.choice(_FILLERS) + text + ".", polarity + 1


def review(rng: random.Random) -> tuple[str, int]:
    """One review and its clean label (0 negative, 1 neutral, 2 positive); drafts over MAX_WORDS are redrawn."""
    while True:
        text, label = _draft(rng)
        if len(text.split()) <= MAX_WORDS:
            return text, label


def generate(size: int, seed: int) -> tuple[list[str], list[int], list[int]]:
    """(texts, labels, clean labels) of `size` reviews; the same (size, seed) always gives the same rows."""
    rng = random.Random(seed)
    texts, labels, clean = [], [], []
    for _ in range(size):
        text, label = review(rng)
        texts.append(text)
        clean.append(label)
        labels.append(rng.randrange(len(LABELS)) if rng.random() < LABEL_NOISE else label)
    return texts, labels, clean


def accuracy_ceiling(labels: list[int], clean: list[int]) -> float:
    """The Bayes-optimal accuracy on these rows: the share whose label is their clean label (noise is symmetric,
    so the clean label is every text's most likely label)."""
    return sum(a == b for a, b in zip(labels, clean, strict=True)) / len(labels)
