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
DEV0=$(interop_dev 0) || { echo "interop: no RDMA device 0"; exit 1; }
DEV1=$(interop_dev 1) || { echo "interop: no RDMA device 1 (the tests need two)"; exit 1; }

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

# hw_counter DEV NAME: port 1's hardware counter NAME of RDMA device DEV.
hw_counter() {
	cat "/sys/class/infiniband/$1/ports/1/hw_counters/$2"
}

ip link set lo up 2>/dev/null

. "$(dirname "${BASH_SOURCE[0]}")/listen.sh"

# Two "hosts" for runners that start their peers over ssh: 127.0.0.1 (the
# server side, device 0) and 127.0.0.2 (the client side, device 1).
# guest/ssh-loopback becomes `ssh` first in PATH and runs each command here
# with FI_EFA_IFACE set to its host's device, so that libfabric's efa
# provider on either side uses a different device.
interop_ssh() {
	local d=/tmp/interop-ssh here
	here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
	mkdir -p $d/bin
	printf '%s %s\n' "$DEV0" "$DEV1" >$d/devs
	ln -sf "$here/ssh-loopback" $d/bin/ssh
	export PATH=$d/bin:$PATH
	[ "$(ssh -n 127.0.0.2 'echo $FI_EFA_IFACE')" = "$DEV1" ] &&
		[ "$(ssh -n 127.0.0.1 'echo $FI_EFA_IFACE')" = "$DEV0" ]
}
