#!/usr/bin/env bash
# image-test.sh — builds docker/Dockerfile the way a machine with no docker
# daemon and no registry can, then trains the example job with the image's
# own programs. Stages, each timed:
#   base     debootstrap --variant=minbase bookworm into a folder
#   import   that folder as the image kiln-base:bookworm (podman import)
#   build    podman build --isolation chroot FROM it (BASE_IMAGE build arg),
#            tagged with the name docker/compose.yaml gives the image
#   run      a container's root filesystem, mounted, with the image's kilnd
#            started in a chroot on a loopback port as the image's user
#   train    examples/fmnist-mlp.json through the image's kiln CLI, gated on
#            val_accuracy >= 0.85 (README: about 0.855)
# With KILN_IMAGE_CUDA=DIR (a CUDA toolkit: bin/nvcc, include, nvvm, lib
# with cudart, cuBLAS and NCCL, e.g. /usr/local/cuda), the same for
# docker/Dockerfile.cuda on two bases made from the bookworm root and the
# toolkit's files (cuda-base), built (cuda-build), its kilnd trained on CPUs
# (cuda-run, cuda-train): no GPU is needed, and none is used.
# Needs root, podman and debootstrap (scripts/install-deps.sh installs them);
# exits 77 (skipped) with the reason when one is missing. The mirror is the
# first bookworm source in /etc/apt/sources.list{,.d/*} unless MIRROR is set.
# KILN_IMAGE_KEEP=1 keeps the work folder (podman storage, the base root).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

skip() {
  echo "image-test: SKIPPED: $*"
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip "needs root (podman with chroot isolation, debootstrap, chroot)"
for tool in podman debootstrap chroot curl python3; do
  command -v "$tool" >/dev/null 2>&1 || skip "$tool is not installed (bash scripts/install-deps.sh)"
done

# The Debian mirror apt uses here: a one-line "deb URL bookworm ..." entry
# or a deb822 stanza whose Suites has bookworm.
find_mirror() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    awk '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                       if ($(i + 1) == "bookworm") { print $i; exit } }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    awk 'BEGIN { RS = ""; FS = "\n" }
         { uri = ""; ok = 0
           for (i = 1; i <= NF; i++) {
             if ($i ~ /^URIs:/) { split($i, u, " "); uri = u[2] }
             if ($i ~ /^Suites:/) { n = split($i, s, " "); for (j = 2; j <= n; j++) if (s[j] == "bookworm") ok = 1 }
           }
           if (ok && uri != "") { print uri; exit } }' "$f"
  done
}
mirror=${MIRROR:-$(find_mirror | head -n 1)}
[ -n "$mirror" ] || skip "no bookworm source in /etc/apt/sources.list*; set MIRROR=URL"

cuda=${KILN_IMAGE_CUDA:-}
if [ -n "$cuda" ]; then
  cuda=$(realpath "$cuda")
  [ -x "$cuda/bin/nvcc" ] || {
    echo "image-test: KILN_IMAGE_CUDA=$cuda has no bin/nvcc" >&2
    exit 2
  }
fi

work=$(mktemp -d /var/tmp/kiln-image.XXXXXX)
podman=(podman --root "$work/storage" --runroot "$work/run")
# overlay where the kernel lets this folder carry it, vfs (full copies) otherwise
if ! "${podman[@]}" --storage-driver overlay info >/dev/null 2>&1; then
  podman+=(--storage-driver vfs)
else
  podman+=(--storage-driver overlay)
fi
image=kiln:latest
base=kiln-base:bookworm
kilnd_pid=""
ctrs=()
mounted=()

stop_kilnd() {
  if [ -n "$kilnd_pid" ]; then
    kill "$kilnd_pid" 2>/dev/null || true
    wait "$kilnd_pid" 2>/dev/null || true
    kilnd_pid=""
  fi
}

cleanup() {
  local rc=$?
  stop_kilnd
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
  for c in "${ctrs[@]}"; do
    "${podman[@]}" umount "$c" >/dev/null 2>&1 || true
    "${podman[@]}" rm -f "$c" >/dev/null 2>&1 || true
  done
  if [ "${KILN_IMAGE_KEEP:-0}" = 1 ]; then
    echo "image-test: kept $work"
  else
    "${podman[@]}" rmi -a -f >/dev/null 2>&1 || true
    # podman's overlay driver mounts its folder on itself; debootstrap
    # mounts /proc and /sys in the root it makes (if it was stopped midway)
    findmnt -rn -o TARGET | grep -F "$work/" | sort -r | while read -r m; do umount -l "$m"; done || true
    rm -rf "$work" || true
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 143' TERM INT

declare -A took
stage_start=0
begin() {
  echo "== image-test: $1"
  stage_start=$(date +%s)
}
end() {
  took[$1]=$(($(date +%s) - stage_start))
  echo "== image-test: $1 took ${took[$1]} s"
}
total_start=$(date +%s)

# ---- compose: the image and build context it names are the ones built here
begin compose
python3 - "$repo/docker/compose.yaml" "$image" <<'EOF'
import os, sys
import yaml
path, want = sys.argv[1], sys.argv[2]
doc = yaml.safe_load(open(path))
svc = doc["services"]["kilnd"]
here = os.path.dirname(os.path.abspath(path))
context = os.path.normpath(os.path.join(here, svc["build"]["context"]))
dockerfile = os.path.join(context, svc["build"]["dockerfile"])
repo = os.path.dirname(here)
problems = []
if svc.get("image") != want:
    problems.append(f"image is {svc.get('image')!r}, the test builds {want!r}")
if context != repo:
    problems.append(f"build context {context} is not the repository root {repo}")
if not os.path.isfile(dockerfile):
    problems.append(f"dockerfile {dockerfile} does not exist")
for volume in svc.get("volumes", []):
    if not volume.endswith(":/var/lib/kiln"):
        problems.append(f"volume {volume!r} is not mounted at the image's data directory")
if problems:
    sys.exit("compose.yaml: " + "; ".join(problems))
print(f"compose.yaml: service kilnd builds {os.path.relpath(dockerfile, repo)} "
      f"from the repository root as {want}")
EOF
if command -v podman-compose >/dev/null 2>&1; then
  # podman-compose's own reading of the file: the build command it would run
  (cd "$repo/docker" && podman-compose --dry-run -f compose.yaml build 2>&1) | tee "$work/compose.log" |
    grep -F -- "-t $image -f ../docker/Dockerfile .." ||
    {
      cat "$work/compose.log"
      echo "image-test: podman-compose would not build $image from docker/Dockerfile" >&2
      exit 1
    }
fi
end compose

# ---- base: a minimal bookworm root, imported as an image
begin base
echo "mirror: $mirror"
debootstrap --variant=minbase bookworm "$work/root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log"
  exit 1
}
# as bookworm-slim ships: no package lists, no downloaded packages
rm -rf "$work/root/var/lib/apt/lists/"* "$work/root/var/cache/apt/archives/"*.deb
end base

begin import
tar -C "$work/root" --numeric-owner -cf - . | "${podman[@]}" import - "$base" >/dev/null
[ -n "$cuda" ] || rm -rf "$work/root"
"${podman[@]}" images
end import

# ---- build: the Dockerfile as it is, FROM the imported base
# build_image DOCKERFILE TAG LOG BUILD-ARG...
build_image() {
  local dockerfile=$1 tag=$2 log=$3
  shift 3
  local args=()
  for a in "$@"; do args+=(--build-arg "$a"); done
  "${podman[@]}" build --isolation chroot --layers=false "${args[@]}" \
    -f "$repo/$dockerfile" -t "$tag" "$repo" >"$log" 2>&1 || {
    tail -n 60 "$log"
    echo "image-test: podman build of $dockerfile failed" >&2
    exit 1
  }
  grep -E '^(\[[0-9]/[0-9]\] )?STEP' "$log" || true
  "${podman[@]}" images
}

begin build
build_image docker/Dockerfile "$image" "$work/build.log" "BASE_IMAGE=$base"
end build

# run_in IMAGE: a container of IMAGE, its root filesystem mounted at $root
# with /proc, /dev and /sys, and the image's kilnd started in a chroot on a
# loopback port ($port) as the image's user, in its data directory.
run_in() {
  local img=$1 ctr
  ctr=$("${podman[@]}" create "$img")
  ctrs+=("$ctr")
  root=$("${podman[@]}" mount "$ctr")
  for fs in proc dev sys; do
    mount --rbind "/$fs" "$root/$fs"
    mount --make-rslave "$root/$fs"
    mounted+=("$root/$fs")
  done
  user=$("${podman[@]}" image inspect --format '{{.Config.User}}' "$img")
  data=$("${podman[@]}" image inspect --format '{{.Config.WorkingDir}}' "$img")
  [ -n "$user" ] && [ -n "$data" ] || {
    echo "image-test: $img names no USER or WORKDIR" >&2
    exit 1
  }
  local port_file=/tmp/kilnd.port
  rm -f "$root$port_file"
  chroot --userspec="$user:$user" "$root" env -i HOME="$data" PATH=/usr/local/bin:/usr/bin:/bin \
    sh -c "cd $data && exec kilnd --listen 127.0.0.1:0 --port-file $port_file --data-dir $data" \
    >"$work/kilnd.log" 2>&1 &
  kilnd_pid=$!
  for _ in $(seq 1 100); do
    [ -s "$root$port_file" ] && [ -s "$root$data/admin.token" ] && break
    kill -0 "$kilnd_pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! [ -s "$root$port_file" ]; then
    cat "$work/kilnd.log"
    echo "image-test: the kilnd of $img did not start" >&2
    exit 1
  fi
  port=$(cat "$root$port_file")
  curl -fsS "http://127.0.0.1:$port/healthz" && echo
}

# train_in: the example job, submitted with the image's kiln CLI to the
# kilnd run_in started; then that kilnd is stopped.
train_in() {
  cp "$repo/examples/fmnist-mlp.json" "$root/tmp/fmnist-mlp.json"
  chroot --userspec="$user:$user" "$root" env -i HOME="$data" PATH=/usr/local/bin:/usr/bin:/bin \
    KILN_SERVER="http://127.0.0.1:$port" KILN_TOKEN_FILE="$data/admin.token" \
    kiln submit /tmp/fmnist-mlp.json --wait --timeout 10m --require 'val_accuracy>=0.85' \
    -o json >"$work/job.json" || {
    rc=$?
    cat "$work/job.json" "$work/kilnd.log"
    echo "image-test: the example job did not reach val_accuracy 0.85 (kiln exit $rc)" >&2
    exit 1
  }
  python3 - "$work/job.json" <<'EOF'
import json, sys
job = json.load(open(sys.argv[1]))
print(f"job {job['id']} {job['state']}: val_accuracy {job['latest_metrics']['val_accuracy']:.4f}")
EOF
  stop_kilnd
}

begin run
run_in "$image"
end run

begin train
train_in
end train

summary="compose ${took[compose]} s, base ${took[base]} s, import ${took[import]} s, \
build ${took[build]} s, run ${took[run]} s, train ${took[train]} s"

if [ -n "$cuda" ]; then
  # ---- the CUDA image: bases of the bookworm root and the toolkit's files
  begin cuda-base
  echo "toolkit: $cuda ($("$cuda/bin/nvcc" --version | tail -n 1))"
  echo /usr/local/cuda/lib64 >"$work/root/etc/ld.so.conf.d/kiln-cuda.conf"
  libs=$(cd "$cuda" && ls -d lib64 lib/libcudart.so* lib/libcublas.so* lib/libcublasLt.so* lib/libnccl.so*)
  # what nvcc links into every program: the static runtime and the stubs
  devel_libs=$(cd "$cuda" && ls -d lib/libcudart_static.a lib/libcudadevrt.a lib/libculibos.a lib/stubs)
  # the runtime base: the shared libraries; the devel base: nvcc as well
  tar -C "$work/root" --numeric-owner -cf "$work/cuda-runtime.tar" .
  cp "$work/cuda-runtime.tar" "$work/cuda-devel.tar"
  tar -C "$cuda" --numeric-owner --owner=0 --group=0 --transform='flags=r;s,^,usr/local/cuda/,' \
    -rf "$work/cuda-runtime.tar" $libs
  tar -C "$cuda" --numeric-owner --owner=0 --group=0 --transform='flags=r;s,^,usr/local/cuda/,' \
    -rf "$work/cuda-devel.tar" $libs $devel_libs bin include nvvm
  rm -rf "$work/root"
  "${podman[@]}" import "$work/cuda-devel.tar" kiln-cuda-devel:bookworm >/dev/null
  "${podman[@]}" import "$work/cuda-runtime.tar" kiln-cuda-runtime:bookworm >/dev/null
  rm -f "$work/cuda-devel.tar" "$work/cuda-runtime.tar"
  "${podman[@]}" images
  end cuda-base

  begin cuda-build
  build_image docker/Dockerfile.cuda kiln-cuda:latest "$work/cuda-build.log" \
    CUDA_DEVEL_IMAGE=kiln-cuda-devel:bookworm CUDA_RUNTIME_IMAGE=kiln-cuda-runtime:bookworm
  end cuda-build

  begin cuda-run
  run_in kiln-cuda:latest
  ls -l "$root/usr/local/lib/libkiln_cuda.so"
  end cuda-run

  begin cuda-train
  train_in
  end cuda-train
  summary="$summary, cuda-base ${took[cuda-base]} s, cuda-build ${took[cuda-build]} s, \
cuda-run ${took[cuda-run]} s, cuda-train ${took[cuda-train]} s"
fi

echo "== image-test: passed in $(($(date +%s) - total_start)) s: $summary"
