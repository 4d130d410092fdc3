#!/usr/bin/env bash
# The whole test suite N times in a row while another CPU-heavy process runs beside it: the check that no test
# depends on a quiet machine (issue 23). Stops at the first red run; one summary line per run.
#
#   scripts/soak.sh            # 3 runs of what `make test` runs (scripts/test-lanes.sh), one busy process beside
#   scripts/soak.sh 1 --durations=0                  # options only: the lanes, with these pytest options
#   scripts/soak.sh 2 tests/unit tests/integration   # 2 runs of pytest over the given paths (one lane)
#
# The busy process is a pure-Python loop pinned to nothing (the scheduler spreads it like any neighbour);
# it is stopped when the script ends, however it ends. Logs: $SOAK_DIR (default /tmp/elastream-soak).
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"
shift || true
paths=("$@")
dir="${SOAK_DIR:-/tmp/elastream-soak}"
mkdir -p "$dir"
python="${PYTHON:-.venv/bin/python}"

"$python" -c 'while True: pass' &
busy=$!
trap 'kill "$busy" 2>/dev/null || true' EXIT
echo "soak: $runs run(s) of ${paths[*]:-every tier (scripts/test-lanes.sh)} beside a busy process (pid $busy); logs in $dir"

for run in $(seq 1 "$runs"); do
    log="$dir/run-$run.log"
    started=$(date +%s)
    if [ "${#paths[@]}" -gt 0 ] && [ "${paths[0]#-}" = "${paths[0]}" ]; then  # paths given: one pytest
        if "$python" -m pytest "${paths[@]}" >"$log" 2>&1; then status=green; else status=red; fi
        summary=$(grep -E '^=+ .*(passed|failed|error).* in ' "$log" | tail -1 || true)
    else  # the lanes of `make test`, each lane's logs beside this run's
        if LANES_DIR="$dir/run-$run" PYTHON="$python" bash scripts/test-lanes.sh "${paths[@]}" >"$log" 2>&1; then
            status=green
        else
            status=red
        fi
        summary=$(grep -E '^lanes: ' "$log" | tr '\n' ' ' || true)
    fi
    echo "soak: run $run/$runs $status in $(( $(date +%s) - started )) s: ${summary:-no summary (see $log)}"
    if [ "$status" = red ]; then
        grep -E '^(FAILED|ERROR) tests/' "$log" | head -20 || true
        exit 1
    fi
done
echo "soak: $runs green run(s) in a row"
