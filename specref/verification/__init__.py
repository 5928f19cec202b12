"""Verification, built on the loops and the numerics: exact laws by enumeration
(docs/spec.md §5), statistics (§6), the oracle's cases and levels, the zoo of
known bugs (§7) and hypothesis strategies."""
