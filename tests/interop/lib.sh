# Shared by the host-side scripts of tests/interop: which tree a userspace
# is, how to run a command in it, and where the things built from upstream
# sources go in the cache. Source it; do not run it.
# shellcheck shell=bash
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/tools/env/lib.sh"
INTEROP=$REFA_ROOT/tests/interop

# The root directory of a guest userspace: stable (the trixie tree) or
# unstable (tools/env/setup-unstable).
interop_tree() {
	case "$1" in
	stable) echo "$REFA_TREE" ;;
	unstable) refa_unstable_tree ;;
	*) die "unknown userspace '$1'" "use stable or unstable" ;;
	esac
}

# Makes sure the userspace's tree exists (building it when needed).
interop_need_tree() {
	case "$1" in
	stable) "$REFA_ROOT/tools/env/setup" ;;
	unstable) "$REFA_ROOT/tools/env/setup-unstable" ;;
	esac
}

# interop_in USERSPACE CMD...: CMD inside that userspace's tree, with the
# same view as tools/env/in-tree (clone, cache and /tmp at their paths).
interop_in() {
	local tree
	tree=$(interop_tree "$1")
	shift
	REFA_TREE=$tree refa_in_tree "$@"
}

# A short key of files' contents (the recipes of what is built).
interop_key() { cat "$@" | sha256sum | cut -c1-12; }
