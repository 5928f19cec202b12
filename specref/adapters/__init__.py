"""Adapters that put outside implementations under the oracle (Hugging Face's
sampler; the ``hf`` extra)."""
