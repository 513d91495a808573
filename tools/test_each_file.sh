#!/usr/bin/env bash
# Every test file of tests/ in a pytest process of its own, in file order:
# a file that passes only after other files ran (state they left behind)
# fails here. One line per file (exit status, seconds, pytest's summary),
# then the files that failed; exit status 1 if any did. Logs in
# work_dirs/test_each_file/ (LOG_DIR). Extra arguments go to every pytest.
#
#   make test-each-file                  # or: bash tools/test_each_file.sh
#   bash tools/test_each_file.sh -m "not slow"
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
LOG_DIR="${LOG_DIR:-$ROOT/work_dirs/test_each_file}"
mkdir -p "$LOG_DIR"
cd "$ROOT"

failed=()
count=0
for file in $(find tests -name 'test_*.py' | sort); do
    count=$((count + 1))
    log="$LOG_DIR/$(echo "$file" | tr '/' '_').log"
    start=$(date +%s)
    OMP_NUM_THREADS="${TEST_THREADS:-1}" "$PY" -m pytest -q "$file" "$@" \
        >"$log" 2>&1
    status=$?
    # 5: pytest collected nothing (e.g. every case deselected by -m)
    if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then
        failed+=("$file")
    fi
    echo "$file: exit $status, $(( $(date +%s) - start )) s, $(tail -n 1 "$log")"
done
echo "test files run alone: $count, failed: ${#failed[@]}"
for file in "${failed[@]}"; do
    echo "FAILED alone: $file (log: $LOG_DIR/$(echo "$file" | tr '/' '_').log)"
done
[ "${#failed[@]}" -eq 0 ]
