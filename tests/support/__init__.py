"""What every test tier and the benchmarks share to run things for real: the repository's paths
(`support.paths`), free loopback ports (`support.ports`), real Redis servers and clusters
(`support.redis_servers`), bounded waits (`support.waiting`) and faults injected into worker
processes (`support.faults`).

Fixtures live in `tests/conftest.py` and are built from these modules; tests and `bench/` import these
modules, never `conftest`. Manifest builders are in `tests/helpers.py`, topology runs on worker processes in
`tests/harness.py`.
"""
