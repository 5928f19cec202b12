"""Cross-vocabulary speculative decoding (Timor et al., ICML 2025): SLEM and TLI, exactly.

Two toy tokenizers over the toy language (:mod:`toy_models.tokenizers`: 24 characters, and 40
byte-pair pieces learnt from the corpus) and bigram tables fitted to the corpus with exact
``Fraction`` rows.  Both orientations run: a character target with a piece draft (the draft has
tokens the target lacks: TLI must renormalise) and a piece target with a character draft (the
target has tokens the draft lacks, and -- fitted to the text spelt letter by letter as well --
puts mass on non-canonical tokenizations).  Every law is enumerated exactly
(:func:`~specref.verification.laws.enumeration.law_iterated`): the reference algorithms give
TV = 0 exactly against plain target sampling, each wrong zoo entry an exact TV > 0 on the
orientation where its rule matters.  About 20 s.
"""

from fractions import Fraction
from functools import partial

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from specref.core.errors import SpecrefError, SpecrefTypeError  # noqa: E402
from specref.core.sampling import SamplingConfig  # noqa: E402
from specref.decoding.cross_vocab import (  # noqa: E402
    DRAFT_CONTEXTS,
    cross_vocab_decoder,
    intersection,
    restrict_to_intersection,
    slem_decode,
    slem_transition,
    tli_decode,
    tli_transition,
)
from specref.verification.cases.chain import Case  # noqa: E402
from specref.verification.cases.tables import ProbTable  # noqa: E402
from specref.verification.laws.enumeration import compare, iterate, law, law_iterated, target_law  # noqa: E402
from specref.verification.oracle import check_decoder  # noqa: E402
from specref.verification.zoo.cross_vocab import CROSS_VOCAB_ZOO, entries  # noqa: E402
from toy_models.tokenizers import (  # noqa: E402
    ALPHABET,
    ToyTokenizer,
    char_tokenizer,
    check_round_trip,
    corpus_text,
    fitted_bigram,
    piece_tokenizer,
    spelled,
)

CHARS, PIECES = char_tokenizer(), piece_tokenizer()
ORIENTATIONS = {  # name -> (target tokenizer, draft tokenizer, target table, draft table)
    "chars-target": (CHARS, PIECES, fitted_bigram(CHARS, keep=2, seed=3), fitted_bigram(PIECES, keep=3, seed=4)),
    "pieces-target": (PIECES, CHARS, fitted_bigram(PIECES, keep=3, seed=3, spelt=True),
                      fitted_bigram(CHARS, keep=3, seed=4)),
}
CONFIGS = [SamplingConfig(), SamplingConfig(top_k=2), SamplingConfig(temperature=Fraction(1, 2)),
           SamplingConfig(temperature=0)]


def setting(name):
    T, D, t, d = ORIENTATIONS[name]
    return T, D, ProbTable(t), ProbTable(d), T.encode("the")


def exact_tv(transition, name, *, config=SamplingConfig(), k=2, max_new_tokens=4, stop_tokens=()):
    T, D, target, draft, prompt = setting(name)
    iteration = transition(target, draft, T, D, prompt, k=k, config=config, max_new_tokens=max_new_tokens,
                           stop_tokens=stop_tokens)
    got = law_iterated((), iteration)
    truth = target_law(target, prompt, config, max_new_tokens, stop_tokens)
    assert got.exact and truth.exact
    return compare(got, truth).tv


# ---------------------------------------------------------------- the toy tokenizers


def test_the_two_toy_tokenizers_share_the_characters_in_another_order():
    assert CHARS.vocab_size == len(ALPHABET) == 24 and PIECES.vocab_size == 40
    assert set(CHARS.pieces) < set(PIECES.pieces)  # the pieces add merges such as "▁the"
    assert any(len(p) > 2 for p in PIECES.pieces)
    inter = intersection(CHARS, PIECES)
    assert len(inter.target_ids) == 24 and list(inter.target_ids) != list(inter.draft_ids)  # other ids
    text = corpus_text(300, seed=9)
    for tok in (CHARS, PIECES):
        check_round_trip(tok, text)
        assert tok.decode(tok.encode(text)) == text
    assert len(PIECES.encode(text)) < len(CHARS.encode(text)) == len(text)
    assert spelled(PIECES, "the") != PIECES.encode(" the")[1:]  # spelt letter by letter is not canonical


def test_a_tokenizer_that_cannot_round_trip_the_language_is_a_specref_error():
    import tokenizers

    lossy = tokenizers.Tokenizer(tokenizers.models.BPE(vocab={c: i for i, c in enumerate(ALPHABET[:-1])},
                                                       merges=[]))  # no "z": the zoo's words lose it
    lossy.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never")
    with pytest.raises(SpecrefError, match="does not round-trip"):
        check_round_trip(ToyTokenizer(lossy, "no-z"), "#zoo the lion")


def test_fitted_tables_are_exact_distributions():
    for table in (t for _, _, *tables in ORIENTATIONS.values() for t in tables):
        assert all(sum(row) == 1 for row in table) and isinstance(table[0, 0], Fraction)
    assert max(sum(1 for x in row if x) for row in ORIENTATIONS["chars-target"][2]) <= 2


# ---------------------------------------------------------------- the reference algorithms, exactly


@pytest.mark.parametrize("name", list(ORIENTATIONS))
@pytest.mark.parametrize("transition", [slem_transition, tli_transition], ids=["slem", "tli"])
def test_slem_and_tli_are_lossless_exactly(transition, name):
    for config in CONFIGS:
        assert exact_tv(transition, name, config=config) == 0, config
    stop = ORIENTATIONS[name][0].pieces.index(".")
    assert exact_tv(transition, name, k=3, stop_tokens=(stop,)) == 0


@pytest.mark.parametrize("name", list(ORIENTATIONS))
def test_tli_reading_the_committed_tokens_one_by_one_is_lossless_and_reads_other_draft_tokens(name):
    mapped = partial(tli_transition, draft_context="mapped")
    for config in CONFIGS[:2]:
        assert exact_tv(mapped, name, config=config) == 0, config
    T, D, target, draft, prompt = setting(name)
    committed = prompt + T.encode(" c")  # a space, then c: the piece tokenizer merges them into one piece
    contexts = {ctx: tli_transition(target, draft, T, D, prompt, k=2, config=SamplingConfig(), max_new_tokens=2,
                                    draft_context=ctx).setting.draft_context(committed) for ctx in DRAFT_CONTEXTS}
    assert contexts["text"] == D.encode("the c")
    if name == "chars-target":  # the two characters are two draft tokens of the same strings
        assert contexts["mapped"] == D.encode("the") + [D.pieces.index("\u2581"), D.pieces.index("c")]
        assert contexts["mapped"] != contexts["text"]
    with pytest.raises(SpecrefError, match="draft_context must be one of"):
        tli_transition(target, draft, T, D, prompt, k=2, config=SamplingConfig(), max_new_tokens=2,
                       draft_context="bytes")


def test_the_memoised_law_is_the_unmemoised_one():
    for name, transition in (("chars-target", slem_transition), ("pieces-target", tli_transition)):
        T, D, target, draft, prompt = setting(name)
        iteration = transition(target, draft, T, D, prompt, k=2, config=SamplingConfig(), max_new_tokens=2)
        assert law_iterated((), iteration) == law(lambda rng, it=iteration: iterate((), it, rng))


def test_tli_renormalises_the_draft_on_the_intersection():
    T, D, target, draft, prompt = setting("chars-target")
    inter = intersection(T, D)
    rows = ORIENTATIONS["chars-target"][3]  # [40, 40]: the piece draft's rows
    q = next(row for row in rows if 0 < sum(row[inter.draft_ids]) < 1)  # one with mass on merged pieces
    sample, verify = restrict_to_intersection(q, inter)
    assert sum(sample) == 1 and sum(verify) == 1 and sum(q[inter.draft_ids]) < 1
    assert all(verify[inter.target_of[d]] == sample[d] for d in inter.draft_ids)
    only_merges = np.array([Fraction(0)] * 40, dtype=object)
    only_merges[D.pieces.index("\u2581the")] = Fraction(1)
    assert restrict_to_intersection(only_merges, inter) is None  # no mass on T ∩ D: no draft token


def test_the_decodes_run_on_a_real_generator_and_report_their_iterations():
    rng = np.random.default_rng(0)
    for name in ORIENTATIONS:
        T, D, target, draft, prompt = setting(name)
        for decode in (slem_decode, tli_decode):
            out = decode(target, draft, T, D, prompt, k=2, config=SamplingConfig(), max_new_tokens=8, rng=rng)
            assert len(out.tokens) == 8 and 1 <= out.iterations == out.target_calls <= 8
            assert sum(out.accepted_per_iteration) + out.iterations >= 8  # the last block may be cut
            assert T.decode(prompt + out.tokens).startswith("the")


def test_bad_inputs_are_specref_errors():
    T, D, target, draft, prompt = setting("chars-target")
    kw = dict(k=2, config=SamplingConfig(), max_new_tokens=2)
    with pytest.raises(SpecrefTypeError, match="pieces"):
        slem_transition(target, draft, object(), D, prompt, **kw)
    with pytest.raises(SpecrefError, match="tokenizer has"):  # the draft model over the wrong vocabulary
        law_iterated((), slem_transition(target, target, T, D, prompt, **kw))
    with pytest.raises(SpecrefError, match="prompt"):
        slem_transition(target, draft, T, D, [99], **kw)

    class Disjoint:
        pieces, encode, decode = ("xx", "qq"), staticmethod(lambda text: []), staticmethod(lambda ids: "")

    with pytest.raises(SpecrefError, match="share no token"):
        intersection(T, Disjoint())


# ---------------------------------------------------------------- the zoo


EXPECTED = {  # wrong entry -> the orientation where its rule matters, and its exact TV there (4 new tokens)
    "tli_unnormalised": ("chars-target", Fraction(25180525586837, 115540146446130)),
    "tli_in_draft_vocab": ("pieces-target", Fraction(32204342477640, 1621220581859669)),
    "slem_retokenised_prefix": ("pieces-target", None),
    "slem_string_match": ("pieces-target", None),
}


def test_every_wrong_zoo_entry_is_caught_with_an_exact_positive_tv():
    assert {e.name for e in entries("wrong")} == set(EXPECTED)
    for name, (where, expected) in EXPECTED.items():
        tv = exact_tv(CROSS_VOCAB_ZOO[name].transition, where)
        assert isinstance(tv, Fraction) and tv > 0, name
        if expected is not None:
            assert tv == expected, (name, tv)
        assert tv > Fraction(1, 100), (name, float(tv))


def test_the_correct_zoo_entries_are_lossless_in_both_orientations():
    for entry in entries("correct"):
        for name in ORIENTATIONS:
            assert exact_tv(entry.transition, name) == 0, (entry.name, name)


def test_a_rule_that_does_not_matter_on_a_case_is_not_flagged_there():
    # the renormalisation matters only when the draft has tokens the target lacks (pieces draft), reading
    # p on the intersection only when the target has tokens the draft lacks (pieces target)
    assert exact_tv(CROSS_VOCAB_ZOO["tli_unnormalised"].transition, "pieces-target") == 0
    assert exact_tv(CROSS_VOCAB_ZOO["tli_in_draft_vocab"].transition, "chars-target") == 0


# ---------------------------------------------------------------- through the oracle


def test_the_oracle_checks_a_cross_vocabulary_decoder_at_the_decoder_level():
    T, D, target, draft, prompt = setting("chars-target")
    t = ORIENTATIONS["chars-target"][2]
    case = Case("chars-target", t, t, prompt=tuple(prompt), k=2, max_new_tokens=3)  # the draft table: unused
    ok = check_decoder(cross_vocab_decoder("tli", draft, T, D), cases=[case])
    assert ok.ok and ok.results[0].tv == 0, ok
    entry = CROSS_VOCAB_ZOO["tli_unnormalised"]
    flagged = check_decoder(cross_vocab_decoder(entry.fn, draft, T, D, name=entry.name), cases=[case])
    assert not flagged.ok and flagged.results[0].status == "differs" and flagged.results[0].tv > 0, flagged
