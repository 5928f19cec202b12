"""The ground floor: pure numerics that import nothing else from specref.

``errors`` (the input checks), ``numbers`` (exact or float rows), ``backend``
(array-API dispatch), ``sampling`` (the rules of docs/spec.md §2), ``models``
(processed rows from a model), ``step`` (one speculative step, §3) and ``cost``
(the cost model, §8).
"""
