"""Autoscaling: which change a running topology needs, decided from its analysed metric window.

- `decision`: the decision layer the controller calls once per evaluation period (`recommend`). It runs
  the spec's policy, then makes its verdict safe: stabilization, windows that overlap a rescale or its
  catch-up, cool-down and votes against flapping, the spec's node and parallelism bounds.
- `autoscale_policy`: `policy: autoscale`, AUTOSCALE's preventive auto-parallelization (Kotto Kombi et
  al.): input and capacity forecasts per vertex, a new parallelism degree each.
- `rules_policy`: `policy: rules`, ARiSto's threshold rules (Gkolemis et al.): an executor for a busy
  vertex, a node added or removed by the topology's total capacity.

Both policies are pure functions of one window; only `decision` remembers anything between evaluations
(`AutoscalerState`, returned anew). The time-stepped simulator that drives them without workers is
`elastream.sim.autoscaling` (bench/autoscale.py).
"""
