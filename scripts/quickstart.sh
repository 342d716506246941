#!/usr/bin/env bash
# One command from a fresh clone to a running kilnd: installs what is
# missing, builds, and serves on 127.0.0.1:8080 with data in ./kiln-data
# and Fashion-MNIST ready. Stop it with Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh

bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$jobs"

listen="${KILN_LISTEN:-127.0.0.1:8080}"
cat <<MSG

kilnd is starting on http://$listen (data in ./kiln-data). In another terminal:
  curl -s -X POST http://$listen/v1/jobs --data-binary @examples/fmnist-mlp.json
  curl -s http://$listen/v1/jobs/JOB_ID

MSG
exec build/server/kilnd --listen "$listen" --data-dir ./kiln-data
