# Sourced by the guest side of tests/interop (inside the test VM, as root,
# with a driver bound to two emulated EFA devices). Results go to the
# console as lines the host collects:
#   interop-result: SUITE TEST pass|fail|skip [reason]
# shellcheck shell=bash
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# The devices' names: refa_N under refa.ko, efa_N under efa.ko.
interop_dev() {
	local d
	for d in /sys/class/infiniband/*_"$1"; do
		[ -e "$d" ] && { basename "$d"; return 0; }
	done
	return 1
}
# Two sides, a server's and a client's. In one guest: device 0 and device 1
# of this guest. In a cluster of tools/vm/cluster (REFA_CLUSTER_NODES, the
# script runs on node0): device 0 of node0 and device 0 of node1, the
# client's commands started over ssh. INTEROP_SERVER is the address a
# client gives to reach its server's out-of-band socket.
if [ -n "${REFA_CLUSTER_NODES:-}" ]; then
	INTEROP_CLUSTER=1 INTEROP_SERVER=node0 INTEROP_HOSTS=(node0 node1)
	DEV0=$(interop_dev 0) || { echo "interop: no RDMA device 0 on node0"; exit 1; }
	DEV1=$(ssh -n node1 'cd /sys/class/infiniband && echo *_0') && [ "$DEV1" != "*_0" ] ||
		{ echo "interop: no RDMA device 0 on node1"; exit 1; }
else
	INTEROP_CLUSTER=0 INTEROP_SERVER=127.0.0.1 INTEROP_HOSTS=(127.0.0.1 127.0.0.2)
	DEV0=$(interop_dev 0) || { echo "interop: no RDMA device 0"; exit 1; }
	DEV1=$(interop_dev 1) || { echo "interop: no RDMA device 1 (the tests need two)"; exit 1; }
fi

# client CMD...: CMD on the client's side, with FI_EFA_IFACE naming the
# client's device (in a cluster: on node1, which has only that one; the
# FI_* and UCX_* variables go with it, tools/vm/cluster's SendEnv).
client() {
	if [ "$INTEROP_CLUSTER" = 1 ]; then
		# PATH and LD_LIBRARY_PATH too: a suite's own builds (UCX's) are
		# found through them.
		FI_EFA_IFACE=$DEV1 ssh -n node1 "cd /tmp && $(printf '%q ' env PATH="$PATH" ${LD_LIBRARY_PATH:+LD_LIBRARY_PATH="$LD_LIBRARY_PATH"} "$@")"
	else
		FI_EFA_IFACE=$DEV1 "$@"
	fi
}

INTEROP_RESULTS=0
result() {
	local suite=$1 test=$2 status=$3
	shift 3
	# One line, whatever the test's name holds.
	printf 'interop-result: %s %s %s %s\n' "$suite" "${test// /_}" "$status" "$*"
	INTEROP_RESULTS=$((INTEROP_RESULTS + 1))
}

# suite_done SUITE [N]: the last line of a suite's guest script. The host
# (tests/interop/run) fails a suite whose marker is missing (its script
# died or hung) or whose result lines it parsed are fewer than N (a line
# garbled on the console): results that never arrive must not read as
# "nothing failed". N defaults to the results printed through result().
suite_done() {
	echo "interop-suite-done: $1 ${2:-$INTEROP_RESULTS}"
}

# hw_counter SIDE NAME: port 1's hardware counter NAME of side SIDE's
# device (0: the server's, $DEV0; 1: the client's, $DEV1).
hw_counter() {
	case "$1" in
	0) cat "/sys/class/infiniband/$DEV0/ports/1/hw_counters/$2" ;;
	1) client cat "/sys/class/infiniband/$DEV1/ports/1/hw_counters/$2" ;;
	*) echo "hw_counter: side 0 or 1, not '$1'" >&2; return 1 ;;
	esac
}

ip link set lo up 2>/dev/null

. "$(dirname "${BASH_SOURCE[0]}")/listen.sh"

# Two hosts for runners that start their peers over ssh (INTEROP_HOSTS):
# the server's side first. guest/ssh-hosts becomes `ssh` first in PATH: in
# one guest it runs each command here with FI_EFA_IFACE set to its host's
# device (127.0.0.1: device 0, 127.0.0.2: device 1), so that libfabric's efa
# provider on either side uses a different device; in a cluster it is ssh,
# with a client held until its server listens.
interop_ssh() {
	local d=/tmp/interop-ssh here
	here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
	mkdir -p $d/bin
	printf '%s %s %s\n' "$INTEROP_CLUSTER" "$DEV0" "$DEV1" >$d/devs
	ln -sf "$here/ssh-hosts" $d/bin/ssh
	export PATH=$d/bin:$PATH
	if [ "$INTEROP_CLUSTER" = 1 ]; then
		[ "$(ssh -n node1 hostname)" = node1 ] && [ "$(ssh -n node0 hostname)" = node0 ]
	else
		[ "$(ssh -n 127.0.0.2 'echo $FI_EFA_IFACE')" = "$DEV1" ] &&
			[ "$(ssh -n 127.0.0.1 'echo $FI_EFA_IFACE')" = "$DEV0" ]
	fi
}
