"""n-gram models: exact counts, smoothing, backoff, determinism, bad input."""

from collections import Counter
from fractions import Fraction as F

import numpy as np
import pytest

from specref.core.errors import SpecrefError
from specref.verification.cases.tables import LogitTable, ProbTable
from toy_models.ngram import NGramModel, random_table_corpus

CORPUS = [[0, 1, 2, 1, 0, 1], [2, 2, 1]]


def test_bigram_probabilities_by_hand():
    m = NGramModel.fit(CORPUS, order=2, vocab_size=3, add_k=1)
    # after token 1 the corpus continues with 2, 0, and nothing else: counts {2: 1, 0: 1}
    assert m.row((1,)) == (F(2, 5), F(1, 5), F(2, 5))
    # start of a document: first tokens 0 and 2
    assert m.row((-1,)) == (F(2, 5), F(1, 5), F(2, 5))
    # after 2: 1 (twice) and 2 (once)
    assert m.row((2,)) == (F(1, 6), F(3, 6), F(2, 6))


def test_unigram_and_trigram_rows_sum_to_one_exactly():
    corpus = random_table_corpus(5, 6, 20, seed=3)
    for order in (1, 2, 3):
        m = NGramModel.fit(corpus, order=order, vocab_size=5, add_k=F(1, 3))
        rows = m.prob_rows([0, 4, 2, 2, 1])
        assert rows.dtype == object and all(sum(r) == 1 for r in rows)


def test_logits_are_logs_of_the_exact_probabilities():
    m = NGramModel.fit(CORPUS, order=2, vocab_size=3, add_k=0)
    tokens = [0, 1, 2]
    np.testing.assert_allclose(np.exp(m(tokens)), m.prob_rows(tokens).astype(float), atol=1e-15)
    assert np.isneginf(m([0])[0, 0])  # after 0 only 1 was seen: P(0 | 0) = 0 -> logit -inf


def test_add_zero_backs_off_to_shorter_contexts():
    m = NGramModel.fit([[0, 1, 0, 1]], order=3, vocab_size=3, add_k=0)
    # context (1, 1) never occurs: back off to (1,), where 0 followed 1 once
    assert m.row((1, 1)) == (F(1), F(0), F(0))
    # token 2 never occurs at all: (2, 2) -> (2,) -> unigram {0: 2, 1: 2}
    assert m.row((2, 2)) == (F(1, 2), F(1, 2), F(0))


def test_fit_is_deterministic_and_counts_every_context():
    corpus = random_table_corpus(4, 5, 30, seed=1)
    a = NGramModel.fit(corpus, order=2, vocab_size=4)
    b = NGramModel.fit(corpus, order=2, vocab_size=4)
    tokens = corpus[0][:10]
    assert (a.prob_rows(tokens) == b.prob_rows(tokens)).all()
    pairs = Counter((x, y) for doc in corpus for x, y in zip(doc, doc[1:]))
    row = a.row((corpus[0][0],))
    total = sum(c for (x, _), c in pairs.items() if x == corpus[0][0])
    assert row[corpus[0][1]] == F(pairs[(corpus[0][0], corpus[0][1])] + 1, total + 4)


def test_random_tables_have_zeros_and_are_reproducible():
    a = NGramModel.random(order=2, vocab_size=5, seed=4, zero_frac=0.5)
    b = NGramModel.random(order=2, vocab_size=5, seed=4, zero_frac=0.5)
    rows = a.prob_rows([0, 1, 2, 3, 4])
    assert (rows == b.prob_rows([0, 1, 2, 3, 4])).all()
    assert any(v == 0 for v in rows.flat) and all(sum(r) == 1 for r in rows)


def test_exact_view_exposes_only_probs():
    m = NGramModel.fit(CORPUS, order=2, vocab_size=3)
    assert not hasattr(m, "probs") and hasattr(m.exact, "probs")
    assert m.exact.vocab_size == 3


@pytest.mark.parametrize(
    "call, word",
    [
        (lambda: NGramModel.fit(CORPUS, order=0, vocab_size=3), "order"),
        (lambda: NGramModel.fit(CORPUS, order=2, vocab_size=0), "vocab_size"),
        (lambda: NGramModel.fit([[0, 3]], order=2, vocab_size=3), r"corpus\[0\]\[1\] = 3"),
        (lambda: NGramModel.fit(CORPUS, order=2, vocab_size=3, add_k=-1), "add_k"),
        (lambda: NGramModel.fit([], order=2, vocab_size=3, add_k=0), "non-empty corpus"),
        (lambda: NGramModel.fit(CORPUS, order=2, vocab_size=3)([0, 5]), r"tokens\[1\] = 5"),
        (lambda: NGramModel.random(order=2, vocab_size=3, seed=0, zero_frac=1.0), "zero_frac"),
        (lambda: ProbTable(np.array([[0.5, 0.5], [0.2, 0.2]])), "sums to"),
        (lambda: ProbTable(np.ones((2, 3)) / 3), r"shape \[V, V\]"),
        (lambda: LogitTable(np.array([[0.0, np.nan], [0.0, 0.0]])), "NaN"),
    ],
)
def test_bad_model_input_is_named(call, word):
    with pytest.raises(SpecrefError, match=word):
        call()
