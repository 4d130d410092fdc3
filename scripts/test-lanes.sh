#!/usr/bin/env bash
# Every test tier, in three lanes side by side. One after the other they took 72 minutes on 2 cores, past the
# 70 a fresh machine's CI run must stay under; side by side the run lasts about as long as the longest lane.
#
#   lane 1: tests/unit and tests/integration but the fault walks and the steady load (printed as it goes)
#   lane 2: the e2e tier (a real API server, the chart, containers: mostly waiting on pods and the operator)
#   lane 3: tests/integration/test_control_faults.py (Redis away for 5 s and 60 s in every phase of a
#           topology's life: 15 minutes, mostly of outage) and the steady load of test_autoscaling_load.py
#           (3 minutes of watching two topologies): mostly waiting, like lane 2. With them in lane 2 a fresh
#           machine's run took 59 min at 2e2dea2 (lane 1 53 min, lane 2 57.6)
#
# On a machine without the tools cache (~/.cache/elastream/tools) the chart tests of lane 1 need helm before
# lane 2's build of the Kubernetes tools (20-30 minutes) would provide it: helm is built alone first (a few
# minutes, `scripts/k8s-tools.sh helm`) while lane 2 starts; lane 1 starts when helm exists. With helm on PATH,
# in $ELASTREAM_HELM or in the cache, nothing waits.
#
# No test may need a quiet machine (issue 23): `scripts/soak.sh` runs these same lanes beside a busy process,
# three times in a row.
#
#   scripts/test-lanes.sh                      # what `make test` runs
#   scripts/test-lanes.sh --durations=0        # extra arguments go to every lane's pytest
#
# Lanes 2 and 3 write to logs (their paths are printed first: `tail -f` them to follow) that are printed whole
# when every lane is done. The last lines say each lane's outcome and name every failed test, so a truncated log still
# shows them. Exit status: 0 when every lane is green, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
dir="${LANES_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/elastream-lanes.XXXXXX")}"
mkdir -p "$dir"
faults=tests/integration/test_control_faults.py
steady=tests/integration/test_autoscaling_load.py::test_a_constant_load_makes_at_most_one_change
lane1_log="$dir/lane-1.log"
lane2_log="$dir/lane-2.log"
lane3_log="$dir/lane-3.log"
started=$(date +%s)

have_helm() {  # what tests/unit/test_chart.py's find_helm finds: $ELASTREAM_HELM, helm on PATH, a cached build
    if [ -n "${ELASTREAM_HELM:-}" ]; then [ -x "$ELASTREAM_HELM" ]; return; fi
    command -v helm >/dev/null 2>&1 && return 0
    compgen -G "${ELASTREAM_TOOLS_CACHE:-$HOME/.cache/elastream/tools}/*/bin/helm" >/dev/null
}
helm_pid=""
if ! have_helm; then
    echo "tests: no helm yet: building it alone first for the chart tests (scripts/k8s-tools.sh helm, a few" \
        "minutes; log: $dir/helm-build.log); lane 2 starts meanwhile and builds the other tools after it"
    bash scripts/k8s-tools.sh helm >"$dir/helm-build.log" 2>&1 &
    helm_pid=$!
fi

echo "tests: lane 1 = tests/unit + tests/integration but $faults and $steady (below);" \
    "lane 2 = tests/e2e beside it (log: $lane2_log); lane 3 = $faults + $steady (log: $lane3_log)"
"$python" -m pytest tests/e2e "$@" >"$lane2_log" 2>&1 &
lane2_pid=$!
"$python" -m pytest "$faults" "$steady" "$@" >"$lane3_log" 2>&1 &
lane3_pid=$!
# a lane (or the helm build) left running would hold ports, containers and a control plane after an
# interrupted run
trap 'kill "$lane2_pid" "$lane3_pid" $helm_pid 2>/dev/null || true' EXIT

if [ -n "$helm_pid" ]; then
    helm_started=$(date +%s)
    if wait "$helm_pid"; then
        echo "tests: helm built in $(( $(date +%s) - helm_started )) s: $(tail -1 "$dir/helm-build.log")/helm"
    else  # lane 1 runs anyway: its chart tests fail saying there is no helm, and this log says why
        echo "tests: building helm FAILED after $(( $(date +%s) - helm_started )) s; the end of its log:"
        tail -20 "$dir/helm-build.log"
    fi
    helm_pid=""
fi

"$python" -m pytest tests/unit tests/integration --ignore="$faults" --deselect="$steady" "$@" 2>&1 | tee "$lane1_log"
lane1_rc=${PIPESTATUS[0]}
if kill -0 "$lane2_pid" 2>/dev/null || kill -0 "$lane3_pid" 2>/dev/null; then
    echo "tests: lane 1 done; waiting for lanes 2 and 3 (tail -f $lane2_log $lane3_log)"
fi
wait "$lane2_pid"
lane2_rc=$?
wait "$lane3_pid"
lane3_rc=$?
trap - EXIT

echo
echo "====================================== lane 2's output ($lane2_log) ======================================"
cat "$lane2_log"
echo
echo "====================================== lane 3's output ($lane3_log) ======================================"
cat "$lane3_log"

summary() {  # the pytest summary line of a lane's log ("3 failed, 1200 passed in 2400.1s"), without its ='s
    grep -E '^(=+ )?([0-9]+ (passed|failed|errors?|skipped|deselected)|no tests ran).* in [0-9.]+s' "$1" |
        tail -1 | sed -E 's/^=+ //; s/ =+$//'
}
echo
echo "=================================================== lanes ==================================================="
echo "lanes: 1 (unit, integration): $(summary "$lane1_log" || true) (exit $lane1_rc)"
echo "lanes: 2 (e2e): $(summary "$lane2_log" || true) (exit $lane2_rc)"
echo "lanes: 3 (fault walks, steady load): $(summary "$lane3_log" || true) (exit $lane3_rc)"
grep -hE '^(FAILED|ERROR) tests/' "$lane1_log" "$lane2_log" "$lane3_log" || true
if [ "$lane1_rc" -eq 0 ] && [ "$lane2_rc" -eq 0 ] && [ "$lane3_rc" -eq 0 ]; then
    echo "lanes: green in $(( $(date +%s) - started )) s"
    exit 0
fi
echo "lanes: red in $(( $(date +%s) - started )) s"
exit 1
