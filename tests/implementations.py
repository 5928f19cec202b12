"""Implementations the tests put under the oracle, written here independently of
:mod:`specref.verification.zoo.chain` (a helper module, not a test module: tests import it)."""

import concurrent.futures as cf
import time

from specref.core.sampling import process
from specref.core.step import draw, speculative_step
from specref.decoding.chain import speculative_decode


def resample_from_p(p_target, q_draft, draft_tokens, rng):
    """SPEC §7.1: on rejection, resample from p instead of the residual."""
    out = []
    for i, x in enumerate(draft_tokens):
        if rng.random() < p_target[i, x] / q_draft[i, x]:
            out.append(int(x))
            continue
        return out + [draw(rng, p_target[i])]
    return out + [draw(rng, p_target[len(draft_tokens)])]


def logits_reference(target_logits, draft_logits, draft_tokens, config, rng):
    """The reference step at the logits level: the same rules on both sides."""
    return speculative_step(process(target_logits, config), process(draft_logits, config), draft_tokens, rng)


def logits_target_only(target_logits, draft_logits, draft_tokens, config, rng):
    """SPEC §7.7: the rules applied to the target rows only."""
    return speculative_step(process(target_logits, config), process(draft_logits, type(config)()), draft_tokens, rng)


def decoder_reference(target, draft, prompt, *, k, config, max_new_tokens, stop_tokens, rng):
    """The reference decoder in the oracle's decoder signature."""
    return speculative_decode(target, draft, prompt, k=k, config=config, max_new_tokens=max_new_tokens,
                              stop_tokens=stop_tokens, rng=rng).tokens


def reference_with_seed(p_target, q_draft, draft_tokens, seed):
    """The reference step in statistical mode: its own generator, seeded by the oracle."""
    import numpy as np

    return speculative_step(p_target, q_draft, draft_tokens, np.random.default_rng(seed))


def resample_from_p_with_seed(p_target, q_draft, draft_tokens, seed):
    """SPEC §7.1 in statistical mode."""
    import numpy as np

    return resample_from_p(p_target, q_draft, draft_tokens, np.random.default_rng(seed))


def slow_reference_with_seed(p_target, q_draft, draft_tokens, seed):
    """The reference, 1 ms a call: long enough for a test to kill a worker mid-run."""
    import time

    time.sleep(0.001)
    return reference_with_seed(p_target, q_draft, draft_tokens, seed)


def raises_on_token_two(p_target, q_draft, draft_tokens, seed):
    """Correct until it emits token 2, then raises (a crash that depends on the sample)."""
    out = reference_with_seed(p_target, q_draft, draft_tokens, seed)
    if 2 in out:
        raise RuntimeError("token 2")
    return out


class ReversedExecutor(cf.Executor):
    """Threads whose tasks finish in the reverse order of submission."""

    def __init__(self):
        self.pool, self.count = cf.ThreadPoolExecutor(max_workers=8), 0

    def submit(self, fn, *args, **kwargs):
        self.count += 1
        delay = 0.05 * (8 - self.count) if self.count < 8 else 0

        def late():
            time.sleep(delay)
            return fn(*args, **kwargs)

        return self.pool.submit(late)


def engines_missing():
    """Why the engines' own code cannot run here (None when it can): no torch, or wheels not cached."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    from specref.adapters import real_engines

    gone = real_engines.missing()
    return (f"engine wheels not in the cache ({', '.join(gone)}): run `python scripts/fetch_engines.py`"
            if gone else None)
