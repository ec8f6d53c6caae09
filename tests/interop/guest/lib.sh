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

result() {
	local suite=$1 test=$2 status=$3
	shift 3
	# One line, whatever the test's name holds.
	printf 'interop-result: %s %s %s %s\n' "$suite" "${test// /_}" "$status" "$*"
}

ip link set lo up 2>/dev/null

# An ssh server on loopback for runners that start their peers over ssh.
# Two "hosts": 127.0.0.1 (the server side) and 127.0.0.2 (the client side);
# sessions on each see FI_EFA_IFACE set to its own device (a forced command,
# guest/ssh-session, picks it by the address the session came in on), so
# that libfabric's efa provider on either side uses a different device.
# The server is dropbear: OpenSSH's sshd needs seccomp filters, which the
# test kernel does not have. The root filesystem is read-only: keys and
# configuration live in /tmp and the ssh client's configuration is bound
# over the tree's.
interop_sshd() {
	local d=/tmp/interop-ssh here
	here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
	[ -e $d/sshd.pid ] && return 0
	mkdir -p $d
	chmod 700 $d
	printf '%s %s\n' "$DEV0" "$DEV1" >$d/devs
	dropbearkey -t ed25519 -f $d/host_key >/dev/null 2>&1 || return 1
	ssh-keygen -q -t ed25519 -N '' -f $d/id </dev/null || return 1
	echo "command=\"$here/ssh-session\" $(cat $d/id.pub)" >$d/authorized_keys
	chmod 600 $d/authorized_keys
	cat >$d/ssh_config <<CONF
Host *
	IdentityFile $d/id
	UserKnownHostsFile /dev/null
	StrictHostKeyChecking no
	LogLevel ERROR
CONF
	mountpoint -q /etc/ssh/ssh_config || mount --bind $d/ssh_config /etc/ssh/ssh_config || return 1
	dropbear -r $d/host_key -D $d -P $d/sshd.pid -p 127.0.0.1:22 -p 127.0.0.2:22 -s -E 2>$d/dropbear.log || return 1
	local h want i
	for h in 127.0.0.1 127.0.0.2; do
		want=$([ $h = 127.0.0.1 ] && echo "$DEV0" || echo "$DEV1")
		for i in $(seq 50); do
			[ "$(ssh -n -o BatchMode=yes $h 'echo $FI_EFA_IFACE' 2>/dev/null)" = "$want" ] && continue 2
			sleep 0.2
		done
		echo "interop: ssh to $h does not work or does not set FI_EFA_IFACE=$want:"
		ssh -n -o BatchMode=yes $h 'echo $FI_EFA_IFACE'
		cat $d/dropbear.log
		return 1
	done
}
