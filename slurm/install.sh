#!/usr/bin/env bash
# Install the Debian 12 packages for a local Slurm 22.05 cluster with accounting.
# Idempotent: does nothing when every package is already installed.
set -euo pipefail

PKGS=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
LOG=${SLURM_LOCAL_LOG_DIR:-/var/log/slurm-local}/install.log
mkdir -p "$(dirname "$LOG")"

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install: all packages present (${PKGS[*]})"
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
apt_install() {
  apt-get install -y -q --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}" >>"$LOG" 2>&1
}
# Only refresh the package lists when apt does not know a package (lists absent or pruned).
needs_update=0
for p in "${missing[@]}"; do
  apt-cache policy "$p" 2>/dev/null | grep -q 'Candidate: [0-9]' || needs_update=1
done
if [ $needs_update -eq 1 ]; then
  echo "install: apt-get update"
  apt-get update -q >>"$LOG" 2>&1 || { echo "install: apt-get update failed, see $LOG" >&2; exit 1; }
fi

echo "install: installing ${missing[*]} (log: $LOG)"
t0=$SECONDS
# Stale lists give 404s on download: refresh once and retry before giving up.
if ! apt_install; then
  echo "install: first attempt failed, refreshing lists and retrying"
  apt-get update -q >>"$LOG" 2>&1 && apt_install \
    || { echo "install: apt-get install failed, see $LOG" >&2; exit 1; }
fi
echo "install: done in $((SECONDS - t0)) s"
