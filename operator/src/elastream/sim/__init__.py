"""Simulators, generators and exhaustive searches for the benchmarks (bench/) and the tests: never run by the
operator or the workers (import-linter keeps every other layer from importing it).

- `autoscaling`: a time-stepped fluid simulation of a running topology driving the production autoscaling
  decision (`core.autoscaling`) and planner (bench/autoscale.py, bench/autoscale_processes.py);
- `workloads`: random layered topologies (property tests, bench/planners.py);
- `optimum`: exhaustive optima the planners and the Pareto greedy are compared against (small cases);
- `throughput_measures`: Stela's convergence time and down time over a rate timeline (bench/stela.py).

Pure like `core` (mypy --strict, no I/O library): it builds on `core.simulate`'s steady-state model.
"""
