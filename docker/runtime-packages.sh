#!/bin/sh
# runtime-packages.sh FILE... — the packages that own the shared libraries
# the FILEs load, one a line: what a runtime stage installs for them, under
# the names its distribution gives them (libcurl4 on Debian 12, libcurl4t64
# on Ubuntu 24.04). A library no package owns (a CUDA toolkit copied in
# rather than installed) is left out: the runtime base carries it.
set -eu
ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u | while read -r lib; do
  # merged /usr: dpkg knows a library under the path its package gave it
  for path in "$lib" "${lib#/usr}" "/usr$lib"; do
    owner=$(dpkg -S "$path" 2>/dev/null | head -n 1)
    if [ -n "$owner" ]; then
      echo "${owner%%:*}"
      break
    fi
  done
done | sort -u
