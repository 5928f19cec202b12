"""The ground floor: pure numerics that import nothing else from specref.

``errors`` (the input checks), ``numbers`` (exact or float rows), ``backend``
(array-API dispatch and host copies), ``draws`` (the rng, and every categorical
draw), ``sampling`` (the rules of docs/spec.md §2), ``step`` (one speculative
step, §3, and the residual every rejection draws from), ``tree`` and
``tree_verify`` (draft trees and their verifiers) and ``cost`` (the cost model, §8).

Each shared numeric has one home here: the residual and its fallback
(``step.residual_weights``, ``residual_usable``, ``normalised``, ``correction_weights``,
``correction_row``), the categorical draws (``draws.draw``, ``draws.categorical``),
rng checks and seed coercion (``draws.check_rng``, ``draws.coerce_rng``), the row
tolerance (``errors.row_tolerance``) and host copies (``backend.to_host``,
``backend.host_rows``).
"""
