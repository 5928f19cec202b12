"""The decoding loops, built on :mod:`specref.core`: chain decoding (docs/spec.md §4)
and the vectorised step sampler."""
