# SPDX-License-Identifier: GPL-2.0
"""Completion channels on refa, through rdma-core's efa provider (pyverbs):

- for each completion vector: a CQ on a completion channel, armed
  (ibv_req_notify_cq), gets one event for a UD message received on it,
  delivered by an interrupt of that vector's event queue (its line in
  /proc/interrupts counts up), read with ibv_get_cq_event and acknowledged;
  the completion is then polled from the CQ with the message's bytes;
- two CQs on one channel: each event names the CQ that completed;
- a completion vector beyond the device's is refused (EINVAL);
- CQs with channels destroyed while their events may still be on the way,
  many times: the interrupt handler must never reach a destroyed CQ (the
  harness fails the run on any KASAN, lockdep or WARN report);
- a CQ whose ring is a page of this process (the core's CQ buffer
  attributes; rdma-core 56 cannot pass them, so the receiving side speaks
  uverbs byte by byte): a UD message to a QP on it completes in that page
  and raises an event on the CQ's channel; the page is pinned while the CQ
  exists, unpinned by its destruction, and stays pinned when efa-emu fails
  DESTROY_CQ (the device may still write there; it goes at unbind, after
  the reset; the harness's kmemleak scan checks nothing leaks).
"""

import errno
import mmap
import os
import select
import struct
import time

import pyverbs.enums as e
import pytest
from pyverbs.cq import CQ, CompChannel
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.wr import SGE, RecvWR, SendWR

import uverbs as uv
import vmtest
from vmtest import GRH, PAGE, QKEY, WAIT, vm_pinned

RX_CDESC = struct.Struct("<HBBHHHHI")  # efa_io_rx_cdesc
CQ_DB_ARM = 1 << 31


def pytest_generate_tests(metafunc):
    # A case per completion vector (the most any device under test has; a
    # device with fewer skips the rest).
    if "vector" in metafunc.fixturenames:
        most = 1
        for name in metafunc.config.getoption("device") or vmtest.ib_devices():
            try:
                with Context(name=name) as c:
                    most = max(most, c.num_comp_vectors)
            except Exception:  # the tests say what is wrong with the device
                pass
        metafunc.parametrize("vector", range(most), ids=[f"vector-{v}" for v in range(most)])


def vector_interrupts(bdf):
    """Interrupts taken so far on each MSI-X vector of `bdf` named
    refa-comp (refa's event queues), summed over CPUs: {vector: count}."""
    counts = {}
    with open("/proc/interrupts") as f:
        for line in f:
            fields = line.split()
            if "refa-comp" not in fields or not any(bdf in x for x in fields):
                continue
            n = sum(int(x) for x in fields[1:] if x.isdigit())
            vec = next(int(x.split("-")[0]) for x in fields if x.endswith("-edge"))
            counts[vec] = n
    return counts


def open_channel(ctx):
    """A completion channel and its file descriptor (the one it opened)."""
    def event_fds():
        fds = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                if "infinibandevent" in os.readlink(f"/proc/self/fd/{fd}"):
                    fds.add(int(fd))
            except FileNotFoundError:  # the listing's own fd, closed since
                pass
        return fds

    before = event_fds()
    channel = CompChannel(ctx)
    new = sorted(event_fds() - before)
    assert len(new) == 1, f"the completion channel's fd: {new}"
    return channel, new[0]


def wait_readable(fd, seconds):
    readable, _, _ = select.select([fd], [], [], seconds)
    return bool(readable)


class Pair:
    """Two UD QPs on one device: `sender` sends to `receiver`, whose
    receive CQ is `rcq`; sends complete on a polled CQ."""

    def __init__(self, ctx, pd, rcq, size=64):
        self.size = size
        self.scq = CQ(ctx, 16)
        self.sender = vmtest.ud_qp(pd, self.scq, self.scq)
        self.receiver = vmtest.ud_qp(pd, self.scq, rcq)
        self.ah = vmtest.self_ah(pd, ctx)
        self.smr = MR(pd, size, e.IBV_ACCESS_LOCAL_WRITE)
        self.rmr = MR(pd, GRH + size, e.IBV_ACCESS_LOCAL_WRITE)

    def post(self, tag):
        """Posts a receive, then sends `size` bytes starting with `tag`."""
        self.receiver.post_recv(RecvWR(wr_id=tag, num_sge=1, sg=[SGE(self.rmr.buf, GRH + self.size, self.rmr.lkey)]))
        payload = bytes([tag & 0xFF]) * self.size
        self.smr.write(payload, self.size)
        wr = SendWR(wr_id=tag, opcode=e.IBV_WR_SEND, num_sge=1,
                    sg=[SGE(self.smr.buf, self.size, self.smr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_ud(self.ah, self.receiver.qp_num, QKEY)
        self.sender.post_send(wr)
        vmtest.poll(self.scq, "send")
        return payload

    def close(self):
        for obj in (self.sender, self.receiver, self.ah, self.smr, self.rmr, self.scq):
            obj.close()


def receive(cq, pair, tag, payload):
    n, wcs = cq.poll()
    assert n == 1, f"no completion on the CQ after its event ({n})"
    wc = wcs[0]
    assert wc.status == e.IBV_WC_SUCCESS and wc.wr_id == tag and wc.byte_len == GRH + pair.size, \
        f"receive completion: status {wc.status} wr_id {wc.wr_id} byte_len {wc.byte_len}"
    assert pair.rmr.read(pair.size, GRH) == payload, "the received bytes differ from the sent ones"


def test_events_of_each_completion_vector_come_from_its_interrupt(ctx, pd, bdf, vector):
    v = vector
    if v >= ctx.num_comp_vectors:
        pytest.skip(f"the device has {ctx.num_comp_vectors} completion vectors")
    channel, fd = open_channel(ctx)
    cq = CQ(ctx, 16, None, channel, v)
    pair = Pair(ctx, pd, cq)
    for round_ in range(3):
        tag = 16 * v + round_ + 1
        before = vector_interrupts(bdf)
        assert before, f"no refa-comp interrupt lines for {bdf} in /proc/interrupts"
        cq.req_notify()
        payload = pair.post(tag)
        assert wait_readable(fd, WAIT), f"no completion event within {WAIT} s"
        channel.get_cq_event(cq)
        cq.ack_events(1)
        after = vector_interrupts(bdf)
        grew = [vec for vec in after if after[vec] > before.get(vec, 0)]
        # MSI-X vector 0 is the admin queue's; completion vector v is the
        # event queue on MSI-X vector v + 1.
        assert v + 1 in grew, \
            f"the event came without an interrupt on MSI-X vector {v + 1} (interrupts grew on {grew})"
        receive(cq, pair, tag, payload)
    pair.close()
    cq.close()
    channel.close()


def test_completion_vector_beyond_the_devices_refused(ctx):
    channel, _ = open_channel(ctx)
    vectors = ctx.num_comp_vectors
    vmtest.refused(errno.EINVAL, lambda: CQ(ctx, 16, None, channel, vectors).close())
    channel.close()


def test_two_cqs_on_one_channel_each_event_names_its_cq(ctx, pd):
    channel, fd = open_channel(ctx)
    vectors = ctx.num_comp_vectors
    cqs = [CQ(ctx, 16, None, channel, i % vectors) for i in range(2)]
    pairs = [Pair(ctx, pd, cq) for cq in cqs]
    for i in (1, 0, 1):
        cqs[i].req_notify()
        payload = pairs[i].post(0x40 + i)
        assert wait_readable(fd, WAIT), f"CQ {i} of two: no completion event within {WAIT} s"
        # get_cq_event fails if the event names another CQ.
        channel.get_cq_event(cqs[i])
        cqs[i].ack_events(1)
        receive(cqs[i], pairs[i], 0x40 + i, payload)
    for obj in pairs + cqs + [channel]:
        obj.close()


def test_cqs_destroyed_with_their_events_in_flight(ctx, pd):
    rounds = 40
    channel, fd = open_channel(ctx)
    vectors = ctx.num_comp_vectors
    for i in range(rounds):
        cq = CQ(ctx, 16, None, channel, i % vectors)
        pair = Pair(ctx, pd, cq, size=8)
        cq.req_notify()
        pair.post(i)
        # The event is on its way or queued on the channel unread: destroy
        # drops it.
        pair.close()
        cq.close()
    # The channel still delivers events afterwards.
    cq = CQ(ctx, 16, None, channel, 0)
    pair = Pair(ctx, pd, cq)
    cq.req_notify()
    payload = pair.post(0x77)
    assert wait_readable(fd, WAIT), f"no completion event within {WAIT} s after the destroyed CQs"
    channel.get_cq_event(cq)
    cq.ack_events(1)
    receive(cq, pair, 0x77, payload)
    pair.close()
    cq.close()
    channel.close()


# ---- a CQ ring in user memory ------------------------------------------------------

ENTRIES, ENTRY_SIZE = 16, 32


class UserMemoryCq:
    """A byte-level context (uverbs.py) with a CQ whose ring is a page of
    this process (the core's CQ buffer attributes, which rdma-core 56
    cannot send), on a completion channel."""

    def __init__(self, device):
        self.u = uv.Uverbs(device)
        self.sub_cqs = self.u.get_context()[2]
        self.pd, _ = self.u.alloc_pd()
        self.ring, self.ring_addr = vmtest.anonymous(PAGE)
        self.channel = self.u.create_comp_channel()
        self.handle, _, out = self.u.create_cq(
            ENTRIES, uv.cq_cmd(self.sub_cqs, ENTRY_SIZE, uv.CQ_WITH_COMPLETION_CHANNEL),
            buffer=(self.ring_addr, PAGE), channel=self.channel, user_handle=0xC0FFEE)
        _, self.ring_key, _, self.cq_idx, self.db_off, self.db_key = uv.CQ_RESP.unpack(out)

    def close(self):
        os.close(self.channel)
        self.u.close()


@pytest.fixture
def user_cq(device):
    c = UserMemoryCq(device)
    yield c
    c.close()


def test_completions_land_in_a_cq_ring_in_user_memory(device, user_cq):
    c, u = user_cq, user_cq.u
    assert c.ring_key == 0, "a CQ on user memory offers a ring mapping"
    # Armed for one event, as ibv_req_notify_cq does: consumer index 0,
    # command sequence number 0, ARM.
    cq_db = u.mmap(PAGE, c.db_key, mmap.PROT_WRITE)
    struct.pack_into("<I", cq_db, c.db_off, CQ_DB_ARM)

    size = 256
    data, data_addr = vmtest.anonymous(PAGE)
    mr_handle, lkey = u.reg_mr(data_addr, PAGE, c.pd, e.IBV_ACCESS_LOCAL_WRITE)
    qp = u.create_ud_qp(c.pd, c.handle, QKEY)
    qp.post_recv(data_addr, GRH + size, lkey, 0x33)

    # The sender is the efa provider's, on a context of its own.
    with Context(name=device) as ctx:
        sender = vmtest.Sender(ctx, size)
        payload = bytes(range(256))[:size]
        sender.send(qp.qpn, payload)
        # The receive completion is the first entry of the QP's receive
        # sub-CQ, sub-CQs back to back in the ring.
        at = qp.recv_sub_cq * ENTRIES * ENTRY_SIZE
        deadline = time.monotonic() + WAIT
        while not c.ring[at + 3] & 1:  # the phase bit of the first pass
            assert time.monotonic() < deadline, f"no completion in the user memory ring within {WAIT} s"
            time.sleep(0.001)
        req_id, status, flags, qp_num, length, _, _, _ = RX_CDESC.unpack_from(c.ring, at)
        assert req_id == 0x33 and status == 0 and qp_num == qp.qpn and (flags >> 1) & 3 == 2 \
            and length == GRH + size, \
            f"the completion in user memory: req_id {req_id:#x} status {status} flags {flags:#x} " \
            f"qp {qp_num} (expected {qp.qpn}) length {length}"
        assert data[GRH:GRH + size] == payload, "the received bytes differ from the sent ones"
        assert wait_readable(c.channel, WAIT), f"no completion event for the CQ in user memory within {WAIT} s"
        event = struct.unpack("<Q", os.read(c.channel, 8))[0]
        assert event == 0xC0FFEE, f"the event names CQ {event:#x}, expected the user handle 0xc0ffee"
        others = c.ring[:at] + c.ring[at + ENTRY_SIZE:c.sub_cqs * ENTRIES * ENTRY_SIZE]
        assert others == b"\0" * len(others), "the device wrote elsewhere in the ring"
        sender.close()
    cq_db.close()
    qp.close()
    u.dereg_mr(mr_handle)
    u.destroy_cq(c.handle)


def test_a_user_memory_ring_is_pinned_until_the_device_gives_it_back(device, emu, user_cq):
    # The ring stays pinned while the CQ exists, and after a DESTROY_CQ the
    # device failed (it may still write there) until the device is reset;
    # a confirmed destroy unpins it.
    c, u = user_cq, user_cq.u
    pinned = vm_pinned()
    other, other_addr = vmtest.anonymous(PAGE)
    handle, _, _ = u.create_cq(ENTRIES, uv.cq_cmd(c.sub_cqs, ENTRY_SIZE), buffer=(other_addr, PAGE))
    assert vm_pinned() == pinned + PAGE // 1024, f"VmPin {pinned} -> {vm_pinned()} kB with one more CQ ring"
    u.destroy_cq(handle)
    assert vm_pinned() == pinned, f"VmPin {vm_pinned()} kB after destroying the CQ, {pinned} kB before it"
    emu.inject("destroy_cq")
    u.destroy_cq(c.handle)  # the core forgets the CQ whatever the device says
    emu.clear()
    assert vm_pinned() == pinned, \
        f"VmPin {pinned} -> {vm_pinned()} kB: a ring the device did not give back was unpinned"
    assert any(f"destroying CQ {c.cq_idx} failed" in line for line in vmtest.dmesg()), \
        "the failed DESTROY_CQ was not reported"
    # The device still has the CQ on the context's UAR: freeing the UAR
    # fails too (reported); both go with the device's reset at unbind.
