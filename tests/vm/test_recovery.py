# SPDX-License-Identifier: GPL-2.0
"""A device that fails comes back by itself (issue 34): refa's recovery,
Documentation/refa.md, "Device failure and recovery".

Each cause is made on demand through efa-emu's control window, while a
process (a child, as an application would be) has a context with objects
on the device and waits in ibv_get_async_event():

- it gets IBV_EVENT_DEVICE_FATAL (the RDMA core delivers it when refa
  unregisters the failed device: the last event of the context);
- its old context then fails new verbs with EIO, and it closes its
  objects and the context cleanly;
- a new context on the same device name works (a PD, a UD QP, a send to
  itself) within RECOVERY_BOUND seconds (recovery.py), with the
  attributes the device had; the time to recovery is printed; and
  rdma-core's ibv_ud_pingpong runs on it between two new processes;
- the device's counters count the failure and the recovery, with the
  cause (device_failures, device_recoveries, last_failure_cause), and the
  kernel log has the failure's line and the recovery's.

Each cause has its test (fatal error, keep-alives, admin timeouts, DEV_STS,
silent registers); then applications that wait on completion events end
with an error when the device fails under their traffic, and pass when
started again; failure after failure backs off and the eighth in a
minute leaves the device down until it is bound again (REFA_RECOVERIES=50
adds the long form, Documentation/refa.md).

Without the recovery, the child never gets its event (its wait ends at
the test's timeout) and no new context opens: refa before this left the
admin queue dead until the driver was unbound, so every verb failed with
ENODEV.
"""

import contextlib
import errno
import os
import random
import subprocess
import threading
import time

import pytest
from pyverbs.device import Context
from pyverbs.pd import PD

import efa_emu
import recovery
import vmtest

DEVICES = 1

# The recovery's limits (src/recovery.rs): MAX_FAILURES failures within
# FAILURE_WINDOW seconds (the default of refa's recovery_window parameter)
# leave the device down; from the second failure in the window on, the
# bring-up waits FIRST_BACKOFF seconds, doubling each time, up to
# MAX_BACKOFF.
MAX_FAILURES, FAILURE_WINDOW, FIRST_BACKOFF, MAX_BACKOFF = 8, 60, 0.25, 4
# The window test_failures_in_a_row_back_off_then_stay_down loads refa
# with: its MAX_FAILURES failures, each with an application's objects and
# a new context's traffic, take 45 s on a quiet host and took 79 s on a
# loaded one, when the first fell out of a 60 s window and the eighth was
# recovered. How the window is counted is KUnit's (refa_recovery).
LONG_WINDOW = 3600
# Seconds an application whose traffic the failure cut may take to end.
EXIT_BOUND = 30


def test_fatal_error(device, emu):
    """The device posts a fatal-error AENQ event (and executes nothing
    until it is reset)."""
    assert emu.win.read(efa_emu.VERSION) >= 6
    # A fatal error asked for is an injected fault to the model.
    vmtest.emu_may_report("injected", index=emu.index)
    recovery.fail_and_recover(device, "fatal-error",
                     lambda: emu.win.write(efa_emu.COMMAND, efa_emu.COMMANDS["fatal"]))
    assert vmtest.fresh_counter(device, "last_failure_cause") == recovery.CAUSE_FATAL_ERROR


def test_rdma_core_perftest_and_libfabric_after_a_recovery(device, emu):
    """What applications see once the device is back: rdma-core's
    ibv_ud_pingpong, perftest's ib_send_bw over SRD and libfabric's
    fi_pingpong over RDM endpoints, each two new processes on the
    recovered device, move their messages end to end."""
    vmtest.emu_may_report("injected", index=emu.index)
    recovery.fail_and_recover(device, "fatal-error",
                     lambda: emu.win.write(efa_emu.COMMAND, efa_emu.COMMANDS["fatal"]))
    for app in (rdma_core_style("ibv_ud_pingpong", "-g", "0", forever=()),
                rdma_core_style("ib_send_bw", *SRD, forever=()), fi_pingpong):
        server_cmd, client_cmd, listens = app(device, across=False)
        vmtest.server_and_client(server_cmd, client_cmd, listens, server_cmd[0])


def test_keep_alives_stop(device, emu):
    """The device stops posting keep-alives: the watchdog declares it
    failed. They stay stopped until the test restores them: the new
    incarnation's watchdog arms only at its first keep-alive."""
    period = emu.win.read(efa_emu.KEEP_ALIVE_MS)
    assert period, "the model posts no keep-alives to stop"
    # efa-emu's hint: five periods; the watchdog looks every quarter.
    detection = 5 * period / 1000 * 1.25
    try:
        recovery.fail_and_recover(device, "keep-alives",
                         lambda: emu.win.write(efa_emu.KEEP_ALIVE_MS, 0),
                         restore=lambda: emu.win.write(efa_emu.KEEP_ALIVE_MS, period),
                         detection=detection)
    finally:
        emu.win.write(efa_emu.KEEP_ALIVE_MS, period)
    assert vmtest.fresh_counter(device, "last_failure_cause") == recovery.CAUSE_KEEP_ALIVES


@contextlib.contextmanager
def short_admin_timeouts(device, emu):
    """The device bound again with SHORT_ADMIN_TIMEOUT; the contexts the
    body opens (a list it fills) closed, every fault disarmed and the
    model's timeout restored at the end."""
    bdf = vmtest.bdf_of(device)
    original = emu.win.read(efa_emu.ADMIN_TIMEOUT)
    assert recovery.rebind("refa", bdf, recovery.SHORT_ADMIN_TIMEOUT) == device
    contexts = []
    try:
        yield contexts
    finally:
        for ctx in contexts:
            ctx.close()
        emu.win.clear()
        recovery.rebind("refa", bdf, original)


def test_admin_timeouts(device, emu):
    """Three admin commands in a row go unanswered (efa-emu drops them):
    the third timeout declares the device failed."""
    with short_admin_timeouts(device, emu) as user:
        def three_timeouts():
            ctx = Context(name=device)
            user.append(ctx)
            emu.win.inject("alloc_pd", count=3, timeout=1)
            for _ in range(3):
                vmtest.refused(errno.ETIMEDOUT, PD, ctx)

        recovery.fail_and_recover(device, "admin-timeouts", three_timeouts,
                         detection=3 * recovery.SHORT_ADMIN_TIMEOUT / 10)
        assert vmtest.fresh_counter(device, "last_failure_cause") == recovery.CAUSE_ADMIN_TIMEOUTS
        # The context that saw the timeouts was disassociated with the rest.
        vmtest.refused(errno.EIO, PD, user[0])


def test_device_status_shows_a_fatal_error(device, emu):
    """The device enters its fatal state without posting the event (as
    one whose AENQ is wedged would): only DEV_STS says so. The next admin
    command goes unanswered, and the read of DEV_STS that follows its
    timeout finds FATAL_ERROR: one timeout, not three."""
    vmtest.emu_may_report("injected", index=emu.index)
    with short_admin_timeouts(device, emu) as user:
        def silent_fatal_error():
            ctx = Context(name=device)
            user.append(ctx)
            emu.win.write(efa_emu.COMMAND, efa_emu.COMMANDS["fatal-silent"])
            vmtest.refused(errno.ETIMEDOUT, PD, ctx)

        recovery.fail_and_recover(device, "device-status", silent_fatal_error,
                         detection=recovery.SHORT_ADMIN_TIMEOUT / 10)
        assert vmtest.fresh_counter(device, "last_failure_cause") == recovery.CAUSE_DEVICE_STATUS


def test_registers_stop_answering(device, emu):
    """An admin command goes unanswered, and so does the readless read of
    DEV_STS after its timeout (efa-emu's hostile readless-silent, once):
    the device is gone. The reset that recovery begins with reads the
    registers again, and they answer."""
    vmtest.emu_may_report("injected", index=emu.index)
    with short_admin_timeouts(device, emu) as user:
        def silent_registers():
            ctx = Context(name=device)
            user.append(ctx)
            emu.win.hostile("readless-silent", count=1)
            emu.win.inject("alloc_pd", count=1, timeout=1)
            vmtest.refused(errno.ETIMEDOUT, PD, ctx)

        mark = f"refa-vm: test_registers_stop_answering {time.monotonic()}"
        vmtest.kmsg(mark)
        recovery.fail_and_recover(device, "registers-silent", silent_registers,
                         detection=recovery.SHORT_ADMIN_TIMEOUT / 10)
        assert vmtest.fresh_counter(device, "last_failure_cause") == recovery.CAUSE_REGISTERS_SILENT
        assert any("readless read of register 0x" in line and "timed out" in line
                   for line in vmtest.log_since(mark)), "no unanswered readless read in the log"


def test_the_other_device_is_undisturbed(device, emu):
    """While the device fails and recovers, another refa device sends
    without a single failed verb, and counts no failure."""
    vmtest.emu_may_report("injected", index=emu.index)
    others = [d for d in vmtest.ib_devices("refa_") if d != device]
    assert others, "no second refa device (the run needs two)"
    other = others[0]
    failures = vmtest.fresh_counter(other, "device_failures")
    stop, sent, errors = threading.Event(), [], []

    def traffic(ctx, sender):
        while not stop.is_set():
            try:
                sender.send(sender.qp.qp_num)
                sent.append(1)
            except Exception as err:  # noqa: BLE001 - any failure is the finding
                errors.append(repr(err))
                return

    with Context(name=other) as ctx:
        sender = vmtest.Sender(ctx)
        thread = threading.Thread(target=traffic, args=(ctx, sender))
        thread.start()
        try:
            recovery.fail_and_recover(device, "fatal-error beside traffic",
                             lambda: emu.win.write(efa_emu.COMMAND, efa_emu.COMMANDS["fatal"]))
            before = len(sent)
            time.sleep(0.5)
        finally:
            stop.set()
            thread.join(vmtest.WAIT)
            sender.close()
    assert not errors, f"{other} failed a send while {device} recovered: {errors[0]}"
    assert len(sent) > before, f"{other} sent nothing after {device} recovered"
    print(f"{other}: {len(sent)} sends meanwhile")
    assert vmtest.fresh_counter(other, "device_failures") == failures


# ---- applications across a failure --------------------------------------------

def rdma_core_style(tool, *opts, forever):
    """An rdma-core or perftest tool, server and client on one device,
    meeting over a TCP port given with -p: `forever` are the options that
    keep it running until the failure, else it moves 100 messages."""
    def commands(device, across):
        port = 18515 + random.randrange(1000)
        server = [tool, "-d", device, "-p", str(port), *opts, *(forever if across else ("-n", "100"))]
        return server, [*server, "127.0.0.1"], lambda: vmtest.listening(port)
    return commands


def fi_pingpong(device, across):
    """libfabric's fi_pingpong over the efa provider's RDM endpoints."""
    cmd = ["fi_pingpong", "-p", "efa", "-e", "rdm", "-d", f"{device}-rdm",
           "-I", str(10**8 if across else 100)]
    return cmd, [*cmd, "127.0.0.1"], lambda: "fi_pingpong" in subprocess.run(
        ["ss", "-Hltnp"], capture_output=True, text=True).stdout


SRD = ("-c", "SRD", "-F", "-x", "0")
# Applications that wait for their completions through a completion
# channel: the core closes the channel when it disassociates the context,
# and their next wait fails. Applications that only poll their CQ (these
# tools without -e, libfabric's efa provider) are not told by the CQ: see
# Documentation/refa.md, "Device failure and recovery".
APPLICATIONS = {
    "ibv_ud_pingpong with completion events":
        rdma_core_style("ibv_ud_pingpong", "-g", "0", "-e", forever=("-n", str(10**8))),
    # Duration mode (-D) refuses completion events; a million sends outlast
    # the test by minutes under TCG.
    "ib_send_bw over SRD with completion events":
        rdma_core_style("ib_send_bw", *SRD, "-e", forever=("-n", str(10**6))),
}


@pytest.mark.parametrize("app", APPLICATIONS)
def test_traffic_across_a_failure(device, emu, app):
    """The device fails while `app` moves messages between two processes
    on it: both end with an error within EXIT_BOUND seconds, none
    hangs and none claims success; the same application started after the
    recovery passes."""
    vmtest.emu_may_report("injected", index=emu.index)
    server_cmd, client_cmd, listens = APPLICATIONS[app](device, across=True)
    procs = {"server": vmtest.listening_server(server_cmd, listens, app)}
    ends = {}
    try:
        sent = vmtest.fresh_counter(device, "send_wrs", port=1)
        procs["client"] = subprocess.Popen(client_cmd, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + vmtest.WAIT
        while vmtest.fresh_counter(device, "send_wrs", port=1) < sent + 200:
            ended = [role for role, p in procs.items() if p.poll() is not None]
            assert not ended, f"{app}: the {ended[0]} ended before the failure: " \
                f"{procs[ended[0]].communicate()[0][-500:]}"
            assert time.monotonic() < deadline, f"{app} sent nothing in {vmtest.WAIT} s"
            time.sleep(0.2)
        start = time.monotonic()
        emu.win.write(efa_emu.COMMAND, efa_emu.COMMANDS["fatal"])
        for role, p in procs.items():
            try:
                out, _ = p.communicate(timeout=max(0.1, start + EXIT_BOUND - time.monotonic()))
                ends[role] = (p.returncode, time.monotonic() - start, out.strip()[-300:])
            except subprocess.TimeoutExpired:
                pass
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for role, (status, at, out) in ends.items():
        print(f"{app}: the {role} ended with status {status} after {at:.2f} s: {out!r}")
    vmtest.kmsg(f"refa-vm: test_recovery {app}: {ends}")
    hung = [role for role in procs if role not in ends]
    assert not hung, f"{app}: the {' and the '.join(hung)} still ran {EXIT_BOUND} s after the failure"
    fine = [role for role, (status, _, _) in ends.items() if status == 0]
    assert not fine, f"{app}: the {' and the '.join(fine)} exited 0 although the failure cut its traffic"

    recovery.working_again(device, start)
    server_cmd, client_cmd, listens = APPLICATIONS[app](device, across=False)
    vmtest.server_and_client(server_cmd, client_cmd, listens, app)


# ---- failure after failure ----------------------------------------------------

def expected_backoff(n):
    """The wait before the bring-up after the `n`-th failure in the
    window (1-based)."""
    return 0 if n == 1 else min(FIRST_BACKOFF * 2 ** (n - 2), MAX_BACKOFF)


def test_failures_in_a_row_back_off_then_stay_down(device, emu):
    """Failure after failure, each as soon as the device is back, with an
    application's context and objects and a new context's traffic at
    each: every recovery waits at least its back-off, the MAX_FAILURES-th
    failure in the window leaves the device down and unregistered, and
    binding the function again (what the operator does) brings it back.

    REFA_RECOVERIES=N (the long form, say 50) first recovers N times,
    spaced so that fewer than MAX_FAILURES fall in any window: N
    recoveries, about FAILURE_WINDOW / (MAX_FAILURES - 1) s each."""
    vmtest.emu_may_report("injected", index=emu.index)
    bdf = vmtest.bdf_of(device)
    timeout = emu.win.read(efa_emu.ADMIN_TIMEOUT)
    fatal = lambda: emu.win.write(efa_emu.COMMAND, efa_emu.COMMANDS["fatal"])  # noqa: E731
    spaced = int(os.environ.get("REFA_RECOVERIES", "0"))
    if spaced:
        assert recovery.rebind("refa", bdf, timeout) == device
        spacing = FAILURE_WINDOW / (MAX_FAILURES - 1) + 0.5
        last = 0
        for n in range(1, spaced + 1):
            time.sleep(max(0, last + spacing - time.monotonic()))
            last = time.monotonic()
            recovery.fail_and_recover(device, f"fatal-error, spaced, {n} of {spaced}", fatal)
    # A fresh failure count (the recoveries of the tests before were of
    # this binding too), in a window no load makes the failures outlast.
    vmtest.reload_refa(f"recovery_window={LONG_WINDOW}")
    try:
        for n in range(1, MAX_FAILURES):
            took = recovery.fail_and_recover(device, f"fatal-error, {n} in a row", fatal)
            assert took >= expected_backoff(n), \
                f"failure {n} in a row: back after {took:.2f} s, before its back-off of {expected_backoff(n)} s"

        mark = f"refa-vm: test_recovery {device} failure {MAX_FAILURES} in a row"
        vmtest.kmsg(mark)
        start, _ = recovery.fail_in_use(device, fatal)
        time.sleep(MAX_BACKOFF + 1)
        assert vmtest.ib_of(bdf) is None, \
            f"{vmtest.ib_of(bdf)} is back after failure {MAX_FAILURES} within {LONG_WINDOW} s"
        assert any(f"{MAX_FAILURES} failures within {LONG_WINDOW} s" in line and "stays down" in line
                   for line in vmtest.log_since(mark)), "no line in the kernel log says the device stays down"
        vmtest.unbind("refa", bdf)
        assert vmtest.bind("refa", bdf) == device
        recovery.working_again(device, time.monotonic())
    finally:
        vmtest.reload_refa()


def test_a_window_of_no_time_is_refused(device, emu):
    """refa.recovery_window=0 would retry a bring-up that fails at once
    without a pause, for ever: probe refuses it, with a line that says
    why, and binds nothing; the default binds every function again."""
    bdf = vmtest.bdf_of(device)
    bound = [f for f in vmtest.amazon_functions() if vmtest.pci_driver_of(f) == "refa"]
    mark = f"refa-vm: test_recovery {device} recovery_window=0"
    vmtest.kmsg(mark)
    with vmtest.no_kunit_at_load():
        subprocess.run(["rmmod", "refa"], check=True)
        subprocess.run(["insmod", vmtest.refa_module(), "recovery_window=0"], check=True)
        try:
            assert [f for f in bound if vmtest.pci_driver_of(f)] == [], \
                "a function bound with recovery_window=0"
            assert any("recovery_window=0: the failure window must be at least 1 s" in line
                       for line in vmtest.log_since(mark)), "no line in the kernel log says why"
        finally:
            subprocess.run(["rmmod", "refa"], check=True)
            subprocess.run(["insmod", vmtest.refa_module()], check=True)
    end = time.monotonic() + recovery.RECOVERY_BOUND
    for f in bound:
        while vmtest.ib_of(f) is None:
            assert time.monotonic() < end, f"{f} has no RDMA device {recovery.RECOVERY_BOUND} s after insmod"
            time.sleep(0.05)
    assert vmtest.ib_of(bdf) == device
