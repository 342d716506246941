#!/usr/bin/env bash
# One command from a fresh clone to a running kilnd: installs what is
# missing, builds, and serves on 127.0.0.1:8080 with data in ./kiln-data
# and Fashion-MNIST ready. Stop it with Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh

bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKILN_WERROR=OFF
cmake --build build -j "$jobs"

listen="${KILN_LISTEN:-127.0.0.1:8080}"
cat <<MSG

kilnd is starting on http://$listen (data in ./kiln-data; its admin token is
in ./kiln-data/admin.token once it has started). In another terminal:
  curl -s -X POST http://$listen/v1/jobs -H "Authorization: Bearer \$(cat kiln-data/admin.token)" \\
       --data-binary @examples/fmnist-mlp.json
  curl -s -H "Authorization: Bearer \$(cat kiln-data/admin.token)" http://$listen/v1/jobs/JOB_ID

MSG
exec build/server/kilnd --listen "$listen" --data-dir ./kiln-data
