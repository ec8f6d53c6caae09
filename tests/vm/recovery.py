# SPDX-License-Identifier: GPL-2.0
"""What the recovery tests share (test_recovery.py and test_irq_storm.py
for refa, test_recovery_efa_ko.py for efa.ko under the same causes): an
application that uses a device and waits for its async event, what a
process sees of a device that works, and a failure made while the
application waits, with everything checked up to a working new
context (fail_and_recover)."""

import errno
import json
import os
import subprocess
import sys
import time

import pyverbs.enums as e
from pyverbs.device import Context

import efa_emu
import vmtest

HERE = os.path.dirname(os.path.abspath(__file__))
# CAPS.ADMIN_CMD_TO (100 ms units) for the causes that wait out admin
# timeouts: 0.5 s each instead of the model's default.
SHORT_ADMIN_TIMEOUT = 5
# Seconds from the fault to a working new context. The target is
# 2 s in the TCG guest; this bound leaves room for a loaded host and still
# fails a recovery that never comes or waits out a timeout.
RECOVERY_BOUND = 15
# last_failure_cause values (src/recovery.rs, Cause::code).
CAUSE_FATAL_ERROR, CAUSE_KEEP_ALIVES, CAUSE_ADMIN_TIMEOUTS = 1, 2, 3
CAUSE_DEVICE_STATUS, CAUSE_REGISTERS_SILENT, CAUSE_INTERRUPT_STORM = 4, 5, 6


def rebind(driver, bdf, timeout):
    """Unbinds and binds function `bdf` to `driver` with CAPS.ADMIN_CMD_TO
    `timeout` (100 ms units), which the driver reads at its reset; returns
    its RDMA name. A new binding of refa also starts its failure count
    afresh."""
    vmtest.unbind(driver, bdf)
    efa_emu.Window(bdf).write(efa_emu.ADMIN_TIMEOUT, timeout)
    return vmtest.bind(driver, bdf)

# The application: a context with a PD, a CQ, a UD QP, an AH and an MR,
# which sends to itself once; then it waits for its async event, tries a
# new verb on the old context, and closes everything. One JSON line out.
CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
import pyverbs.enums as e
from pyverbs.device import Context
from pyverbs.pd import PD
import vmtest

ctx = Context(name=sys.argv[1])
sender = vmtest.Sender(ctx)
sender.send(sender.qp.qp_num)
print("ready", flush=True)
event = ctx.get_async_event()
event.ack()
out = {"event": int(event.event_type)}
out["pd_errno"], _ = vmtest.errno_of(PD, ctx)
out["query_errno"], _ = vmtest.errno_of(ctx.query_device)
sender.close()
ctx.close()
out["closed"] = True
print(json.dumps(out), flush=True)
"""


class Application:
    """CHILD on `device`, in a process of its own as an application would
    be, ready (its objects made, one send done) when the constructor
    returns; killed when the `with` block ends, if it still runs."""

    def __init__(self, device):
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, device, HERE],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.close()
            raise AssertionError(f"the application did not get ready ({line!r})")

    def outcome(self, timeout):
        """What the application saw after its async event (the event, the
        errnos of a PD and a query on the old context, whether it closed
        cleanly), or None if no event came within `timeout` seconds."""
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        assert self.proc.returncode == 0, f"the application failed (status {self.proc.returncode})"
        return json.loads(out.strip().splitlines()[-1])

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def attributes(ctx):
    """What a process sees of the device and must see again after the
    recovery."""
    a = ctx.query_device()
    return {
        "node_guid": a.node_guid,
        "fw_version": a.fw_version,
        "vendor_part_id": a.vendor_part_id,
        "max_qp": a.max_qp,
        "max_cq": a.max_cq,
        "max_mr": a.max_mr,
        "max_pd": a.max_pd,
        "gid": str(ctx.query_gid(1, 0)),
    }


def works(device):
    """A new context on `device` does everything the child did: its
    attributes, or the error that stopped it."""
    try:
        with Context(name=device) as ctx:
            sender = vmtest.Sender(ctx)
            try:
                sender.send(sender.qp.qp_num)
            finally:
                sender.close()
            return attributes(ctx), None
    except Exception as err:  # noqa: BLE001 - any failure means "not yet"
        return None, err


def working_again(device, start, detection=0):
    """Waits for a new context on `device` to work, at most
    RECOVERY_BOUND seconds after `detection` from the fault at `start`:
    (its attributes, the seconds from the fault)."""
    deadline = start + detection + RECOVERY_BOUND
    while True:
        after, err = works(device)
        if after is not None:
            return after, time.monotonic() - start
        assert time.monotonic() < deadline, \
            f"no working context on {device} within {detection + RECOVERY_BOUND} s of the fault " \
            f"(last: {err!r})"
        time.sleep(0.05)


def fail_in_use(device, inject):
    """Makes the device fail with `inject` while an application uses it
    and waits for its async event, and checks what the application saw:
    (the time of the fault, seconds to the event)."""
    with Application(device) as app:
        start = time.monotonic()
        inject()
        got = app.outcome(vmtest.WAIT)
        event_at = time.monotonic() - start
        assert got is not None, f"no async event reached the application within {vmtest.WAIT} s"
        assert got["event"] == e.IBV_EVENT_DEVICE_FATAL, \
            f"async event {got['event']}, expected IBV_EVENT_DEVICE_FATAL ({e.IBV_EVENT_DEVICE_FATAL})"
        assert got["pd_errno"] == errno.EIO, \
            f"a PD on the old context: errno {got['pd_errno']}, expected EIO"
        assert got["query_errno"] == errno.EIO, \
            f"query_device on the old context: errno {got['query_errno']}, expected EIO"
        assert got["closed"], "the application could not close its objects"
        return start, event_at


def fail_and_recover(device, cause, inject, restore=None, detection=0):
    """Makes the device fail with `inject` while the application waits;
    `detection` seconds is how long refa may take to notice (on top of
    RECOVERY_BOUND). Returns the time from the fault to a working new
    context."""
    with Context(name=device) as ctx:
        before = attributes(ctx)
    failures = vmtest.fresh_counter(device, "device_failures")
    recoveries = vmtest.fresh_counter(device, "device_recoveries")
    bdf = vmtest.bdf_of(device)
    mark = f"refa-vm: recovery {device} {cause} begins"
    vmtest.kmsg(mark)

    start, event_at = fail_in_use(device, inject)
    if restore:
        restore()
    after, took = working_again(device, start, detection)
    # In the kernel log too: the run's log keeps it, pytest's output of a
    # passing test is dropped.
    timing = f"{cause}: event after {event_at:.2f} s, a working context after {took:.2f} s"
    print(timing)
    vmtest.kmsg(f"refa-vm: recovery {device} {timing}")

    assert vmtest.bdf_of(device) == bdf, f"{device} is another function now"
    assert after == before, f"the device came back different: {before} -> {after}"
    assert vmtest.fresh_counter(device, "device_failures") == failures + 1
    assert vmtest.fresh_counter(device, "device_recoveries") == recoveries + 1
    log = vmtest.log_since(mark)
    assert any("device failed" in line and "recovering" in line for line in log), \
        "no failure line in the kernel log"
    assert any(f"{device}: recovered" in line for line in log), "no recovery line in the kernel log"
    return took
