#!/usr/bin/env bash
# The whole test suite: format check, a warnings-as-errors build with every
# suite under ctest, then the same suites under AddressSanitizer and
# UndefinedBehaviorSanitizer, and the engine's threaded suites under
# ThreadSanitizer, and every fuzz target for a few seconds (scripts/fuzz.sh).
# Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh

# Each phase's heading says how long the run has taken so far, so a slow
# phase shows in CI's log (the whole run must stay under 30 minutes).
phase() {
  printf '== %s  [%dm%02ds]\n' "$1" $((SECONDS / 60)) $((SECONDS % 60))
}

phase "format (clang-format)"
files=$(git ls-files '*.c' '*.h' '*.cu' 2>/dev/null || find . -name '*.[ch]' -not -path './build*')
clang-format --dry-run -Werror $files

# Its own build folders, so the quick start's Release build in build/ and
# this one never reconfigure each other.
phase "build (-Werror)"
cmake -S . -B build-test -DKILN_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build-test -j "$jobs"

# As many suites at a time as cores: most wait on kilnd, trainers
# or a browser for part of their time, and each makes its own folders and
# takes the port the kernel gives its kilnd.
phase "tests"
ctest --test-dir build-test --output-on-failure -j "$jobs"

# The CLI alone, as a CI runner builds it (docs/ci.md): libcurl and jansson only.
phase "build (the kiln CLI alone)"
cmake -S cli -B build-cli -DCMAKE_C_FLAGS=-Werror
cmake --build build-cli -j "$jobs"
build-cli/kiln --version

phase "build (ASan + UBSan)"
cmake -S . -B build-sanitize -DKILN_SANITIZE=ON -DKILN_WERROR=ON -DKILN_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=Debug
cmake --build build-sanitize -j "$jobs"

# Every suite but those whose time goes to another runtime (the dashboard's
# Chromium, PyTorch, node's OpenAPI and ONNX Runtime tools), to training
# a whole data set (kiln_train_shards; multi_worker_shards, whose last part
# also runs under an address-space limit ASan cannot start in; multihost,
# a CNN over three namespaced hosts for minutes, whose kiln-agent the
# agent_on_stand_in suite runs here) or to building an image (which builds
# kiln from source inside it): the C they
# drive is the server, the CLI and the engine that the other suites run
# here under the sanitizers; the normal build above runs them all.
phase "tests (ASan + UBSan)"
# KILN_TEST_SANITIZED=1 tells a suite to run its longest training on a
# slice of the data (the normal build gates its accuracy).
KILN_TEST_SANITIZED=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-sanitize --output-on-failure -j "$jobs" -LE '^(browser|parity|openapi|image)$' \
  -E '^test_(engine_onnx|integration_kiln_train_shards|integration_multi_worker_shards|integration_multihost)$'

# Every fuzz target briefly (its corpus, then a few seconds of new inputs;
# the kept inputs already ran as the fuzz_*_replay tests above).
phase "fuzz (libFuzzer, 5 s per target, as many at once as cores)"
FUZZ_PARALLEL="$jobs" bash scripts/fuzz.sh 5

# Replicas in threads and the engine's first use from several threads.
phase "build (ThreadSanitizer)"
cmake -S . -B build-tsan -DKILN_TSAN=ON -DKILN_WERROR=ON -DKILN_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug
cmake --build build-tsan -j "$jobs" --target test_engine_first_use test_engine_dist

phase "tests (ThreadSanitizer)"
ctest --test-dir build-tsan -R '^test_engine_(first_use|dist)$' --output-on-failure
phase "done"
