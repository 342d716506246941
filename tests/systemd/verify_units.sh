#!/bin/sh
# verify_units.sh KILND UNITS_DIR [KILN_AGENT] — checks dist/systemd/: kilnd.service passes
# `systemd-analyze verify` with no warning at all (an unknown or misspelt
# directive is only a warning there), its sandbox's exposure is at most
# 2.5 by `systemd-analyze security` (printed), and kiln.sysusers.conf makes
# the user it runs as. ExecStart's /usr/local/bin/kilnd is replaced by the
# build's kilnd, since verify wants an executable there.
set -eu
kilnd=$1
units=$2
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "verify_units: SKIPPED: systemd-analyze is not installed (bash scripts/install-deps.sh)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s#/usr/local/bin/kilnd#$kilnd#" "$units/kilnd.service" >"$tmp/kilnd.service"
grep -q "^ExecStart=$kilnd " "$tmp/kilnd.service" || {
  echo "verify_units: kilnd.service does not start /usr/local/bin/kilnd" >&2
  exit 1
}
if ! systemd-analyze verify "$tmp/kilnd.service" >"$tmp/verify.log" 2>&1; then
  cat "$tmp/verify.log"
  if grep -qiE 'failed to (connect|initialize)|no such file or directory.*(bus|manager)' "$tmp/verify.log"; then
    echo "verify_units: SKIPPED: systemd-analyze cannot run in this container"
    exit 77
  fi
  echo "verify_units: systemd-analyze verify failed" >&2
  exit 1
fi
if [ -s "$tmp/verify.log" ]; then
  cat "$tmp/verify.log"
  echo "verify_units: systemd-analyze verify warned about kilnd.service" >&2
  exit 1
fi
echo "verify_units: systemd-analyze verify kilnd.service: no warnings"

systemd-analyze security --offline=yes --threshold=25 "$tmp/kilnd.service" >"$tmp/security.log" 2>&1 && rc=0 || rc=$?
# what the sandbox leaves open, then the score
grep -E '^✗ |Overall exposure' "$tmp/security.log" || cat "$tmp/security.log"
if [ "$rc" -ne 0 ]; then
  echo "verify_units: kilnd.service's exposure is over 2.5 (or the review failed, status $rc)" >&2
  exit 1
fi

# Sandboxing directives the operations guide promises.
for d in 'User=kiln' 'ProtectSystem=strict' 'ReadWritePaths=/var/lib/kiln' 'NoNewPrivileges=yes' \
  'PrivateTmp=yes' 'ProtectHome=yes' 'CapabilityBoundingSet=$' 'EnvironmentFile=-/etc/default/kilnd'; do
  grep -q "^$d" "$tmp/kilnd.service" || {
    echo "verify_units: kilnd.service lacks $d" >&2
    exit 1
  }
done

mkdir -p "$tmp/root/etc" "$tmp/root/usr/lib/sysusers.d"
cp "$units/kiln.sysusers.conf" "$tmp/root/usr/lib/sysusers.d/kiln.conf"
systemd-sysusers --root="$tmp/root" >/dev/null
grep -q '^kiln:x:[0-9]*:[0-9]*:[^:]*:/var/lib/kiln:/usr/sbin/nologin$' "$tmp/root/etc/passwd" || {
  cat "$tmp/root/etc/passwd"
  echo "verify_units: kiln.sysusers.conf does not make the user kiln (home /var/lib/kiln, no shell)" >&2
  exit 1
}
echo "verify_units: kiln.sysusers.conf makes $(grep '^kiln:' "$tmp/root/etc/passwd")"

# kiln-agent.service: no warning from verify, its exposure printed, and the
# flags a registration needs with the token from a file, not the command line.
agent=${3:-}
[ -n "$agent" ] || exit 0
sed "s#/usr/local/bin/kiln-agent#$agent#" "$units/kiln-agent.service" >"$tmp/kiln-agent.service"
if ! systemd-analyze verify "$tmp/kiln-agent.service" >"$tmp/verify-agent.log" 2>&1 ||
  [ -s "$tmp/verify-agent.log" ]; then
  cat "$tmp/verify-agent.log"
  echo "verify_units: systemd-analyze verify failed or warned about kiln-agent.service" >&2
  exit 1
fi
echo "verify_units: systemd-analyze verify kiln-agent.service: no warnings"
systemd-analyze security --offline=yes "$tmp/kiln-agent.service" 2>&1 | grep 'Overall exposure' || true
for d in 'User=kiln' 'KillMode=mixed' 'EnvironmentFile=-/etc/default/kiln-agent' 'StateDirectory=kiln-agent'; do
  grep -q "^$d" "$tmp/kiln-agent.service" || {
    echo "verify_units: kiln-agent.service lacks $d" >&2
    exit 1
  }
done
for flag in --server --pool --address '--token-file /etc/kiln/agent.token' '--work-dir /var/lib/kiln-agent'; do
  grep -q "^ExecStart=$agent .*$flag" "$tmp/kiln-agent.service" || {
    echo "verify_units: kiln-agent.service does not pass $flag" >&2
    exit 1
  }
done
# Every flag the unit and its environment file's example pass is one kiln-agent knows.
"$agent" --help >"$tmp/agent-help.txt"
for flag in $(grep -h -e '^ExecStart=' -e 'KILN_AGENT_OPTS=-' "$units/kiln-agent.service" "$units/kiln-agent.env" |
  grep -o -- '--[a-z-]*' | sort -u); do
  grep -q -- "$flag " "$tmp/agent-help.txt" || {
    echo "verify_units: kiln-agent has no flag $flag (kiln-agent --help)" >&2
    exit 1
  }
done
echo "verify_units: kiln-agent.service starts kiln-agent with its token file and work dir"
