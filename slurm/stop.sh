#!/usr/bin/env bash
# Stop the local Slurm cluster started by slurm/start.sh: slurmd(s), slurmctld, slurmdbd,
# MariaDB, munged, in that order, each by its pidfile. Idempotent.
# Running jobs are not cancelled: slurmctld saves its state and a later start.sh recovers them.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"

# SIGTERM, then wait (MariaDB flushes InnoDB on shutdown); SIGKILL only as a last resort.
stop_one() {
  local name=$1 pidfile=$2 comm=$3 pid
  if ! pid_alive "$pidfile" "$comm"; then
    rm -f "$pidfile"; return 0
  fi
  pid=$(tr -dc 0-9 <"$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  if ! wait_for 30 proc_gone "$pid"; then
    echo "stop: $name (pid $pid) ignored SIGTERM for 30 s, killing" >&2
    kill -KILL "$pid" 2>/dev/null || true
    wait_for 5 proc_gone "$pid" || true
  fi
  rm -f "$pidfile"
  echo "stop: $name stopped"
}

# Any slurmd with a pidfile, whatever the current node count.
for f in /run/slurmd-*.pid; do
  [ -e "$f" ] || continue
  n=${f#/run/slurmd-}; stop_one "slurmd ${n%.pid}" "$f" slurmd
done
while read -r name pidfile comm; do
  stop_one "$name" "$pidfile" "$comm"
done < <(base_daemons | tac)
if ip link show "$LINK_BRIDGE" >/dev/null 2>&1 || ls /run/netns/slurm-n* >/dev/null 2>&1; then
  link_down; echo "stop: shaped links removed (namespaces slurm-n*, bridge $LINK_BRIDGE)"
fi
if ls -d "$CPU_ROOT"/slurm-n* >/dev/null 2>&1; then
  cpu_cap_down; echo "stop: node CPU caps removed (cgroups $CPU_ROOT/slurm-n*)"
fi
echo "stop: all local Slurm daemons down"
