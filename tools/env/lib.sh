# Shared by the scripts under tools/: where the cache lives, how it is keyed,
# and how a command runs inside the Debian tree. Source it; do not run it.
# shellcheck shell=bash

REFA_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
REFA_CACHE=${REFA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/refa}
REFA_SUITE=trixie
REFA_MIRROR=${REFA_MIRROR:-http://deb.debian.org/debian}

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() {
	printf '\033[1;31mrefa: %s\033[0m\n' "$1" >&2
	shift
	for line in "$@"; do printf '      %s\n' "$line" >&2; done
	exit 1
}

# The packages of the tree, one per line, comments stripped.
refa_packages() {
	sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$REFA_ROOT/tools/env/packages"
}

# The tree is keyed by everything that decides its contents: the package
# list, the suites and mirror, and the recipe in setup itself.
refa_tree_key() {
	{
		refa_packages
		echo "$REFA_SUITE $REFA_MIRROR"
		sed -n '/^# --- recipe ---$/,/^# --- end recipe ---$/p' "$REFA_ROOT/tools/env/setup"
	} | sha256sum | cut -c1-16
}

REFA_TREE=${REFA_TREE:-$REFA_CACHE/tree-$(refa_tree_key)}

# refa_vm_slot N: the PCI slot of the test VM's emulated device N, where
# tools/vm/qemu puts it (the root's 9p device is in slot 1) and
# tools/vm/run --device-driver finds it.
refa_vm_slot() { echo $(($1 + 2)); }

# refa_cluster_mac N, refa_cluster_ip N: node N's address on the management
# network of tools/vm/cluster (tools/vm/qemu gives the NIC, the guest's
# tools/vm/cluster-node finds it by this MAC and gives it this address).
refa_cluster_mac() { printf '52:54:00:ef:a0:%02x' "$1"; }
refa_cluster_ip() { echo "10.99.0.$(($1 + 1))"; }

# Cargo's build directory (efa-emu's binary is under it). Two clones (work
# trees of one repository, say) building at once each want their own:
# REFA_CARGO_TARGET overrides it.
REFA_CARGO_TARGET=${REFA_CARGO_TARGET:-$REFA_CACHE/cargo-target}

# refa_cargo_claim TARGET_DIR: before cargo builds this clone's crates into a
# build directory another clone built into last. Cargo names a workspace
# member's build by its path inside the workspace, so two clones share it,
# and judges it fresh when its sources are older than that build: a clone
# checked out before another clone's build got the other's efa-emu (a
# make test ran main's efa-emu for a branch's tests that way). Touching the
# members' sources makes cargo look again; dependencies stay built.
refa_cargo_claim() {
	local target=$1 mark=$1/.refa-clone
	[ "$(cat "$mark" 2>/dev/null)" = "$REFA_ROOT" ] && return 0
	(cd "$REFA_ROOT" && git ls-files -z -- efa-hw tools/efa-emu Cargo.toml Cargo.lock 2>/dev/null |
		xargs -0r touch -c --) || true
	mkdir -p "$target"
	echo "$REFA_ROOT" >"$mark"
}

refa_need_tree() {
	[ -e "$REFA_TREE/.refa-complete" ] ||
		die "the Debian tree is missing ($REFA_TREE)" \
			"run 'tools/env/setup' (or 'make env') first; it needs root and the Debian archive"
	# In use: tools/env/setup of another package list leaves it alone.
	[ "$REFA_TREE" = / ] || touch "$REFA_TREE/.refa-used" 2>/dev/null || true
}

# Run a command inside the tree: the tree is /, the clone and the cache keep
# their host paths, /tmp is shared with the host. Everything in it dies with
# the caller. Extra bubblewrap arguments (more bind mounts) can be put in the
# array REFA_BWRAP_EXTRA.
REFA_BWRAP_EXTRA=()
refa_in_tree() {
	refa_need_tree
	[ "${1:-}" = cargo ] && refa_cargo_claim "$REFA_CARGO_TARGET"
	mkdir -p "$REFA_CACHE/home"
	# Only paths that exist inside the tree can be the working directory.
	local cwd=$REFA_ROOT
	case "$PWD" in "$REFA_ROOT"* | "$REFA_CACHE"* | /tmp*) cwd=$PWD ;; esac
	local args=(
		--bind "$REFA_TREE" /
		--dev /dev
		--dev-bind-try /dev/kvm /dev/kvm
		--proc /proc
		--bind /tmp /tmp
		--bind "$REFA_CACHE" "$REFA_CACHE"
		--bind "$REFA_ROOT" "$REFA_ROOT"
		# Network access (cargo) goes the way the host's does: same DNS,
		# same trusted CAs (some networks intercept TLS), same proxies.
		--ro-bind-try /etc/resolv.conf /etc/resolv.conf
		--ro-bind-try /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
		--unshare-pid --die-with-parent
		--chdir "$cwd"
		--clearenv
		--setenv PATH /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
		--setenv HOME "$REFA_CACHE/home"
		--setenv LANG C.UTF-8
		--setenv TERM "${TERM:-dumb}"
		--setenv REFA_CACHE "$REFA_CACHE"
		--setenv REFA_TREE /
		--setenv CARGO_HOME "$REFA_CACHE/cargo"
		--setenv CARGO_TARGET_DIR "$REFA_CARGO_TARGET"
	)
	local v
	for v in KDIR V REFA_CARGO_TARGET REFA_VERBOSE REFA_ACCEL RUST_LOG RUST_BACKTRACE EFA_EMU_NETNS \
		http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
		[ -n "${!v:-}" ] && args+=(--setenv "$v" "${!v}")
	done
	bwrap "${args[@]}" "${REFA_BWRAP_EXTRA[@]}" -- "$@"
}

# The kernel: Debian's linux-source package unpacked once per version, built
# out of tree once per (version, compilers). Config changes rebuild
# incrementally in the same build directory.
REFA_KPKG=${REFA_KPKG:-$(refa_packages | sed -n 's,^\(linux-source-[0-9.]*\).*,\1,p')}

refa_kernel_version() {
	local v
	v=$(dpkg-query --admindir="$REFA_TREE/var/lib/dpkg" -W -f='${Version}' "$REFA_KPKG" 2>/dev/null) ||
		die "$REFA_KPKG is not installed in the tree" \
			"tools/env/packages names it; run tools/env/setup again (the archive may have moved on to a newer linux-source)"
	echo "$v"
}

refa_kernel_dirs() {
	local ver tools
	ver=$(refa_kernel_version)
	tools=$(for p in rustc clang-19 bindgen llvm-19 lld-19; do
		dpkg-query --admindir="$REFA_TREE/var/lib/dpkg" -W -f='${Package}=${Version}\n' "$p"
	done | sha256sum | cut -c1-8)
	REFA_KSRC=$REFA_CACHE/linux-src-$ver
	REFA_KBUILD=${REFA_KBUILD:-$REFA_CACHE/linux-build-$ver-$tools}
	REFA_KIMAGE=$REFA_KBUILD/arch/x86/boot/bzImage
	REFA_KMODS=$REFA_KBUILD/modinst
}

# The second guest userspace (tools/env/setup-unstable): a Debian unstable
# tree, keyed like the trixie tree by its package list, suite, mirror and
# recipe. Named unstable-tree-* so that setup's clean-up of older trixie
# trees leaves it alone.
refa_unstable_packages() {
	sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$REFA_ROOT/tools/env/packages-unstable"
}
refa_unstable_tree() {
	local key
	key=$({
		refa_unstable_packages
		echo "unstable $REFA_MIRROR"
		sed -n '/^# --- recipe ---$/,/^# --- end recipe ---$/p' "$REFA_ROOT/tools/env/setup-unstable"
	} | sha256sum | cut -c1-16)
	echo "${REFA_UNSTABLE_TREE:-$REFA_CACHE/unstable-tree-$key}"
}
