# Shared helpers for start.sh / stop.sh / status.sh (sourced, not run).
# shellcheck shell=bash

LOG_DIR=${SLURM_LOCAL_LOG_DIR:-/var/log/slurm-local}
CLUSTER=${SLURM_LOCAL_CLUSTER:-ci}
HOSTS_FILE=/etc/slurm/hosts.local   # bind-mounted over /etc/hosts for each slurmd
DB_PASS_FILE=/etc/slurm/slurmdbd.pass

# "<name> <pidfile> <process name>" in start order; stop walks it backwards.
# slurmd lines are added per node from the existing pidfiles or the node list.
base_daemons() {
  cat <<'EOT'
munged /run/munge/munged.pid munged
mariadb /run/mysqld/mysqld.pid mariadbd
slurmdbd /run/slurmdbd.pid slurmdbd
slurmctld /run/slurmctld.pid slurmctld
EOT
}

# True while a pid exists and is not a zombie. PID 1 here reaps orphans only ~1.5 s
# after they exit, and `kill -0` succeeds on zombies, so read the state from /proc.
proc_running() {
  local state
  state=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

proc_gone() { ! proc_running "$1"; }

# True when the pidfile names a running process with the expected name
# (a stale pidfile may point at a recycled pid).
pid_alive() {
  local pidfile=$1 comm=$2 pid
  [ -r "$pidfile" ] || return 1
  pid=$(tr -dc 0-9 <"$pidfile")
  [ -n "$pid" ] && [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$comm" ] && proc_running "$pid"
}

# Poll a command until it succeeds or the timeout (s) passes.
wait_for() {
  local timeout_s=$1; shift
  local deadline=$((SECONDS + timeout_s))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.5
  done
}

# Node names in the current config (n1, n2); empty if no config yet.
config_nodes() {
  [ -r /etc/slurm/slurm.conf ] || return 0
  sed -n 's/^NodeName=\([^ ]*\).*/\1/p' /etc/slurm/slurm.conf
}

# Every configured node answers and can take jobs (idle, mixed, allocated, completing).
nodes_usable() {
  local states
  states=$(sinfo -h -N -o '%t' 2>/dev/null) || return 1
  [ -n "$states" ] && ! grep -qvE '^(idle|mix|alloc|comp)$' <<<"$states"
}
