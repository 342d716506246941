#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang under ASan + UBSan and
# runs each one, seeded from fuzz/corpus/<target>/ and
# fuzz/regressions/<target>/, for SECONDS_PER_TARGET seconds (default 60)
# or RUNS executions (default: no cap), whichever comes first, then prints
# a table: executions, seconds, executions/s, coverage (edges), features,
# corpus size, and a crash (the input is kept under build-fuzz/crashes/).
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [RUNS]
# FUZZ_TARGETS="spec tar" picks targets; FUZZ_PARALLEL=2 runs two at once;
# FUZZ_KEEP=1 merges what a run found back into fuzz/corpus/ (to commit);
# FUZZ_OUT=DIR keeps the logs there (default build-fuzz/runs).
# Exits 1 when any target crashed, leaked, timed out or broke a check.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh

seconds="${1:-60}"
runs="${2:--1}"
all_targets="spec page_token last_event_id router idx csv images tar safetensors train_state records shards"
targets="${FUZZ_TARGETS:-$all_targets}"
parallel="${FUZZ_PARALLEL:-1}"

if ! command -v clang >/dev/null 2>&1; then
  echo "fuzz: clang is not installed (scripts/install-deps.sh installs it)" >&2
  exit 1
fi

echo "== build (clang, libFuzzer, ASan + UBSan)"
CC=clang cmake -S . -B build-fuzz -DKILN_FUZZ=ON -DKILN_TESTS=OFF -DKILN_CUDA=OFF -DKILN_MPI=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
build_targets=()
for t in $targets; do build_targets+=("fuzz_$t"); done
cmake --build build-fuzz -j "$jobs" --target "${build_targets[@]}" >build-fuzz/build.log 2>&1 || {
  tail -40 build-fuzz/build.log >&2
  exit 1
}

out="${FUZZ_OUT:-build-fuzz/runs}"
rm -rf "$out"
mkdir -p "$out"

# run_target T: fuzzes T into a scratch corpus (fuzz/corpus stays as
# committed unless FUZZ_KEEP=1); its log is $out/T.log.
run_target() {
  local t="$1" work="build-fuzz/corpus/$1" crashes="build-fuzz/crashes/$1"
  mkdir -p "$work" "$crashes"
  set +e
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "build-fuzz/fuzz/fuzz_$t" -max_total_time="$seconds" -runs="$runs" -timeout=10 \
    -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 -artifact_prefix="$crashes/" \
    "$work" "fuzz/corpus/$t" $([ -d "fuzz/regressions/$t" ] && echo "fuzz/regressions/$t") \
    >"$out/$t.log" 2>&1
  echo $? >"$out/$t.rc"
  set -e
  if [ "${FUZZ_KEEP:-0}" = 1 ]; then
    "build-fuzz/fuzz/fuzz_$t" -merge=1 "fuzz/corpus/$t" "$work" >>"$out/$t.log" 2>&1 || true
  fi
}

echo "== fuzz ($seconds s or $runs runs per target)"
pids=()
for t in $targets; do
  run_target "$t" &
  pids+=($!)
  if [ "${#pids[@]}" -ge "$parallel" ]; then
    wait "${pids[0]}"
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p"; done

# stat NAME LOG: the value of libFuzzer's final "stat::NAME: V" line.
stat() { sed -n "s/^stat::$1: *//p" "$2" | tail -1; }

failed=0
printf '%-14s %12s %8s %10s %8s %9s %7s  %s\n' target executions seconds exec/s cov features corpus result
for t in $targets; do
  log="$out/$t.log"
  execs=$(stat number_of_executed_units "$log")
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | grep -E 'cov: ' | tail -1 || true)
  cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.*ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.*corp: \([0-9]*\).*/\1/p' <<<"$last")
  rc=$(cat "$out/$t.rc")
  result=ok
  if [ "$rc" != 0 ]; then
    result="FAILED (exit $rc; see $log, input in build-fuzz/crashes/$t/)"
    failed=1
  fi
  rate=-
  if [ -n "$secs" ] && [ "$secs" -gt 0 ] && [ -n "$execs" ]; then rate=$((execs / secs)); fi
  printf '%-14s %12s %8s %10s %8s %9s %7s  %s\n' "$t" "${execs:--}" "${secs:--}" "$rate" \
    "${cov:--}" "${ft:--}" "${corp:--}" "$result"
done
exit "$failed"
