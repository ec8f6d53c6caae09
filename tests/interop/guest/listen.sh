# Sourced by guest/lib.sh and guest/ssh-hosts (no side effects).
# shellcheck shell=bash

# interop_wait_listen PORT SECONDS: until something listens on TCP PORT (any
# address, IPv4 or IPv6), at most SECONDS (0: look once). libfabric's runner starts a
# client one second after its server, and fabtests' client gives up at
# once when the server's out-of-band socket is not there yet; under TCG a
# server can take longer than that to start (its libraries come over 9p).
interop_wait_listen() {
	local port hex i
	port=$1
	hex=$(printf ':%04X ' "$port")
	for ((i = 0; i <= $2 * 5; i++)); do
		# /proc/net/tcp*: "sl local_address rem_address st ...", 0A = LISTEN.
		# (tcp6 is absent without IPv6: cat skips it, awk sees both as one.)
		cat /proc/net/tcp /proc/net/tcp6 2>/dev/null |
			awk -v p="$hex" 'index($2 " ", p) && $4 == "0A" { found = 1 } END { exit !found }' &&
			return 0
		[ "$i" -lt $(($2 * 5)) ] && sleep 0.2
	done
	return 1
}

# interop_wait_closed PORT SECONDS: until nothing listens on TCP PORT, at
# most SECONDS: a test's server from the previous test may still be exiting.
interop_wait_closed() {
	local i
	for ((i = 0; i <= $2 * 5; i++)); do
		interop_wait_listen "$1" 0 || return 0
		[ "$i" -lt $(($2 * 5)) ] && sleep 0.2
	done
	return 1
}
