"""What every test tier and the benchmarks share: the repository's paths (`support.paths`), free loopback ports
(`support.ports`), real Redis servers and clusters (`support.redis_servers`), bounded waits
(`support.waiting`), faults injected into worker processes (`support.faults`), topology runs on worker
processes (`support.harness`), manifest and snapshot builders (`support.manifests`), the in-memory fakes at the
controller's ports (`support.fakes`) and the status documents of each health state (`support.health_cases`).

Fixtures live in `tests/conftest.py` and are built from these modules; tests and `bench/` import these
modules, never `conftest`.
"""
