"""Sphinx configuration of specref's documentation site.

Build it without make (warnings are errors), and run its doctests::

    python -m sphinx -W -b html docs docs/_build/html
    python -m sphinx -b doctest docs docs/_build/doctest

``tests/test_docs.py`` runs both.  ``SPECREF_DOCS_NITPICKY=1`` adds Sphinx's nitpicky mode
(every unresolved Python reference, docstrings included, is a warning): a report to read,
not a build that passes, since numpy's and hypothesis's types have no inventory offline.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's specref and toy_models, installed or not

import specref  # noqa: E402

project = "specref"
author = "the specref authors"
copyright = "the specref authors, MIT licence"
release = version = specref.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.doctest",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_templates"]
templates_path = ["_templates"]

myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 4  # [text](page.md#a-heading) resolves to the heading, and is checked

nitpicky = os.environ.get("SPECREF_DOCS_NITPICKY") == "1"

# The API reference: every module of specref and toy_models at its own path (generated into
# api/generated/, which docs/.gitignore keeps out of git), each object documented once, in the
# module that defines it: the rooms that re-export a module (specref.verification.cases ->
# cases.chain, .laws, .zoo) are not documented twice.
autosummary_generate = True
autodoc_default_options = {"members": True, "show-inheritance": True, "ignore-module-all": True}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# The hf adapters import torch and transformers (the hf extra); where those are not installed,
# autodoc mocks them, so that the reference still shows the adapters' docstrings.
autodoc_mock_imports = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]

# Docstrings written as plain text, not reStructuredText: parsed as reST they give docutils
# errors (indentation after a field-like line, a list without a blank line before it, a
# table row wider than its column).  They are shown as written, in a literal block, until
# they are rewritten; tests/test_docs.py checks that each one listed still needs it.  Every
# other docstring is parsed as reST, and a broken one fails the build.
PLAIN_TEXT_DOCSTRINGS: set = set()  # none left: every docstring is parsed as reST

# Doctests: the pages' {doctest} blocks run in the directory sphinx is started from (the
# repository root, as the README's commands).  The examples in docstrings (>>>) are written
# for their module's namespace, as Python's doctest runs them; here a block would run without
# it, so the builder leaves them to tests/test_docs.py, which runs each module's examples with
# doctest.testmod.
doctest_test_doctest_blocks = ""
doctest_global_setup = "import numpy as np"

html_theme = "alabaster"
html_title = f"specref {release}"
html_static_path: list[str] = []


def _plain_text(app, what, name, obj, options, lines):
    if name in PLAIN_TEXT_DOCSTRINGS and lines:
        lines[:] = ["::", ""] + [f"   {line}" if line else "" for line in lines] + [""]


def _pages_resolve(app, env, node, contnode):
    """A Python reference written in a page of this site (not a docstring) must resolve."""
    if node.get("refdomain") == "py" and not nitpicky and not env.docname.startswith("api/"):
        from sphinx.util import logging

        logging.getLogger(__name__).warning(
            "py:%s reference target not found: %s", node.get("reftype"), node.get("reftarget"),
            location=node, type="ref", subtype="py")
    return None


def setup(app):
    app.connect("autodoc-process-docstring", _plain_text)
    app.connect("missing-reference", _pages_resolve)
