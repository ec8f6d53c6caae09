# shellcheck shell=bash
# Results in KTAP (Documentation/dev-tools/ktap.rst in the kernel tree), for
# the project's shell tests, host or guest: a plan first, then one result
# line per check, so that a test that stops early is short of its plan and
# fails (tools/test parses every step's output with the kernel's own KTAP
# parser, tools/testing/kunit/kunit_parser.py). In the spirit of the
# kernel's tools/testing/selftests/kselftest/ktap_helpers.sh, plus nesting:
# ktap_subtest runs a program whose own KTAP becomes a subtest.
#
#   . tests/lib/ktap.sh
#   ktap_plan 3                  "KTAP version 1" and "1..3"
#   ktap_pass NAME               "ok N NAME"
#   ktap_fail NAME [WHY]         "not ok N NAME", WHY as a diagnostic line
#   ktap_skip NAME WHY           "ok N NAME # SKIP WHY"
#   ktap_check NAME CMD...       pass or fail as CMD succeeds
#   ktap_step NAME CMD...        the same with CMD in a subshell (a step of
#                                a shell test: its fail() exits the step,
#                                not the test) and its output as
#                                diagnostic lines
#   ktap_subtest NAME CMD...     CMD's output indented as subtest NAME, then
#                                its time as a diagnostic line and its
#                                result from CMD's status and plan (a CMD
#                                without KTAP: one test, its output as
#                                diagnostic lines)
#   ktap_bail WHY                "Bail out! WHY": the rest will not run
#   ktap_done                    exit 0 when the plan was met and nothing
#                                failed, 1 otherwise

KTAP_NEXT=1
KTAP_PLAN=0
KTAP_FAILED=0

# awk for a filter of a stream whose lines must pass as they come. mawk
# (Debian's awk) fills its whole input buffer from a pipe before it reads
# a line unless told otherwise: a long test's results would show only at
# its end, and those of a guest that dies on the way never. (Not
# `awk -W version | grep -q`: under pipefail, grep leaving before awk has
# written its last line makes the pipeline fail with awk's SIGPIPE, now
# and then on a loaded host, and results were held back.)
case "$(awk -W version 2>/dev/null)" in
mawk*) ktap_awk() { awk -W interactive "$@"; } ;;
*) ktap_awk() { awk "$@"; } ;;
esac

ktap_plan() {
	KTAP_PLAN=$1
	echo "KTAP version 1"
	echo "1..$1"
}

# A result: its name may not hold '#' (the directive's start) or a newline.
__ktap_result() {
	local result=$1 name=${2//#/-} directive=${3:-}
	echo "$result $KTAP_NEXT ${name//$'\n'/ }${directive:+ # $directive}"
	KTAP_NEXT=$((KTAP_NEXT + 1))
}

ktap_pass() { __ktap_result ok "$1"; }

ktap_fail() {
	[ -n "${2:-}" ] && printf '# %s\n' "$2"
	__ktap_result "not ok" "$1"
	KTAP_FAILED=$((KTAP_FAILED + 1))
}

ktap_skip() { __ktap_result ok "$1" "SKIP ${2:-}"; }

ktap_check() {
	local name=$1
	shift
	if "$@"; then ktap_pass "$name"; else ktap_fail "$name" "failed: $*"; fi
}

ktap_step() {
	local name=$1 status
	shift
	("$@") 2>&1 | sed -u 's/^/# /'
	status=${PIPESTATUS[0]}
	if [ "$status" = 0 ]; then ktap_pass "$name"; else ktap_fail "$name" "exit status $status"; fi
}

ktap_subtest() {
	local name=$1 status short was_e=0 started=$SECONDS
	shift
	[[ $- == *e* ]] && was_e=1
	set +e
	# The subtest's header is its KTAP version line, then its name. A
	# subtest short of its plan fails, whatever its status (a process that
	# died half way). A command that prints no KTAP is one test: its output
	# becomes diagnostic lines before its result.
	"$@" 2>&1 | ktap_awk -v name="$name" '
		!nested && /^KTAP version/ {
			nested = 1
			print "    " $0
			print "    # Subtest: " name
			for (i = 1; i <= held; i++) print "    " line[i]
			fflush()
			next
		}
		!nested { line[++held] = $0; next }
		{ print "    " $0; fflush() }
		plan == "" && /^1\.\.[0-9]+/ { plan = substr($0, 4) + 0 }
		/^(not )?ok [0-9]+/ { n++ }
		END {
			if (!nested) for (i = 1; i <= held; i++) print "# " line[i]
			if (plan != "" && n < plan) exit 3
		}'
	status=${PIPESTATUS[0]} short=${PIPESTATUS[1]}
	[ "$was_e" = 1 ] && set -e
	# Where a boot's time goes, in every log (the guest's clock).
	echo "# $name: $((SECONDS - started)) s"
	if [ "$status" != 0 ]; then
		ktap_fail "$name" "exit status $status"
	elif [ "$short" != 0 ]; then
		ktap_fail "$name" "fewer results than its plan"
	else
		ktap_pass "$name"
	fi
}

ktap_bail() {
	echo "Bail out! $*"
	exit 1
}

ktap_done() {
	local ran=$((KTAP_NEXT - 1))
	if [ "$ran" != "$KTAP_PLAN" ]; then
		echo "# planned $KTAP_PLAN results, printed $ran"
		exit 1
	fi
	[ "$KTAP_FAILED" = 0 ]
	exit $?
}
