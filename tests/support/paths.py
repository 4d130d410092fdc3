"""The repository's paths, defined once for tests, the e2e harness and `bench/`."""

from __future__ import annotations

import os

#: the repository's root (this file is tests/support/paths.py)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples")
TESTS = os.path.join(REPO, "tests")
OPERATOR_SRC = os.path.join(REPO, "operator", "src")
