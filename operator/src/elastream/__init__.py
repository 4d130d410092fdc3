"""elastream: an elastic stream-processing operator (Stela planning, CCR migration through Redis)."""

#: the version of the distribution, the chart's appVersion and the images' default tag: written here only
#: (operator/pyproject.toml reads it; tests/unit/test_versioning.py checks Chart.yaml and CHANGELOG.md agree)
__version__ = "0.2.0"

#: the worker image a topology without spec.image runs when the operator is given none: the image built for
#: this version (`make release`); `make images` builds `:dev` for local work, named explicitly where used
DEFAULT_WORKER_IMAGE = f"elastream-worker:{__version__}"
