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

import contextlib
import errno
import os
import re
import signal
import subprocess
import time

import pytest
from pyverbs.device import Context
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsRDMAError

import efa_emu
import vmtest

AMAZON = "0x1d0f"
DRIVER = "/sys/bus/pci/drivers/refa"
PCI = "/sys/bus/pci/devices"
# The admin timeout the faults run with: a timeout takes 1.5 s, not 30.
SHORT_ADMIN_TIMEOUT_MS = 1500


def functions():
    """The Amazon PCI functions, in bus order."""
    found = []
    for bdf in sorted(os.listdir(PCI)):
        with open(f"{PCI}/{bdf}/vendor") as f:
            if f.read().strip() == AMAZON:
                found.append(bdf)
    return found


def ib_of(bdf):
    """The RDMA device of PCI function `bdf`, or None."""
    try:
        names = os.listdir(f"{PCI}/{bdf}/infiniband")
    except FileNotFoundError:
        return None
    return names[0] if names else None


def unbind(bdf):
    with open(f"{DRIVER}/unbind", "w") as f:
        f.write(bdf)
    assert ib_of(bdf) is None, f"{bdf} still has an RDMA device after unbind"


def bind(bdf):
    with open(f"{DRIVER}/bind", "w") as f:
        f.write(bdf)
    deadline = time.monotonic() + 10
    while ib_of(bdf) is None:
        assert time.monotonic() < deadline, f"no RDMA device on {bdf} 10 s after binding"
        time.sleep(0.1)
    return ib_of(bdf)


def alloc_pd(ctx):
    """Allocates and frees a PD: ("ok", seconds) or (errno, seconds)."""
    start = time.monotonic()
    try:
        PD(ctx).close()
        return "ok", time.monotonic() - start
    except PyverbsRDMAError as e:
        return e.error_code, time.monotonic() - start


def pds_allocate(dev, count=1):
    with Context(name=dev) as ctx:
        results = [alloc_pd(ctx) for _ in range(count)]
    assert all(r == "ok" for r, _ in results), f"{dev}: PD allocations {results}"


@contextlib.contextmanager
def deadline(seconds, what):
    """Fails the test, rather than hanging the boot, when `what` takes
    longer than `seconds` (a driver that hangs a verb)."""
    def expired(*_):
        raise TimeoutError(f"{what} took more than {seconds} s: hung")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def mark(text):
    """Marks the kernel log; returns the mark for vmtest.log_since()."""
    line = f"test_device_health: {text}"
    vmtest.kmsg(line)
    return line


def window(bdf):
    return efa_emu.Window(bdf)


def set_admin_timeout(bdf, ms):
    """The admin timeout the model advertises (0: its default, 30 s); a
    rebind makes refa read it."""
    window(bdf).write(efa_emu.ADMIN_TIMEOUT, (ms + 99) // 100)
    unbind(bdf)
    return bind(bdf)


@pytest.fixture(scope="module")
def bdfs():
    found = functions()
    assert found, "no Amazon PCI function"
    return found


def test_every_function_is_bound_to_refa_and_active(bdfs):
    for bdf in bdfs:
        driver = os.path.basename(os.readlink(f"{PCI}/{bdf}/driver"))
        assert driver == "refa", f"{bdf}: bound to {driver}"
        dev = ib_of(bdf)
        assert dev and dev.startswith("refa_"), f"{bdf}: RDMA device {dev!r}"
        info = subprocess.run(["ibv_devinfo", "-v", "-d", dev], capture_output=True, text=True)
        assert info.returncode == 0, f"ibv_devinfo -d {dev}: {info.stderr}"
        assert re.search(r"state:.*PORT_ACTIVE", info.stdout), f"{dev}: port not active"
        assert re.search(r"link_layer:.*Unspecified", info.stdout), f"{dev}: link layer"
        pds_allocate(dev, 3)


def test_unbind_and_bind(bdfs):
    for bdf in bdfs:
        unbind(bdf)
        pds_allocate(bind(bdf))


def test_more_admin_commands_in_flight_than_the_queue_has_slots(bdfs):
    # 40 processes each with its own context (the admin queue has 32
    # slots), each allocating and freeing 25 PDs.
    dev, workers, rounds = ib_of(bdfs[0]), 40, 25
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
    with deadline(300, f"{workers} processes x {rounds} PDs"):
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
    unbind(bdf)
    win = window(bdf)
    win.inject(opcode, 1, 0, mode == "timeout")
    try:
        with pytest.raises(OSError):
            with open(f"{DRIVER}/bind", "w") as f:
                f.write(bdf)
        assert ib_of(bdf) is None, "an RDMA device after a failed probe"
        assert not os.path.islink(f"{PCI}/{bdf}/driver"), f"{bdf} still bound after a failed probe"
        log = vmtest.log_since(since)
        assert any(re.search(r"probe.*failed|probe with driver refa failed", line) for line in log), \
            "no probe failure in the kernel log"
    finally:
        win.clear()
    pds_allocate(bind(bdf))


def test_an_admin_command_that_times_out_fails_alone(bdfs):
    bdf = bdfs[0]
    vmtest.emu_may_report("admin_error")
    dev = set_admin_timeout(bdf, SHORT_ADMIN_TIMEOUT_MS)
    since = mark("runtime timeout")
    with deadline(60, "the timeout scenario"), Context(name=dev) as ctx:
        kept = PD(ctx)
        window(bdf).inject("alloc_pd", 1, 0, True)
        code, took = alloc_pd(ctx)
        later = [alloc_pd(ctx) for _ in range(3)]
        kept.close()
    assert code == errno.ETIMEDOUT and 1.5 <= took < 10, \
        f"the command left unanswered: {code} after {took:.1f} s, expected ETIMEDOUT after 1.5 s"
    assert all(r == "ok" for r, _ in later), f"the commands after it: {later}"
    assert any("AllocPd" in line or "ALLOC_PD" in line for line in vmtest.log_since(since)), \
        "no timeout message"


def test_the_watchdog_fails_commands_fast_when_keep_alives_stop(bdfs):
    bdf = bdfs[0]
    vmtest.emu_may_report("admin_error")
    # The default 30 s admin timeout: the watchdog must beat it.
    dev = set_admin_timeout(bdf, 0)
    since = mark("watchdog")
    win = window(bdf)
    try:
        with deadline(60, "the watchdog scenario"), Context(name=dev) as ctx:
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
        assert later[0] == errno.ENODEV and later[1] < 1, \
            f"a later command: {later}, expected ENODEV at once"
        assert any("keep-alives stopped" in line for line in vmtest.log_since(since)), \
            "the watchdog did not fire"
    finally:
        win.write(efa_emu.KEEP_ALIVE_MS, 1000)
        win.clear()
    unbind(bdf)
    pds_allocate(bind(bdf))


def test_the_last_devices_model_dies(bdfs):
    bdf = bdfs[-1]
    win = window(bdf)
    vmtest.emu_may_exit(win.read(efa_emu.INDEX))
    dev = ib_of(bdf)
    mark("model exit")
    with deadline(90, "the dead-model scenario"), Context(name=dev) as ctx:
        win.write(efa_emu.COMMAND, efa_emu.COMMANDS["exit"])
        time.sleep(1)
        code, took = alloc_pd(ctx)
    # The keep-alive watchdog (5 s) fails it well before its 30 s timeout.
    assert code == errno.ENODEV and took < 10, \
        f"a command to a dead device: {code} after {took:.1f} s, expected ENODEV"
    if len(bdfs) > 1:
        pds_allocate(ib_of(bdfs[0]))
