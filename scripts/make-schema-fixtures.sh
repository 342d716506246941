#!/usr/bin/env bash
# make-schema-fixtures.sh [VERSION...] — (re)makes tests/fixtures/schemas/vN/,
# the data directory of each schema version N as the code of that time wrote
# it, which test_upgrade_schemas opens with today's kilnd. For each N (default:
# 1 to today's STORE_SCHEMA_VERSION) it takes the newest commit on the first-
# parent history of HEAD whose storage/storage.h has STORE_SCHEMA_VERSION N
# (the last kiln that wrote that schema), builds its kilnd and kiln-train in a
# temporary folder, and runs tests/upgrade/make_fixture.py with them: a few
# small jobs, a cancelled one, a second tenant, an uploaded data set and a
# pinned checkpoint where that kiln had them. Commit the result.
# After adding migration N+1, run `bash scripts/make-schema-fixtures.sh N`
# (before the migration lands, N is HEAD's own schema; afterwards the script
# finds the last commit before it either way).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
. scripts/env.sh

current=$(sed -n 's/^#define STORE_SCHEMA_VERSION //p' storage/storage.h)
if [ $# -gt 0 ]; then
  versions=("$@")
else
  versions=($(seq 1 "$current"))
fi

# newest first-parent commit whose schema version is $1
commit_of() {
  local c v
  for c in $(git rev-list --first-parent HEAD); do
    v=$(git show "$c:storage/storage.h" 2>/dev/null | sed -n 's/^#define STORE_SCHEMA_VERSION //p')
    if [ "$v" = "$1" ]; then
      echo "$c"
      return 0
    fi
  done
  return 1
}

launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for n in "${versions[@]}"; do
  if ! [ "$n" -ge 1 ] 2>/dev/null || [ "$n" -gt "$current" ]; then
    echo "make-schema-fixtures: no schema version $n (1..$current)" >&2
    exit 2
  fi
  c=$(commit_of "$n") || {
    echo "make-schema-fixtures: no commit of HEAD has schema version $n" >&2
    exit 1
  }
  echo "== schema $n: $(git log -1 --format='%h %s' "$c" | cut -c1-100)"
  mkdir -p "$tmp/v$n/src"
  git archive "$c" | tar -x -C "$tmp/v$n/src"
  cmake -S "$tmp/v$n/src" -B "$tmp/v$n/build" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=OFF \
    -DKILN_TESTS=OFF "${launcher[@]}" >"$tmp/v$n/cmake.log"
  cmake --build "$tmp/v$n/build" -j "$jobs" --target kilnd kiln-train >"$tmp/v$n/build.log"
  python3 tests/upgrade/make_fixture.py "$tmp/v$n/build/server/kilnd" \
    "$tmp/v$n/build/worker/kiln-train" "$n" "tests/fixtures/schemas/v$n" "$c"
  rm -rf "$tmp/v$n"
done
