#!/usr/bin/env bash
# The soak on demand: builds kilnd and kiln-train (build/) and runs
# tests/soak/kiln_soak.py for SECONDS (default 1800: 30 minutes) of job
# churn, vanishing metric streams and :wait clients, uploads and
# preemptions against a real kilnd on loopback, then checks that RSS, open
# files and threads stayed flat, no job was lost and every job's state
# agrees with its events. CI runs the 2-minute variant (ctest -L soak).
#   scripts/soak.sh [SECONDS] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$jobs" --target kilnd kiln-train >/dev/null
exec python3 tests/soak/kiln_soak.py soak --kilnd build/server/kilnd \
  --trainer build/worker/kiln-train --seconds "${1:-1800}" --seed "${2:-1}"
