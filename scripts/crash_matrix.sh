#!/usr/bin/env bash
# The crash matrix on demand: builds kilnd and kiln-train (build/) and
# SIGKILLs kilnd KILLS times (default 20) at seeded random moments while
# jobs train, checkpoint, upload and preempt, restarting it on the same
# data each time; then no job may be lost or stuck, every checkpoint row
# must match its file (bytes, sha256) and each attempt's metrics must be
# contiguous. CI runs 5 kills (ctest -L soak).
#   scripts/crash_matrix.sh [KILLS] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$jobs" --target kilnd kiln-train >/dev/null
exec python3 tests/soak/kiln_soak.py crash --kilnd build/server/kilnd \
  --trainer build/worker/kiln-train --kills "${1:-20}" --seed "${2:-1}"
