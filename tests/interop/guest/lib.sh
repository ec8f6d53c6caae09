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

# An sshd on loopback for runners that start their peers over ssh. Two
# "hosts": 127.0.0.1 (the server side) and 127.0.0.2 (the client side);
# sessions on each see FI_EFA_IFACE set to its own device, so that
# libfabric's efa provider on either side uses a different device. The
# root filesystem is read-only: keys and configuration live in /tmp and
# the ssh client's configuration is bound over the tree's.
interop_sshd() {
	local d=/tmp/interop-ssh
	[ -e $d/sshd.pid ] && return 0
	mkdir -p $d /run/sshd
	chmod 700 $d
	ssh-keygen -q -t ed25519 -N '' -f $d/host_key </dev/null || return 1
	ssh-keygen -q -t ed25519 -N '' -f $d/id </dev/null || return 1
	cp $d/id.pub $d/authorized_keys
	cat >$d/sshd_config <<CONF
ListenAddress 127.0.0.1
ListenAddress 127.0.0.2
HostKey $d/host_key
PidFile $d/sshd.pid
PermitRootLogin prohibit-password
AuthorizedKeysFile $d/authorized_keys
StrictModes no
UsePAM no
PrintMotd no
MaxStartups 100
MaxSessions 100
Match LocalAddress 127.0.0.1
	SetEnv FI_EFA_IFACE=$DEV0
Match LocalAddress 127.0.0.2
	SetEnv FI_EFA_IFACE=$DEV1
CONF
	cat >$d/ssh_config <<CONF
Host *
	IdentityFile $d/id
	UserKnownHostsFile /dev/null
	StrictHostKeyChecking no
	LogLevel ERROR
CONF
	mountpoint -q /etc/ssh/ssh_config || mount --bind $d/ssh_config /etc/ssh/ssh_config || return 1
	/usr/sbin/sshd -f $d/sshd_config || return 1
	local h
	for h in 127.0.0.1 127.0.0.2; do
		[ "$(ssh -n -o BatchMode=yes $h 'echo $FI_EFA_IFACE')" = "$([ $h = 127.0.0.1 ] && echo $DEV0 || echo $DEV1)" ] || {
			echo "interop: ssh to $h does not work or does not set FI_EFA_IFACE"
			return 1
		}
	done
}
