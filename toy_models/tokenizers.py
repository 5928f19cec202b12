"""Two toy tokenizers over the toy language of :mod:`toy_models.corpus`, built in memory.

Both are ``tokenizers.Tokenizer`` objects (the Hugging Face ``tokenizers`` library, which
comes with the ``hf`` extra), trained or written here from the generated corpus text --
nothing is downloaded:

- :func:`char_tokenizer`: one token per character of the language, ``"▁"`` (U+2581) for the
  space: 24 tokens, ``"▁"`` first;
- :func:`piece_tokenizer`: byte-pair merges learnt from the corpus text on top of the same
  characters (40 tokens by default: the 24 characters and 16 merged pieces such as ``"▁the"``,
  ``"ig"``, ``"▁li"``), in the ``tokenizers`` trainer's order.

Both pre-tokenize with ``Metaspace(prepend_scheme="never")``: a space becomes ``"▁"`` glued to
the next word, the first word has none, and a piece never crosses a word boundary.  So the two
vocabularies share the 24 characters (their intersection, in another order of ids) and the
pieces are the tokens only one of them has.  Every text of the language is expressible in both
(every character is a token of each).

:class:`ToyTokenizer` is the interface the cross-vocabulary algorithms
(:mod:`specref.decoding.cross_vocab`) read: ``pieces`` (each token's raw string, by id),
``encode(text) -> ids`` and ``decode(ids) -> text``, with ``decode`` the plain concatenation of
the pieces (``"▁"`` read as a space), so that decoding never strips or merges anything.
:func:`check_round_trip` raises :class:`~specref.core.errors.SpecrefError` for a tokenizer that
does not give a text back.  :func:`fitted_bigram` fits a bigram table over a tokenizer's ids to
the corpus (exact ``Fraction`` rows; ``keep`` most frequent successors, for small exact laws;
``spelt=True`` also fits the text spelt one character per token, :func:`spelled`).
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from functools import lru_cache

import numpy as np

from specref.core.errors import SpecrefError, check_positive_int

__all__ = ["SPACE", "ALPHABET", "ToyTokenizer", "char_tokenizer", "piece_tokenizer", "corpus_text",
           "check_round_trip", "spelled", "fitted_bigram"]

SPACE = "\u2581"  # "▁": the space, as the pieces spell it
ALPHABET = tuple(SPACE + "#.abcdefghiklmnoprstwyz")  # every character the language writes, "▁" first
TRAINING_TOKENS = 20_000  # words of corpus text the merges are learnt from
TRAINING_SEED = 0


def _library():
    try:
        import tokenizers
    except ImportError as e:  # it comes with transformers (the hf extra)
        raise ImportError(f"toy_models.tokenizers needs the tokenizers library ({e}): pip install 'specref[hf]'") from e
    return tokenizers


@lru_cache(maxsize=8)
def corpus_text(n_tokens: int = TRAINING_TOKENS, seed: int = TRAINING_SEED) -> str:
    """``n_tokens`` words of the toy language as text (:func:`toy_models.corpus.decode`)."""
    from toy_models.corpus import corpus, decode

    return decode(corpus(n_tokens, seed=seed))


class ToyTokenizer:
    """A ``tokenizers.Tokenizer`` with the three things the cross-vocabulary algorithms read.

    ``pieces[i]``: the raw string of token ``i`` (``"▁"`` for a space); ``encode(text)``: the
    library's tokenization; ``decode(ids)``: the pieces concatenated, ``"▁"`` read as a space.
    ``tokenizer``: the library object itself (``PreTrainedTokenizerFast(tokenizer_object=...)``
    wraps it for ``transformers``).
    """

    def __init__(self, tokenizer, name: str):
        self.tokenizer, self.name = tokenizer, name
        vocab = tokenizer.get_vocab()
        if sorted(vocab.values()) != list(range(len(vocab))):
            raise SpecrefError(f"tokenizer {name!r}: its ids are not 0..{len(vocab) - 1}")
        self.pieces = tuple(sorted(vocab, key=vocab.get))
        self.vocab_size = len(self.pieces)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text).ids)

    def decode(self, ids) -> str:
        try:
            return "".join(self.pieces[int(i)] for i in ids).replace(SPACE, " ")
        except IndexError:
            raise SpecrefError(f"tokenizer {self.name!r}: ids must be in 0..{self.vocab_size - 1}, "
                               f"got {list(ids)}") from None

    def __repr__(self):
        return f"ToyTokenizer({self.name!r}, V={self.vocab_size})"


def _metaspace(tok):
    lib = _library()
    tok.pre_tokenizer = lib.pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="never")
    tok.decoder = lib.decoders.Metaspace(replacement=SPACE, prepend_scheme="never")
    return tok


@lru_cache(maxsize=2)
def char_tokenizer() -> ToyTokenizer:
    """One token per character of the language (``"▁"`` for the space; 24 tokens, ``"▁"`` id 0)."""
    lib = _library()
    model = lib.models.BPE(vocab={c: i for i, c in enumerate(ALPHABET)}, merges=[])
    tok = ToyTokenizer(_metaspace(lib.Tokenizer(model)), "chars")
    check_round_trip(tok, corpus_text(2_000, seed=1))
    return tok


@lru_cache(maxsize=4)
def piece_tokenizer(vocab_size: int = 40) -> ToyTokenizer:
    """Byte-pair pieces learnt from :func:`corpus_text` on top of the characters (``vocab_size`` tokens).

    Deterministic: the same corpus text and trainer settings give the same merges.
    """
    lib = _library()
    vocab_size = check_positive_int("vocab_size", vocab_size, minimum=len(ALPHABET))
    tok = _metaspace(lib.Tokenizer(lib.models.BPE()))
    trainer = lib.trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=list(ALPHABET), special_tokens=[],
                                      show_progress=False)
    tok.train_from_iterator([corpus_text()], trainer=trainer)
    out = ToyTokenizer(tok, f"pieces-{vocab_size}")
    check_round_trip(out, corpus_text(2_000, seed=1))
    return out


def check_round_trip(tokenizer: ToyTokenizer, text: str) -> None:
    """SpecrefError unless ``decode(encode(text)) == text`` and the library's own decode agrees."""
    ids = tokenizer.encode(text)
    back = tokenizer.decode(ids)
    if back != text:
        at = next((i for i, (a, b) in enumerate(zip(back, text)) if a != b), min(len(back), len(text)))
        raise SpecrefError(f"tokenizer {tokenizer.name!r} does not round-trip the text: at character {at}, "
                           f"{text[at:at + 20]!r} came back as {back[at:at + 20]!r}")
    own = tokenizer.tokenizer.decode(ids)
    if own != text:
        raise SpecrefError(f"tokenizer {tokenizer.name!r}: the library decodes to {own[:40]!r}..., "
                           f"the pieces to {text[:40]!r}...")


def spelled(tokenizer: ToyTokenizer, text: str) -> list[int]:
    """``text`` one character per token, in ``tokenizer``'s ids (a non-canonical tokenization
    wherever a piece would have merged characters)."""
    index = {s: i for i, s in enumerate(tokenizer.pieces)}
    try:
        return [index[c] for c in text.replace(" ", SPACE)]
    except KeyError as e:
        raise SpecrefError(f"tokenizer {tokenizer.name!r} has no token for the character {e.args[0]!r}") from None


def fitted_bigram(tokenizer: ToyTokenizer, *, keep: int | None = 2, n_tokens: int = 5_000, seed: int = 3,
                  add_k: int = 0, spelt: bool = False):
    """A bigram table ``[V, V]`` of exact ``Fraction`` rows over ``tokenizer``'s ids, fitted to corpus text.

    Row ``a`` holds the counts of the tokens that follow ``a`` in ``encode(corpus_text(n_tokens,
    seed))`` (and, with ``spelt``, in the same text :func:`spelled` one character per token too:
    a model that also puts mass on non-canonical tokenizations), plus ``add_k``; with ``keep``
    only the ``keep`` most frequent successors (ties to the lower id) keep their counts.  A token
    never followed by anything gets the row of the whole text's ``keep`` most frequent tokens.
    Rows sum to 1 exactly.
    """
    text = corpus_text(n_tokens, seed)
    docs = [tokenizer.encode(text)] + ([spelled(tokenizer, text)] if spelt else [])
    V = tokenizer.vocab_size
    follows = {a: Counter() for a in range(V)}
    unigram = Counter()
    for ids in docs:
        unigram.update(ids)
        for a, b in zip(ids, ids[1:]):
            follows[a][b] += 1
    table = np.empty((V, V), dtype=object)
    for a in range(V):
        counts = follows[a] or unigram
        kept = sorted(counts, key=lambda t: (-counts[t], t))[:keep] if keep else list(range(V))
        row = [Fraction(counts.get(t, 0) if t in kept else 0) + add_k for t in range(V)]
        total = sum(row)
        table[a] = [c / total for c in row]
    return table
