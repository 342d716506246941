#!/usr/bin/env bash
# Installs every Debian package kiln's build, tests and demo need, skipping
# what is already there, then the npm packages the tests pin (a committed
# package.json + package-lock.json, installed with `npm ci`, skipped when the
# installed tree already matches the lock). Run as root, or as a user with sudo.
set -euo pipefail

packages=(
  # build
  gcc make cmake pkg-config git clang-format
  libmicrohttpd-dev libgnutls28-dev libjansson-dev libopenblas-dev libsqlite3-dev
  libcurl4-openssl-dev libcmocka-dev libopenmpi-dev openmpi-bin zlib1g-dev
  libpng-dev libjpeg62-turbo-dev tar
  # tests, the demo and the reference data set
  curl ca-certificates python3 python3-numpy python3-torch dataset-fashion-mnist
  procps # pgrep, for the strategies test
  openssl # the TLS test makes its CA and certificate with it
  clang  # the fuzz targets (fuzz/): libFuzzer comes with clang's compiler-rt
  # the service benchmark (bench/service.sh), side by side with nginx
  wrk nginx-light
  # the dashboard's browser test and benchmark: headless Chromium driven by
  # node over the DevTools pipe (nothing is downloaded at test time)
  chromium nodejs
  # the ONNX export test: onnx.checker (ONNX Runtime comes from npm, below)
  python3-onnx
  # the image test (scripts/image-test.sh): a bookworm root from debootstrap,
  # imported and built on with podman (chroot isolation, no daemon);
  # podman-compose reads docker/compose.yaml, python3-yaml checks it
  podman buildah debootstrap uidmap fuse-overlayfs slirp4netns crun conmon
  podman-compose python3-yaml
  # the systemd units' check (systemd-analyze verify, systemd-sysusers)
  systemd
  # tf.train.Example encoding cross-checked against protobuf's Python runtime
  python3-protobuf
  # Slurm pools' tests: munged, slurmctld and slurmd started on this host by
  # the test (tests/integration/slurm_fixture.sh)
  slurm-wlm munge
)

# npm runs `npm ci` for the tests' packages (below); Debian ships it apart
# from nodejs, while NodeSource's nodejs carries it and conflicts with it.
if ! command -v npm >/dev/null 2>&1; then
  packages+=(npm)
fi

# retry N CMD...: CMD until it succeeds, at most N tries, waiting 5, 10,
# 20... seconds between them: the package archive and the npm registry drop
# connections now and then, and one reset must not fail a fresh install.
retry() {
  local tries="$1" n=1 wait=5
  shift
  until "$@"; do
    if [ "$n" -ge "$tries" ]; then
      echo "install-deps: '$*' failed $tries times" >&2
      return 1
    fi
    echo "install-deps: '$*' failed (try $n of $tries); again in ${wait}s" >&2
    sleep "$wait"
    n=$((n + 1))
    wait=$((wait * 2))
  done
}

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages are installed"
else
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo="sudo"
    else
      echo "install-deps: missing packages (${missing[*]}) and not root; run as root or install sudo" >&2
      exit 1
    fi
  fi
  echo "install-deps: installing ${missing[*]}"
  retry 4 $sudo apt-get update -q
  retry 4 $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# npm_ci DIR: the packages of DIR's package-lock.json, exactly, unless the
# lock is unchanged since the last install there.
npm_ci() {
  local dir="$1" stamp="$1/node_modules/.kiln-lock.sha256" sum
  sum=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ]; then
    echo "install-deps: npm packages of $dir are installed"
    return 0
  fi
  echo "install-deps: npm ci in $dir"
  (cd "$dir" && retry 4 npm ci --no-audit --no-fund --fetch-retries=5)
  echo "$sum" >"$stamp"
}

cd "$(dirname "$0")/.."
# The OpenAPI document's linter and client generator (tests/openapi).
npm_ci tests/openapi
# ONNX Runtime's web build (WebAssembly under node, nothing native) for the
# ONNX export test (tests/onnx).
npm_ci tests/onnx
