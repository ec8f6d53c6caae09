# SPDX-License-Identifier: GPL-2.0
"""refa's binding of the device and its health: every EFA function bound
and active; unbind and bind; more admin commands in flight than the admin
queue has slots; a probe that fails at each step of the bring-up unwinds
and the function binds again; an admin command that times out fails alone;
the keep-alive watchdog fails commands fast when the device goes silent;
a device model that dies fails commands, hangs nothing and leaves the
other device working.

The tests act on the functions themselves (unbinding, making the device
fail), not on each device under test, so each runs once. The last one
kills the last device's model: run this file last in a boot
(tests/vm/run-refa-checks does).

Faults come from the efa-emu model through its control window
(tools/efa-emu/guest/efa_emu.py). The admin timeout the device advertises
is read at probe, so the tests that shorten it rebind the function.
"""

import errno
import os
import re
import subprocess
import time

import pytest
from pyverbs.device import Context
from pyverbs.pd import PD

import efa_emu
import vmtest

DRIVER = "refa"
# The admin timeout the faults run with: a timeout takes 1.5 s, not 30.
SHORT_ADMIN_TIMEOUT_MS = 1500


def alloc_pd(ctx):
    """Allocates and frees a PD: (None or its errno, seconds)."""
    return vmtest.timed_errno(lambda: PD(ctx).close())


def pds_allocate(dev, count=1):
    with Context(name=dev) as ctx:
        results = [alloc_pd(ctx) for _ in range(count)]
    assert all(code is None for code, _ in results), f"{dev}: PD allocations {results}"


def mark(text):
    """Marks the kernel log; returns the mark for vmtest.log_since()."""
    line = f"test_device_health: {text}"
    vmtest.kmsg(line)
    return line


def set_admin_timeout(bdf, ms):
    """The admin timeout the model advertises (0: its default, 30 s); the
    rebind makes refa read it. Returns the function's RDMA device."""
    efa_emu.Window(bdf).write(efa_emu.ADMIN_TIMEOUT, (ms + 99) // 100)
    return vmtest.rebind(DRIVER, bdf)


@pytest.fixture(scope="module")
def bdfs():
    found = vmtest.amazon_functions()
    assert found, "no Amazon PCI function"
    return found


def test_every_function_is_bound_to_refa_and_active(bdfs):
    for bdf in bdfs:
        driver = vmtest.pci_driver_of(bdf)
        assert driver == DRIVER, f"{bdf}: bound to {driver}"
        dev = vmtest.ib_of(bdf)
        assert dev and dev.startswith("refa_"), f"{bdf}: RDMA device {dev!r}"
        info = subprocess.run(["ibv_devinfo", "-v", "-d", dev], capture_output=True, text=True)
        assert info.returncode == 0, f"ibv_devinfo -d {dev}: {info.stderr}"
        assert re.search(r"state:.*PORT_ACTIVE", info.stdout), f"{dev}: port not active"
        assert re.search(r"link_layer:.*Unspecified", info.stdout), f"{dev}: link layer"
        pds_allocate(dev, 3)


def test_unbind_and_bind(bdfs):
    for bdf in bdfs:
        vmtest.unbind(DRIVER, bdf)
        pds_allocate(vmtest.bind(DRIVER, bdf))


def test_more_admin_commands_in_flight_than_the_queue_has_slots(bdfs):
    # 40 processes each with its own context (the admin queue has 32
    # slots), each allocating and freeing 25 PDs.
    dev, workers, rounds = vmtest.ib_of(bdfs[0]), 40, 25
    pids = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                with Context(name=dev) as ctx:
                    for _ in range(rounds):
                        PD(ctx).close()
                status = 0
            finally:
                os._exit(status)
        pids.append(pid)
    failed = 0
    with vmtest.deadline(300, f"{workers} processes x {rounds} PDs"):
        for pid in pids:
            failed += os.waitpid(pid, 0)[1] != 0
    assert failed == 0, f"{workers} processes x {rounds} PDs: {failed} failed"


# Each step of the bring-up that issues an admin command, failed or left
# unanswered.
PROBE_FAULTS = [
    ("get_feature", "fail"),
    ("get_feature", "timeout"),
    ("set_feature", "fail"),
    ("create_eq", "fail"),
    ("create_eq", "timeout"),
]


@pytest.fixture(scope="module")
def short_timeout(bdfs):
    """The first function with a short admin timeout, the models allowed
    to count the admin commands failed on purpose."""
    vmtest.emu_may_report("admin_error")
    set_admin_timeout(bdfs[0], SHORT_ADMIN_TIMEOUT_MS)
    return bdfs[0]


@pytest.mark.parametrize("opcode,mode", PROBE_FAULTS, ids=[f"{o}-{m}" for o, m in PROBE_FAULTS])
def test_a_probe_failing_at_a_step_unwinds_and_the_function_binds_again(short_timeout, opcode, mode):
    bdf = short_timeout
    since = mark(f"probe with {opcode} {mode}")
    vmtest.unbind(DRIVER, bdf)
    win = efa_emu.Window(bdf)
    win.inject(opcode, 1, 0, mode == "timeout")
    try:
        with pytest.raises(OSError):
            vmtest.write_sysfs(f"/sys/bus/pci/drivers/{DRIVER}/bind", bdf)
        assert vmtest.ib_of(bdf) is None, "an RDMA device after a failed probe"
        assert vmtest.pci_driver_of(bdf) is None, f"{bdf} still bound after a failed probe"
        log = vmtest.log_since(since)
        assert any(re.search(r"probe.*failed|probe with driver refa failed", line) for line in log), \
            "no probe failure in the kernel log"
    finally:
        win.clear()
    pds_allocate(vmtest.bind(DRIVER, bdf))


def test_an_admin_command_that_times_out_fails_alone(bdfs):
    bdf = bdfs[0]
    vmtest.emu_may_report("admin_error")
    dev = set_admin_timeout(bdf, SHORT_ADMIN_TIMEOUT_MS)
    since = mark("runtime timeout")
    with vmtest.deadline(60, "the timeout scenario"), Context(name=dev) as ctx:
        kept = PD(ctx)
        efa_emu.Window(bdf).inject("alloc_pd", 1, 0, True)
        code, took = alloc_pd(ctx)
        later = [alloc_pd(ctx) for _ in range(3)]
        kept.close()
    assert code == errno.ETIMEDOUT and 1.5 <= took < 10, \
        f"the command left unanswered: {code} after {took:.1f} s, expected ETIMEDOUT after 1.5 s"
    assert all(code is None for code, _ in later), f"the commands after it: {later}"
    assert any("AllocPd" in line or "ALLOC_PD" in line for line in vmtest.log_since(since)), \
        "no timeout message"


def test_the_watchdog_fails_commands_fast_when_keep_alives_stop(bdfs):
    bdf = bdfs[0]
    vmtest.emu_may_report("admin_error")
    # The default 30 s admin timeout: the watchdog must beat it.
    dev = set_admin_timeout(bdf, 0)
    # The watchdog arms at the first keep-alive (a device that sends none
    # is never declared dead for it): wait for one after the rebind.
    limit = time.monotonic() + 30
    while vmtest.counter(dev, "keep_alive_rcvd") == 0:
        assert time.monotonic() < limit, f"{dev}: no keep-alive in 30 s after the rebind"
        time.sleep(0.1)
    since = mark("watchdog")
    win = efa_emu.Window(bdf)
    try:
        with vmtest.deadline(60, "the watchdog scenario"), Context(name=dev) as ctx:
            kept = PD(ctx)
            # A command the device never answers, then no more keep-alives.
            win.inject("alloc_pd", 1, 0, True)
            win.write(efa_emu.KEEP_ALIVE_MS, 0)
            in_flight = alloc_pd(ctx)
            later = alloc_pd(ctx)
            kept.close()
        # The device's limit is five keep-alive periods (5 s), far below 30 s.
        assert in_flight[0] == errno.ENODEV and 3 <= in_flight[1] < 10, \
            f"the command in flight: {in_flight}, expected ENODEV when the watchdog fires"
        # ENODEV on the dead admin queue, or EIO once the recovery the
        # watchdog queued has unregistered the device and disassociated the
        # context: which one depends on how far that work got.
        assert later[0] in (errno.ENODEV, errno.EIO) and later[1] < 1, \
            f"a later command: {later}, expected ENODEV or EIO at once"
        assert any("keep-alives stopped" in line for line in vmtest.log_since(since)), \
            "the watchdog did not fire"
    finally:
        win.write(efa_emu.KEEP_ALIVE_MS, 1000)
        win.clear()
    pds_allocate(vmtest.rebind(DRIVER, bdf))


def test_the_last_devices_model_dies(bdfs):
    bdf = bdfs[-1]
    win = efa_emu.Window(bdf)
    vmtest.emu_may_exit(win.read(efa_emu.INDEX))
    dev = vmtest.ib_of(bdf)
    mark("model exit")
    with vmtest.deadline(90, "the dead-model scenario"), Context(name=dev) as ctx:
        win.write(efa_emu.COMMAND, efa_emu.COMMANDS["exit"])
        time.sleep(1)
        code, took = alloc_pd(ctx)
    # The keep-alive watchdog (5 s) fails it well before its 30 s timeout.
    assert code == errno.ENODEV and took < 10, \
        f"a command to a dead device: {code} after {took:.1f} s, expected ENODEV"
    if len(bdfs) > 1:
        pds_allocate(vmtest.ib_of(bdfs[0]))
