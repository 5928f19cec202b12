"""``python -m specref``: the ``specref`` command (:mod:`specref.cli`), where its script is not on the path."""

import sys

from specref.cli import main

if __name__ == "__main__":  # importing this module (Sphinx's API pages do) runs nothing
    sys.exit(main())
