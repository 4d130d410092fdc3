#!/usr/bin/env bash
# Every test tier, in two lanes side by side: the e2e tier (a real API server, the chart, containers; mostly
# waiting on pods and the operator) beside the unit and integration tiers. One after the other they took
# 72 minutes on 2 cores, past the 70 a fresh machine's CI run must stay under; side by side the run lasts
# about as long as the longer lane. No test may need a quiet machine (issue 23): `scripts/soak.sh` runs these
# same lanes beside a busy process, three times in a row.
#
#   scripts/test-lanes.sh                      # what `make test` runs
#   scripts/test-lanes.sh --durations=0        # extra arguments go to both lanes' pytest
#
# The unit and integration lane prints as it goes; the e2e lane writes to a log (its path is printed first:
# `tail -f` it to follow) that is printed whole when both lanes are done. The last lines say each lane's
# outcome and name every failed test, so a truncated log still shows them. Exit status: 0 when both lanes
# are green, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
dir="${LANES_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/elastream-lanes.XXXXXX")}"
mkdir -p "$dir"
main_log="$dir/unit-integration.log"
e2e_log="$dir/e2e.log"
started=$(date +%s)

echo "tests: lane 1 = tests/unit + tests/integration (below); lane 2 = tests/e2e beside it (log: $e2e_log)"
"$python" -m pytest tests/e2e "$@" >"$e2e_log" 2>&1 &
e2e_pid=$!
# a lane left running would hold ports, containers and a control plane after an interrupted run
trap 'kill "$e2e_pid" 2>/dev/null || true' EXIT

"$python" -m pytest tests/unit tests/integration "$@" 2>&1 | tee "$main_log"
main_rc=${PIPESTATUS[0]}
if kill -0 "$e2e_pid" 2>/dev/null; then
    echo "tests: lane 1 done; waiting for the e2e lane (tail -f $e2e_log)"
fi
wait "$e2e_pid"
e2e_rc=$?
trap - EXIT

echo
echo "==================================== the e2e lane's output ($e2e_log) ===================================="
cat "$e2e_log"

summary() {  # the pytest summary line of a lane's log ("3 failed, 1200 passed in 2400.1s"), without its ='s
    grep -E '^(=+ )?([0-9]+ (passed|failed|errors?|skipped|deselected)|no tests ran).* in [0-9.]+s' "$1" |
        tail -1 | sed -E 's/^=+ //; s/ =+$//'
}
echo
echo "=================================================== lanes ==================================================="
echo "lanes: unit+integration: $(summary "$main_log" || true) (exit $main_rc)"
echo "lanes: e2e: $(summary "$e2e_log" || true) (exit $e2e_rc)"
grep -hE '^(FAILED|ERROR) ' "$main_log" "$e2e_log" || true
if [ "$main_rc" -eq 0 ] && [ "$e2e_rc" -eq 0 ]; then
    echo "lanes: green in $(( $(date +%s) - started )) s"
    exit 0
fi
echo "lanes: red in $(( $(date +%s) - started )) s"
exit 1
