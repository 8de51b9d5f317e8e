"""The embedded grammar: exact analytic entropy rate, checked against samples."""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict

import numpy as np
import pytest

from scaletrain.data import default_grammar, generate_text

_TOKEN = re.compile(r"\.\n|\.|[A-Za-z]+")


def _parse(g, text):
    """Decode text back to (state, word index) pairs by running the automaton. Raises if a
    token is not a word the current state can emit: the text is uniquely decodable."""
    lookup = [
        {g.emit(s, w).strip(" "): k for k, w in enumerate(ws)} for s, ws in enumerate(g.words)
    ]
    state, out = g.start, []
    for tok in _TOKEN.findall(text[: text.rfind(".") + 1]):  # drop the word cut at the end
        k = lookup[state][tok]
        out.append((state, k))
        state = g.next_state[state][k]
    return out


def test_stationary_distribution_and_rates_are_consistent():
    g = default_grammar()
    pi, t = g.stationary(), g.transition_matrix()
    np.testing.assert_allclose(t.sum(axis=1), 1.0)
    np.testing.assert_allclose(pi @ t, pi, atol=1e-12)
    assert pi.min() > 0  # irreducible: every state recurs
    assert g.entropy_per_byte() == pytest.approx(g.entropy_per_word() / g.bytes_per_word())
    # A learnable corpus: well below uniform bytes (ln 256 = 5.5) and below a unigram model.
    assert 0.5 < g.entropy_per_byte() < 1.2


def test_generation_is_deterministic_exact_length_ascii():
    a, b, c = (generate_text(30_000, s) for s in (7, 7, 8))
    assert a == b and a != c
    assert len(a) == len(a.encode()) == 30_000
    assert a.isascii() and "  " not in a


def test_held_out_cross_entropy_matches_the_analytic_rate():
    """Fit p(word | state) on one sample, score another; compare with H_word / E[L].

    Any predictor's expected held-out cross-entropy is >= the true entropy rate (Gibbs), and the
    state-conditioned model is the right family, so it should land just above. Tolerances:
    4 standard errors of the mean per-word loss (about 0.3% here), plus 1% for the finite-count
    excess (about #(state, word) pairs / (2 * training words) ~ 0.2%) and the ratio estimate.
    """
    g = default_grammar()
    analytic = g.entropy_per_byte()
    counts: dict[int, Counter] = defaultdict(Counter)
    for s, k in _parse(g, generate_text(1_000_000, 1)):
        counts[s][k] += 1
    test_text = generate_text(200_000, 2)
    losses = []
    for s, k in _parse(g, test_text):
        c, n = counts[s], sum(counts[s].values())
        losses.append(-math.log((c[k] + 0.5) / (n + 0.5 * len(g.words[s]))))
    losses_arr = np.array(losses)
    bytes_per_word = len(test_text) / len(losses_arr)
    assert bytes_per_word == pytest.approx(g.bytes_per_word(), rel=0.01)
    estimate = losses_arr.mean() / bytes_per_word
    se = losses_arr.std() / math.sqrt(len(losses_arr)) / bytes_per_word
    assert estimate >= analytic - 4 * se
    assert estimate <= analytic * 1.01 + 4 * se


def test_model_free_word_bigram_is_not_below_the_rate():
    """A word-bigram model knows nothing of the grammar's states; on held-out text it must score
    above the entropy rate (it can only be worse than the best predictor), but not far above."""
    g = default_grammar()
    train = _TOKEN.findall(generate_text(400_000, 3))
    test_text = generate_text(100_000, 4)
    test = _TOKEN.findall(test_text)
    uni, bi = Counter(train), defaultdict(Counter)
    for a, b in zip(train, train[1:]):
        bi[a][b] += 1
    total, vocab = len(train), len(uni) + 1
    loss = 0.0
    for a, b in zip(test, test[1:]):
        p_uni = (uni[b] + 1) / (total + vocab)
        c = bi[a]
        n, u = sum(c.values()), len(c)
        p = (c[b] + u * p_uni) / (n + u) if n else p_uni  # Witten-Bell interpolation
        loss -= math.log(p)
    estimate = loss / len(test_text.encode()) * len(test) / (len(test) - 1)
    assert g.entropy_per_byte() < estimate < g.entropy_per_byte() * 1.2
