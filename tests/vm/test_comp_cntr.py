# SPDX-License-Identifier: GPL-2.0
"""Completion counters. rdma-core 56 has no verbs for them, so this speaks
the core's ioctl methods itself (the device's QUERY_COMP_CNTR_CAPS, the
COMP_CNTR object's CREATE, MODIFY, READ and DESTROY, the QP's
ATTACH_COMP_CNTR) with efa-abi.h's buffer attributes (uverbs.py), on a UD
QP of the same context driven byte by byte. Messages to it come from the
efa provider (pyverbs) on another context.

- caps: half the device's event counters, the largest value, the six
  operations;
- creation: the device writes 0 to both values in user memory; unaligned,
  short, unmapped and missing buffers are refused, leaving nothing pinned;
- MODIFY: SET and ADD of either value show in memory; READ is not offered
  (EOPNOTSUPP), as with efa.ko: userspace reads the memory;
- attached for receives, a QP's receives count in the completion value
  and a receive into a buffer too small for the message in the error
  value; the same operations twice are EBUSY, none EINVAL; sends attached
  later to the same counter count as well;
- a counter in use cannot be destroyed (EBUSY); once its QP is gone it
  can, and its memory is unpinned;
- admin faults (refa_only): CREATE_EVENT_COUNTER failing for either value,
  and ATTACH_EVENT_COUNTER failing for either: ENOMEM, nothing pinned,
  nothing left on the device (efa-emu refuses to free a UAR a counter
  uses, so closing the context must raise no error but the injected ones),
  the verb then works; a DESTROY_EVENT_COUNTER the device fails is
  reported and keeps the memory pinned;
- a context closed with counters attached to its QP: the core destroys
  them, and the device sees no error.

What any driver of the device must do (efa.ko too) is the tests not marked
refa_only: -m "not refa_only" runs them as a referee.
"""

import errno
import struct
import time

import pytest
from pyverbs.device import Context

import uverbs as uv
import vmtest
from uverbs import ALL_OPS, ENTRY_COMP, ENTRY_ERR, OP_INC, OP_SET, OPS_RECV, OPS_SEND, buffer
from vmtest import GRH, PAGE, QKEY, WAIT, vm_pinned

# One device is enough: what these check does not depend on the device.
DEVICES = 1


class Session:
    """A user context with a CQ, a PD, a registered page to receive into,
    and a page for counter values: counter `i` keeps its completions at
    offset 128 * i and its errors 64 bytes further."""

    def __init__(self, name):
        self.u = uv.Uverbs(name)
        sub_cqs = self.u.get_context()[2]
        self.cc = uv.Counters(self.u)
        self.values, self.values_addr = uv.anonymous_page(b"\xff")
        self.cq, _, _ = self.u.create_cq(64, uv.cq_cmd(sub_cqs))
        self.pd, _ = self.u.alloc_pd()
        self.data, self.data_addr = uv.anonymous_page(b"\0")
        self.mr, self.lkey = self.u.reg_mr(self.data_addr, PAGE, self.pd, 1)  # IBV_ACCESS_LOCAL_WRITE
        self.qps = []

    def offsets(self, i):
        return 128 * i, 128 * i + 64

    def buffers(self, i):
        comp_at, err_at = self.offsets(i)
        return buffer(self.values_addr + comp_at), buffer(self.values_addr + err_at)

    def value(self, at):
        return struct.unpack_from("<Q", self.values, at)[0]

    def wait_value(self, at, value, what):
        deadline = time.monotonic() + WAIT
        while self.value(at) != value:
            assert time.monotonic() < deadline, f"{what}: {self.value(at)} after {WAIT} s, expected {value}"
            time.sleep(0.001)

    def qp(self):
        qp = self.u.create_ud_qp(self.pd, self.cq, QKEY)
        self.qps.append(qp)
        return qp

    def close_qp(self, qp):
        qp.close()
        self.qps.remove(qp)

    def close(self):
        """Closes the context, with whatever is left in it."""
        for qp in self.qps:
            qp.unmap()  # mappings hold the context
        self.u.close()


@pytest.fixture
def s(device):
    session = Session(device)
    yield session
    session.close()


def test_caps(s):
    max_counters, max_value, ops = s.cc.caps()
    assert max_counters > 0 and ops == ALL_OPS and max_value == (1 << 64) - 1, \
        f"caps: {max_counters} counters, max value {max_value:#x}, operations {ops:#x}"


# (comp buffer, err buffer) from the values page's address, errno.
BAD_BUFFERS = {
    "counter-at-an-unaligned-address": (lambda a: (buffer(a + 4), buffer(a + 64)), errno.EINVAL),
    "error-value-at-an-unaligned-address": (lambda a: (buffer(a), buffer(a + 68)), errno.EINVAL),
    "counter-buffer-of-4-bytes": (lambda a: (buffer(a, 4), buffer(a + 64)), errno.EINVAL),
    "counter-buffer-at-an-unmapped-address": (lambda a: (buffer(8), buffer(a + 64)), errno.EFAULT),
    "counter-without-its-error-buffer": (lambda a: (buffer(a), None), errno.EINVAL),
}


@pytest.mark.parametrize("case", BAD_BUFFERS.values(), ids=BAD_BUFFERS.keys())
def test_create_refused(s, case):
    buffers, expected = case
    pinned = vm_pinned()
    vmtest.refused(expected, s.cc.create, *buffers(s.values_addr))
    assert vm_pinned() == pinned, f"VmPin {pinned} -> {vm_pinned()} kB after a refused creation"
    assert s.values[:] == b"\xff" * PAGE, "a refused creation wrote to the memory"


def test_create_zeroes_both_values_in_pinned_user_memory(s):
    comp_at, err_at = s.offsets(0)
    pinned = vm_pinned()
    s.cc.create(*s.buffers(0))
    assert s.value(comp_at) == 0 and s.value(err_at) == 0, "the device did not zero the values"
    assert s.values[8:err_at] + s.values[err_at + 8:] == b"\xff" * (PAGE - 16), "the device wrote beside the values"
    assert vm_pinned() > pinned, "the counter's memory is not pinned"


def test_set_and_add_of_both_values_show_in_memory(s):
    comp_at, err_at = s.offsets(0)
    handle = s.cc.create(*s.buffers(0))
    for entry, at in ((ENTRY_COMP, comp_at), (ENTRY_ERR, err_at)):
        s.cc.modify(handle, entry, OP_SET, 5)
        s.wait_value(at, 5, "after SET 5")
        s.cc.modify(handle, entry, OP_INC, 3)
        s.wait_value(at, 8, "after SET 5, ADD 3")
        s.cc.modify(handle, entry, OP_SET, 0)
        s.wait_value(at, 0, "after SET 0")


def test_read_refused_userspace_reads_the_memory(s):
    handle = s.cc.create(*s.buffers(0))
    vmtest.refused(errno.EOPNOTSUPP, s.cc.read, handle, ENTRY_COMP)


@pytest.mark.refa_only
def test_modify_of_an_entry_that_does_not_exist_refused(s):
    # efa.ko takes any entry but ERR for the completion value (the core
    # passes any value of the uAPI enum).
    handle = s.cc.create(*s.buffers(0))
    vmtest.refused(errno.EINVAL, s.cc.modify, handle, 2, OP_SET, 1)


def test_attaching_no_operation_refused(s):
    handle = s.cc.create(*s.buffers(0))
    vmtest.refused(errno.EINVAL, s.cc.attach, s.qp().handle, handle, 0)


def test_attaching_receives_twice_busy(s):
    handle = s.cc.create(*s.buffers(0))
    qp = s.qp()
    s.cc.attach(qp.handle, handle, OPS_RECV)
    vmtest.refused(errno.EBUSY, s.cc.attach, qp.handle, handle, OPS_RECV)


def test_destroying_an_attached_counter_busy(s):
    handle = s.cc.create(*s.buffers(0))
    s.cc.attach(s.qp().handle, handle, OPS_RECV)
    vmtest.refused(errno.EBUSY, s.cc.destroy, handle)


def test_receives_count_and_a_receive_too_small_counts_as_an_error(device, s):
    comp_at, err_at = s.offsets(0)
    handle = s.cc.create(*s.buffers(0))
    qp = s.qp()
    s.cc.attach(qp.handle, handle, OPS_RECV)
    with Context(name=device) as ctx:
        sender = vmtest.Sender(ctx, 64)
        for i in range(3):
            qp.post_recv(s.data_addr, GRH + sender.size, s.lkey, i)
            sender.send(qp.qpn)
            s.wait_value(comp_at, i + 1, f"completions after {i + 1} receives")
        assert s.value(err_at) == 0, "receives counted as errors"
        qp.post_recv(s.data_addr, GRH + sender.size // 2, s.lkey, 9)
        sender.send(qp.qpn)
        s.wait_value(err_at, 1, "errors after a receive into a buffer too small")
        assert s.value(comp_at) == 3, "a failed receive counted as a completion"
        sender.close()


def test_sends_attached_to_the_same_counter_as_well(s):
    handle = s.cc.create(*s.buffers(0))
    qp = s.qp()
    s.cc.attach(qp.handle, handle, OPS_RECV)
    s.cc.attach(qp.handle, handle, OPS_SEND)


def test_destroyed_once_its_qp_is_gone_its_memory_unpinned(s):
    handle = s.cc.create(*s.buffers(0))
    qp = s.qp()
    s.cc.attach(qp.handle, handle, OPS_RECV)
    s.cc.attach(qp.handle, handle, OPS_SEND)
    s.close_qp(qp)
    pinned_with = vm_pinned()
    s.cc.destroy(handle)
    assert vm_pinned() < pinned_with, f"VmPin {pinned_with} -> {vm_pinned()} kB: the counter's memory stays pinned"


# ---- refa against a device that fails its admin commands ----------------------------

def fault(emu, opcode, nth, commands, fn, *args):
    """Fails the nth command `opcode` of fn(*args), which must then fail
    with ENOMEM after `commands` admin commands, the injected one its only
    error, and leave nothing pinned."""
    # Failed admin commands on purpose; and the receives into buffers too
    # small for their messages above.
    vmtest.emu_may_report("admin_error", "qp_error")
    pinned, (cmds, errors, _) = vm_pinned(), emu.admin()
    emu.inject(opcode, "resource_allocation_failure", nth)
    try:
        vmtest.refused(errno.ENOMEM, fn, *args)
    finally:
        emu.clear()
    cmds, errors = (a - b for a, b in zip(emu.admin()[:2], (cmds, errors)))
    assert (cmds, errors) == (commands, 1), \
        f"{opcode} #{nth} failing: {cmds} admin commands, {errors} errors; expected {commands}, 1"
    assert vm_pinned() == pinned, f"VmPin {pinned} -> {vm_pinned()} kB after the failure"


# The second value's counter failing: the first is destroyed again.
@pytest.mark.refa_only
@pytest.mark.parametrize("nth,commands", [(1, 1), (2, 3)], ids=["first-value", "second-value"])
def test_create_event_counter_failing(s, emu, nth, commands):
    fault(emu, "create_event_counter", nth, commands, s.cc.create, *s.buffers(0))


# The error value's attachment failing: the completion value's is detached
# again (a third command), as the core records none.
@pytest.mark.refa_only
@pytest.mark.parametrize("nth,commands", [(1, 1), (2, 3)], ids=["first-value", "second-value"])
def test_attach_event_counter_failing(s, emu, nth, commands):
    handle = s.cc.create(*s.buffers(0))
    fault(emu, "attach_event_counter", nth, commands, s.cc.attach, s.qp().handle, handle, OPS_RECV)


@pytest.mark.refa_only
def test_creation_and_attachment_work_after_failing(s, emu):
    fault(emu, "create_event_counter", 2, 3, s.cc.create, *s.buffers(0))
    handle = s.cc.create(*s.buffers(0))
    qp = s.qp()
    fault(emu, "attach_event_counter", 2, 3, s.cc.attach, qp.handle, handle, OPS_RECV)
    s.cc.attach(qp.handle, handle, OPS_RECV)


@pytest.mark.refa_only
def test_a_counter_the_device_did_not_destroy_keeps_its_memory_pinned(s, emu):
    vmtest.emu_may_report("admin_error", "qp_error")
    handle = s.cc.create(*s.buffers(0))
    before = vm_pinned()
    emu.inject("destroy_event_counter", "resource_allocation_failure")
    try:
        s.cc.destroy(handle)  # the core forgets the counter whatever the device says
    finally:
        emu.clear()
    # The completion value's counter goes first and fails: its page stays
    # pinned, the error value's is released.
    assert vm_pinned() == before - PAGE // 1024, \
        f"VmPin {before} -> {vm_pinned()} kB, expected one page less: the memory of the counter the " \
        "device kept must stay pinned, the other's not"
    assert any("destroying event counter" in line and "failed" in line for line in vmtest.dmesg()), \
        "the failed DESTROY_EVENT_COUNTER was not reported"
    # The device still has an event counter on this context's UAR: freeing
    # the UAR fails too (reported); both go with the device's reset.


@pytest.mark.refa_only
def test_a_context_closed_with_counters_attached_leaves_nothing_on_the_device(device, emu):
    _, errors, _ = emu.admin()
    s = Session(device)
    qps = [s.qp() for _ in range(2)]
    # An operation of a QP goes to one counter at most (the core says EBUSY).
    for i, ops in enumerate((OPS_SEND | OPS_RECV, 0x4 | 0x10, 0x8 | 0x20)):
        handle = s.cc.create(*s.buffers(i))
        for qp in qps:
            s.cc.attach(qp.handle, handle, ops)
    s.close()
    errors = emu.admin()[1] - errors
    assert errors == 0, f"the device saw {errors} errors while the context went (an object left on it)"
