#!/usr/bin/env bash
# Start a real local Slurm 22.05 cluster (munge, MariaDB, slurmdbd, slurmctld, 1-2 slurmd).
# Usage: slurm/start.sh [--nodes 1|2] [--link 10gbit|1gbit|100mbit] [--node-cpu n2=50%]   Idempotent: an already-running cluster is left as is.
#   --link RATE: each slurmd in its own network namespace behind a tbf-shaped veth (slurm/README.md).
#   --node-cpu NODE=PCT: that node's slurmd and its jobs capped at PCT of the node's CPUs (cgroup v1; repeatable).
set -eEuo pipefail   # -E: the ERR trap below also fires inside functions
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"

NODES=2
LINK=
NODE_CPU=()   # NODE=PCT, each node capped (--node-cpu)
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) NODES=${2:-}; shift 2 ;;
    --nodes=*) NODES=${1#*=}; shift ;;
    --link) LINK=${2:-}; shift 2 ;;
    --link=*) LINK=${1#*=}; shift ;;
    --node-cpu) NODE_CPU+=("${2:-}"); shift 2 ;;
    --node-cpu=*) NODE_CPU+=("${1#*=}"); shift ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) echo "start: unknown argument '$1' (accepted: --nodes 1|2, --link 10gbit|1gbit|100mbit, --node-cpu n2=50%)" >&2; exit 2 ;;
  esac
done
case $NODES in 1|2) ;; *) echo "start: --nodes must be 1 or 2, got '$NODES'" >&2; exit 2 ;; esac
case $LINK in ''|10gbit|1gbit|100mbit) ;; *) echo "start: --link must be 10gbit, 1gbit or 100mbit, got '$LINK'" >&2; exit 2 ;; esac
declare -A CPU_SHARE=()   # node -> percent of its CPUs
for spec in "${NODE_CPU[@]}"; do
  node=${spec%%=*}; pct=${spec#*=}; pct=${pct%\%}
  [[ $spec == *=* && $node =~ ^n[1-9]$ && $pct =~ ^[0-9]+$ ]] && [ "$pct" -ge 1 ] && [ "$pct" -le 100 ] \
    || { echo "start: --node-cpu takes NODE=PERCENT, e.g. n2=50%, got '$spec'" >&2; exit 2; }
  [ "${node#n}" -le "$NODES" ] || { echo "start: --node-cpu names $node, but the cluster has nodes n1..n$NODES" >&2; exit 2; }
  CPU_SHARE[$node]=$pct
done

mkdir -p "$LOG_DIR"
LOG=$LOG_DIR/start.log
echo "=== start.sh --nodes $NODES $(date -Is)" >>"$LOG"
LINK_MADE=   # set once this run made the namespaces: a failure then removes them again
CPU_MADE=    # likewise for the capped nodes' cgroups (--node-cpu)
die() {
  if [ -n "$LINK_MADE" ]; then
    local n
    for n in "${node_names[@]}"; do  # slurmds started in them go first
      pid_alive "/run/slurmd-$n.pid" slurmd && kill -TERM "$(tr -dc 0-9 <"/run/slurmd-$n.pid")" 2>/dev/null
    done
    link_down
  fi
  if [ -n "$CPU_MADE" ]; then   # the capped nodes' slurmds first, then the groups they leave empty
    for n in "${!CPU_SHARE[@]}"; do
      pid_alive "/run/slurmd-$n.pid" slurmd && kill -TERM "$(tr -dc 0-9 <"/run/slurmd-$n.pid")" 2>/dev/null
    done
    sleep 1; cpu_cap_down
  fi
  echo "start: $*; see $LOG and /var/log/slurm/" >&3; exit 1   # fd 3: the caller's stderr, also from redirected steps
}
exec 3>&2
trap 'die "failed at line $LINENO"' ERR
t0=$SECONDS

for bin in munged mariadbd slurmdbd slurmctld slurmd sinfo sacctmgr; do
  command -v "$bin" >/dev/null || die "'$bin' not found: run slurm/install.sh first"
done

# Run a daemon detached from the caller: new session, no inherited stdio
# (otherwise `start.sh | tee` waits forever on the pipe the daemon holds open).
# Usage: detach LOGFILE CMD...  (the slurm daemons and munged keep their own logs too)
detach() { local out=$1; shift; setsid -f "$@" </dev/null >>"$out" 2>&1 3>&-; }

# --- config ---------------------------------------------------------------
node_names=(n1 n2); node_names=("${node_names[@]:0:$NODES}")
NODE_CPUS=2   # each node's CPUs in slurm.conf; what --node-cpu's percentage is of
new_conf=$(mktemp); trap 'rm -f "$new_conf"' EXIT
{
  if [ -n "$LINK" ]; then  # the nodes reach slurmctld through the bridge
    sed -e "s/@CLUSTER@/$CLUSTER/" -e "s/^SlurmctldHost=localhost$/SlurmctldHost=localhost($LINK_HOST_ADDR)/" "$HERE/conf/slurm.conf.in"
  else
    sed "s/@CLUSTER@/$CLUSTER/" "$HERE/conf/slurm.conf.in"
  fi
  echo
  echo "# $NODES node(s) on this host; each slurmd listens on its own port."
  [ -z "$LINK" ] || echo "# link: $LINK (each node in network namespace slurm-<node>, veth-<node> shaped by tbf)"
  # a changed cap changes the config, so a running cluster with another one is refused (stop.sh first)
  for n in "${!CPU_SHARE[@]}"; do echo "# cpu: $n capped at ${CPU_SHARE[$n]}% of its CPUs (cgroup $(cpu_group "$n"))"; done
  port=17001
  for n in "${node_names[@]}"; do
    addr=127.0.0.1; [ -z "$LINK" ] || addr=$(link_addr "$n")
    echo "NodeName=$n NodeHostname=localhost NodeAddr=$addr Port=$port CPUs=$NODE_CPUS RealMemory=10000 State=UNKNOWN"
    port=$((port + 1))
  done
  echo "PartitionName=debug Nodes=$(IFS=,; echo "${node_names[*]}") Default=YES MaxTime=INFINITE State=UP"
} >"$new_conf"

summary() {
  echo "start: cluster '$CLUSTER' $1: nodes $(sinfo -h -o '%N') in partition debug, $(sinfo -h -o '%C' | cut -d/ -f4) CPUs"
}

# Already up with this config: nothing to do.
all_up() {
  local name pidfile comm n
  while read -r name pidfile comm; do pid_alive "$pidfile" "$comm" || return 1; done < <(base_daemons)
  for n in "${node_names[@]}"; do pid_alive "/run/slurmd-$n.pid" slurmd || return 1; done
  [ -z "$LINK" ] || link_present "${node_names[@]}" || return 1
  for n in "${!CPU_SHARE[@]}"; do [ -d "$(cpu_group "$n")" ] || return 1; done
  nodes_usable
}
if cmp -s "$new_conf" /etc/slurm/slurm.conf && all_up; then
  summary "already up"; exit 0
fi

slurm_running() {
  local f
  for f in /run/slurmctld.pid /run/slurmd-*.pid; do pid_alive "$f" "$(basename "${f%%-*}" .pid)" && return 0; done
  return 1
}
mkdir -p /etc/slurm
if ! cmp -s "$new_conf" /etc/slurm/slurm.conf; then
  # Changing the node set under running daemons leaves them disagreeing: ask for a clean restart.
  slurm_running && die "cluster is running with a different config (nodes, links or CPU caps); run slurm/stop.sh first"
  cp "$new_conf" /etc/slurm/slurm.conf
fi

# Jobs must resolve node names (submitit uses n1 as MASTER_ADDR): each slurmd gets
# the host's /etc/hosts plus the node names, bind-mounted in its own mount namespace.
if [ -z "$LINK" ]; then
  { grep -v ' # slurm-local$' /etc/hosts; echo "127.0.0.1 ${node_names[*]} # slurm-local"; } >"$HOSTS_FILE"
else  # each name to its namespace's address
  { grep -v ' # slurm-local$' /etc/hosts; for n in "${node_names[@]}"; do echo "$(link_addr "$n") $n # slurm-local"; done; } >"$HOSTS_FILE"
fi

[ -s "$DB_PASS_FILE" ] || (umask 077; od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$DB_PASS_FILE")
(umask 077; sed "s/@DB_PASS@/$(cat "$DB_PASS_FILE")/" "$HERE/conf/slurmdbd.conf.in" >/etc/slurm/slurmdbd.conf)

mkdir -p /var/log/slurm /var/spool/slurmctld /run/munge /run/mysqld
for n in "${node_names[@]}"; do mkdir -p "/var/spool/slurmd/$n"; done
chown munge:munge /run/munge; chown mysql:mysql /run/mysqld
echo "start: config written (/etc/slurm/slurm.conf, $NODES node(s))"

# --- munge ----------------------------------------------------------------
if [ ! -s /etc/munge/munge.key ]; then
  mungekey --create --keyfile=/etc/munge/munge.key >>"$LOG" 2>&1
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
fi
pid_alive /run/munge/munged.pid munged || detach "$LOG" runuser -u munge -- munged
wait_for 15 sh -c 'munge -n | unmunge' || die "munged did not come up (/var/log/munge/munged.log)"

# --- MariaDB (socket only) + accounting database --------------------------
if ! pid_alive /run/mysqld/mysqld.pid mariadbd; then
  detach "$LOG_DIR/mariadb.log" mariadbd --user=mysql --skip-networking --pid-file=/run/mysqld/mysqld.pid
fi
wait_for 30 mariadb-admin ping || die "MariaDB did not come up ($LOG_DIR/mariadb.log)"
mariadb >>"$LOG" 2>&1 <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$(cat "$DB_PASS_FILE")';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$(cat "$DB_PASS_FILE")';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL
echo "start: munged, MariaDB up"

# --- slurmdbd + cluster registration --------------------------------------
pid_alive /run/slurmdbd.pid slurmdbd || detach "$LOG" slurmdbd
wait_for 30 sacctmgr -n show cluster || die "slurmdbd did not answer (/var/log/slurm/slurmdbd.log)"
if ! sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER"; then
  sacctmgr -i add cluster "$CLUSTER" >>"$LOG" 2>&1
fi
echo "start: slurmdbd up, cluster '$CLUSTER' in accounting"

# --- shaped links (--link) -------------------------------------------------
if [ -n "$LINK" ] && ! link_present "${node_names[@]}"; then
  for bin in ip tc; do command -v "$bin" >/dev/null || die "'$bin' not found (iproute2): --link needs it"; done
  link_down; LINK_MADE=1
  link_up "$LINK" "${node_names[@]}" >>"$LOG" 2>&1   # a failing step: the ERR trap removes what was made
  echo "start: links up: ${node_names[*]} in network namespaces behind $LINK veths ($LINK_HOST_ADDR/$LINK_PREFIX)"
fi

# --- slurmctld + slurmd(s) ------------------------------------------------
pid_alive /run/slurmctld.pid slurmctld || detach "$LOG" slurmctld
wait_for 30 sinfo || die "slurmctld did not answer (/var/log/slurm/slurmctld.log)"
for n in "${node_names[@]}"; do
  pid_alive "/run/slurmd-$n.pid" slurmd && continue
  mkdir -p "/tmp/slurm-$n"   # the node's TmpFS (slurm.conf.in says why)
  netns=(); [ -z "$LINK" ] || netns=(nsenter "--net=/run/netns/slurm-$n")   # its jobs inherit the namespace (not `ip netns exec`: it remounts /sys, hiding the cgroup mount slurmd wants)
  join=   # --node-cpu: the shell joins the node's capped group before it becomes slurmd (jobs inherit it)
  if [ -n "${CPU_SHARE[$n]:-}" ]; then
    CPU_MADE=1
    cpu_cap_up "$n" "${CPU_SHARE[$n]}" "$NODE_CPUS" >>"$LOG" 2>&1
    join="echo \$\$ >'$(cpu_group "$n")/cgroup.procs' && "
    echo "start: $n capped at ${CPU_SHARE[$n]}% of its $NODE_CPUS CPUs ($(cpu_group "$n"))"
  fi
  detach "$LOG" "${netns[@]}" unshare -m --propagation slave \
    sh -c "${join}mount --bind '$HOSTS_FILE' /etc/hosts && exec slurmd -N '$n'"
done
wait_for 60 nodes_usable || { sinfo -N >>"$LOG" 2>&1 || true; die "nodes not idle within 60 s (sinfo -N)"; }

summary "up in $((SECONDS - t0)) s"
