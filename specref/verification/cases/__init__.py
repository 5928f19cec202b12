"""The oracle's inputs as plain data: table models, the chain levels' cases, position-aware
case models, rules as a parameter, and the hypothesis strategies other projects import.

``specref.verification.cases`` re-exports :mod:`~specref.verification.cases.chain`, so 0.2's
``from specref.verification.cases import Case`` keeps working.
"""

from specref.verification.cases.chain import *  # noqa: F401,F403
from specref.verification.cases.chain import __all__  # noqa: F401
