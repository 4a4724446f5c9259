#!/usr/bin/env bash
# Show the local Slurm cluster: each daemon's state and sinfo.
# Exit 0 only when every daemon runs and every node can take jobs.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"

ok=0
report() {
  local name=$1 pidfile=$2 comm=$3
  if pid_alive "$pidfile" "$comm"; then
    printf '  %-10s running (pid %s)\n' "$name" "$(tr -dc 0-9 <"$pidfile")"
  else
    printf '  %-10s NOT running\n' "$name"; ok=1
  fi
}
echo "daemons:"
while read -r name pidfile comm; do report "$name" "$pidfile" "$comm"; done < <(base_daemons)
nodes=$(config_nodes)
[ -n "$nodes" ] || { echo "  no /etc/slurm/slurm.conf: run slurm/start.sh"; exit 1; }
for n in $nodes; do report "slurmd $n" "/run/slurmd-$n.pid" slurmd; done

echo "sinfo:"
if sinfo -N -o '  %N %P %t %C' 2>/dev/null; then
  nodes_usable || { echo "  some node cannot take jobs (see sinfo -R)"; ok=1; }
else
  echo "  sinfo failed (slurmctld down?)"; ok=1
fi
[ $ok -eq 0 ] && echo "status: cluster '$CLUSTER' usable" || echo "status: cluster NOT usable (slurm/start.sh; logs in $LOG_DIR and /var/log/slurm)"
exit $ok
