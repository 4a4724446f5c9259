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

# --- shaped links (start.sh --link RATE) -----------------------------------
# Each slurmd in its own network namespace slurm-<node>, joined to this host through the bridge
# LINK_BRIDGE by a veth pair (veth-<node> inside, slv-<node> here), both ends shaped with tbf.
# Addresses from the benchmarking range 198.18.0.0/15 (RFC 2544), only on links these scripts make.
LINK_BRIDGE=slbr0
LINK_HOST_ADDR=198.18.0.1     # the bridge: slurmctld's address as the nodes see it
LINK_PREFIX=24
link_addr() { case $1 in n1) echo 198.18.0.11 ;; n2) echo 198.18.0.12 ;; esac; }

# Everything link_up made (namespaces, veths, bridge); idempotent, quiet.
link_down() {
  local n
  for n in n1 n2; do
    ip netns del "slurm-$n" 2>/dev/null || true      # takes veth-<n> and its peer slv-<n> with it
    ip link del "slv-$n" 2>/dev/null || true
  done
  ip link del "$LINK_BRIDGE" 2>/dev/null || true
}

# tbf needs a bucket of at least one timer tick's worth of bytes at the rate: 4 ms of it, >= 16 KiB.
link_burst() {
  local bits
  case $1 in *gbit) bits=$(( ${1%gbit} * 1000000000 )) ;; *mbit) bits=$(( ${1%mbit} * 1000000 )) ;; esac
  local b=$(( bits / 8 / 250 )); [ $b -ge 16384 ] || b=16384; echo $b
}

# Usage: link_up RATE NODE...
link_up() {
  local rate=$1; shift
  local burst n
  burst=$(link_burst "$rate")
  ip link add "$LINK_BRIDGE" type bridge
  ip addr add "$LINK_HOST_ADDR/$LINK_PREFIX" dev "$LINK_BRIDGE"
  ip link set "$LINK_BRIDGE" up
  for n in "$@"; do
    ip netns add "slurm-$n"
    ip link add "slv-$n" type veth peer name "veth-$n"
    ip link set "veth-$n" netns "slurm-$n"
    ip link set "slv-$n" master "$LINK_BRIDGE"
    ip link set "slv-$n" up
    ip -n "slurm-$n" link set lo up
    ip -n "slurm-$n" addr add "$(link_addr "$n")/$LINK_PREFIX" dev "veth-$n"
    ip -n "slurm-$n" link set "veth-$n" up
    # Both directions: what leaves the node (inside) and what reaches it (the bridge's port).
    tc qdisc add dev "slv-$n" root tbf rate "$rate" burst "$burst" latency 50ms
    ip netns exec "slurm-$n" tc qdisc add dev "veth-$n" root tbf rate "$rate" burst "$burst" latency 50ms
  done
}

# True when link_up's namespaces for these nodes exist.
link_present() {
  local n
  ip link show "$LINK_BRIDGE" >/dev/null 2>&1 || return 1
  for n in "$@"; do ip netns exec "slurm-$n" true 2>/dev/null || return 1; done
}

# --- slow nodes (--node-cpu) -------------------------------------------------
# A node's CPU capped through cgroup v1's cpu controller: its slurmd starts inside the group, and
# every job step it runs inherits it (slurm.conf.in: proctrack/linuxproc, task/none: Slurm moves
# no process into cgroups of its own). Quota = share x the node's CPUs (slurm.conf) x period, the
# period 10 ms rather than the kernel's 100 ms (as suite.common.cpu_cap's for a rank: a step of a
# few ms is then throttled alike wherever it falls in a period), longer where the quota would be
# under the kernel's least, 1 ms.
CPU_ROOT=/sys/fs/cgroup/cpu
cpu_group() { echo "$CPU_ROOT/slurm-$1"; }

# Usage: cpu_cap_up NODE PERCENT CPUS
cpu_cap_up() {
  local group period; group=$(cpu_group "$1")
  [ -e "$CPU_ROOT/cpu.cfs_quota_us" ] || { echo "cgroup v1's cpu controller is not mounted at $CPU_ROOT" >&2; return 1; }
  mkdir -p "$group"
  period=10000
  while (( period * $3 * $2 / 100 < 1000 && period < 1000000 )); do period=$(( period * 2 )); done
  echo "$period" >"$group/cpu.cfs_period_us"
  echo $(( period * $3 * $2 / 100 )) >"$group/cpu.cfs_quota_us"
}

# Remove every node's group (empty once its slurmd and job steps are gone; rmdir refuses otherwise).
cpu_cap_down() {
  local group
  for group in "$CPU_ROOT"/slurm-n*; do
    [ -d "$group" ] || continue
    rmdir "$group" 2>/dev/null || echo "cpu group $group still holds processes: $(tr '\n' ' ' <"$group/cgroup.procs")" >&2
  done
}
