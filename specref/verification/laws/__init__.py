"""Exact laws: the law of any randomized program by enumerating its random choices, exact
comparison with the target's law (SPEC §5), and the multi-draft optimum (SPEC §14).

``specref.verification.laws`` re-exports :mod:`~specref.verification.laws.enumeration`, so
0.2's ``from specref.verification.laws import law`` keeps working.
"""

from specref.verification.laws.enumeration import *  # noqa: F401,F403
from specref.verification.laws.enumeration import __all__  # noqa: F401
