# SPDX-License-Identifier: GPL-2.0
"""Every size a user chooses is bounded before the driver allocates for it
(run by tests/vm/run-refa-limits).

For each size in a request, the largest legal value works and the next one
is refused with EINVAL, with no kernel warning (the harness fails the run
on any): a QP's receive ring (what its receive WRs and SGEs need: the efa
provider asks for that much), its send queue (the device's LLQ size), its
work requests, scatter-gather elements and inline data (the device's
limits); a CQ's depth (the device's, and at most what one block of kernel
pages holds: query_device reports that); a memory region's length (the
device's max_mr_size). A receive ring of 8 MiB for 16 receives, which
before reached the page allocator's WARN, is refused.

A device that raises warnings without end does not flood the kernel log:
the driver prints at most ten per five seconds.

Kernel memory a user asks for is charged to the user's memory cgroup: a
process in a cgroup allowed 8 MiB more than it uses gets ENOMEM after a few
CQs of 2 MiB each, not 64 of them.

The efa-emu device runs with max_cq_depth 65536 (a ring of 8 MiB: more
than one block) and max_mr_pages 1024 (4 MiB), so that both limits can be
reached in a small guest.
"""

import errno
import os
import struct
import subprocess
import time

import pyverbs.providers.efa.efadv as efadv
import pytest

import efa_emu
import uverbs as uv
import vmtest
from vmtest import MIB, PAGE

CGROUP = "/sys/fs/cgroup"


def next_pow2(n):
    return 1 << (max(n, 1) - 1).bit_length()


class Limits:
    """What the device and the driver say the limits are."""

    def __init__(self, device):
        ctx = efadv.EfaContext(name=device)
        attr = ctx.query_device()
        efa = ctx.query_efa_device()
        self.max_cqe = attr.max_cqe
        self.max_mr_size = attr.max_mr_size
        self.max_sq_wr, self.max_rq_wr = efa.max_sq_wr, efa.max_rq_wr
        self.max_sq_sge, self.max_rq_sge = efa.max_sq_sge, efa.max_rq_sge
        ctx.close()


@pytest.fixture(scope="module")
def lim(device):
    return Limits(device)


class Raw:
    """A byte-level context (uverbs.py) with a PD and a CQ."""

    def __init__(self, device):
        self.u = uv.Uverbs(device)
        self.resp = self.u.get_context()
        self.sub_cqs = self.resp[2]
        self.pd, _ = self.u.alloc_pd()
        self.cq, _, _ = self.u.create_cq(64, uv.cq_cmd(self.sub_cqs))

    def create_qp(self, send_wr=16, recv_wr=16, send_sge=1, recv_sge=1, inline=0,
                  rq_ring_size=None, sq_ring_size=None):
        """A UD QP through write(): its handle. The ring sizes default to
        what the efa provider asks for."""
        if rq_ring_size is None:
            rq_ring_size = next_pow2(recv_wr * recv_sge) * uv.RX_DESC.size
        if sq_ring_size is None:
            sq_ring_size = next_pow2(send_wr) * 64
        core, _ = self.u.cmd(uv.CREATE_QP,
                             uv.QP_CREATE.pack(0, self.pd, self.cq, self.cq, 0, send_wr, recv_wr, send_sge,
                                               recv_sge, inline, 0, uv.QPT_UD, 0, 0),
                             uv.QP_CREATE_RESP.size,
                             uv.EFA_QP_CMD.pack(0, rq_ring_size, sq_ring_size, 0, 0, 0, b"\0" * 5),
                             uv.EFA_QP_RESP.size)
        return uv.QP_CREATE_RESP.unpack(core)[0]

    def destroy_qp(self, handle):
        self.u.cmd(uv.DESTROY_QP, struct.pack("<II", handle, 0), 4)

    def close(self):
        self.u.close()


@pytest.fixture
def raw(device):
    r = Raw(device)
    yield r
    r.close()


def works(fn, *args, **kw):
    code, result = vmtest.errno_of(fn, *args, **kw)
    assert code is None, f"{vmtest.name_of(code)}, expected success"
    return result


# ---- queue pairs ---------------------------------------------------------------------

def llq_send_wr(lim, resp):
    # The device takes a send queue of 64 or 128 bytes per WQE.
    return min(lim.max_sq_wr, resp[4] // 64)


def most_rq(lim):
    return next_pow2(lim.max_rq_wr * lim.max_rq_sge) * uv.RX_DESC.size


# What: (works, the QP's sizes from the limits and the context's response:
# max_llq is its field 4, the inline bytes its field 7).
QP_CASES = {
    # The ring for 16 receives of one SGE is 256 bytes; a byte more is
    # more than the QP can use.
    "receive-ring-of-256-bytes-for-16-WRs": (True, lambda lim, r: {}),
    "receive-ring-of-257-bytes-for-16-WRs": (False, lambda lim, r: dict(rq_ring_size=257)),
    "receive-ring-of-8-MiB-for-16-WRs": (False, lambda lim, r: dict(rq_ring_size=8 * MIB)),
    "receive-ring-of-4-GiB-less-1-for-16-WRs": (False, lambda lim, r: dict(rq_ring_size=0xFFFFFFFF)),
    "receive-ring-for-the-devices-WRs-and-SGEs":
        (True, lambda lim, r: dict(recv_wr=lim.max_rq_wr, recv_sge=lim.max_rq_sge)),
    "receive-ring-a-byte-longer-than-that":
        (False, lambda lim, r: dict(recv_wr=lim.max_rq_wr, recv_sge=lim.max_rq_sge, rq_ring_size=most_rq(lim) + 1)),
    "send-queue-of-the-devices-LLQ-size":
        (True, lambda lim, r: dict(send_wr=llq_send_wr(lim, r), sq_ring_size=r[4])),
    "send-queue-a-byte-longer": (False, lambda lim, r: dict(send_wr=llq_send_wr(lim, r), sq_ring_size=r[4] + 1)),
    "send-WRs-at-the-limit": (True, lambda lim, r: dict(send_wr=lim.max_sq_wr)),
    "send-WRs-past-it": (False, lambda lim, r: dict(send_wr=lim.max_sq_wr + 1)),
    "receive-WRs-at-the-limit": (True, lambda lim, r: dict(recv_wr=lim.max_rq_wr)),
    "receive-WRs-past-it": (False, lambda lim, r: dict(recv_wr=lim.max_rq_wr + 1)),
    "send-SGEs-at-the-limit": (True, lambda lim, r: dict(send_sge=lim.max_sq_sge)),
    "send-SGEs-past-it": (False, lambda lim, r: dict(send_sge=lim.max_sq_sge + 1)),
    "receive-SGEs-at-the-limit": (True, lambda lim, r: dict(recv_sge=lim.max_rq_sge)),
    "receive-SGEs-past-it": (False, lambda lim, r: dict(recv_sge=lim.max_rq_sge + 1)),
    "inline-bytes-at-the-limit": (True, lambda lim, r: dict(inline=r[7])),
    "inline-bytes-past-it": (False, lambda lim, r: dict(inline=r[7] + 1)),
}


@pytest.mark.parametrize("case", QP_CASES.values(), ids=QP_CASES.keys())
def test_qp_size(raw, lim, case):
    ok, sizes = case
    kw = sizes(lim, raw.resp)
    print(f"create_qp({kw})")
    if ok:
        raw.destroy_qp(works(raw.create_qp, **kw))
    else:
        vmtest.refused(errno.EINVAL, raw.create_qp, **kw)


# ---- completion queues ---------------------------------------------------------------

def test_cq_of_the_devices_depth_a_4_mib_ring(raw, lim):
    assert lim.max_cqe * 32 * raw.sub_cqs <= 4 * MIB < (lim.max_cqe + 1) * 32 * raw.sub_cqs, \
        f"max_cqe {lim.max_cqe} with {raw.sub_cqs} sub-CQs is not what a 4 MiB ring of 32-byte entries holds"
    handle, _, _ = works(raw.u.create_cq, lim.max_cqe, uv.cq_cmd(raw.sub_cqs, entry_size=32))
    raw.u.destroy_cq(handle)


def test_cq_one_entry_deeper_refused(raw, lim, hw_counter):
    before = hw_counter("create_cq_err")
    vmtest.refused(errno.EINVAL, raw.u.create_cq, lim.max_cqe + 1, uv.cq_cmd(raw.sub_cqs, entry_size=32))
    grew = hw_counter("create_cq_err") - before
    assert grew == 1, f"create_cq_err grew by {grew}, expected 1"


# ---- memory regions ------------------------------------------------------------------

@pytest.fixture(scope="module")
def mr_buf(lim):
    """max_mr_size and a page more of memory, populated."""
    assert lim.max_mr_size == 4 * MIB, f"max_mr_size {lim.max_mr_size}, expected 4 MiB from max_mr_pages 1024"
    m, addr = vmtest.anonymous(lim.max_mr_size + PAGE, b"\1")
    yield addr
    m.close()


def test_mr_of_max_mr_size(raw, lim, mr_buf):
    handle, _ = works(raw.u.reg_mr, mr_buf, lim.max_mr_size, raw.pd, 1)
    raw.u.dereg_mr(handle)


# A page-aligned region one page longer spans a page too many.
MR_REFUSED = {
    "a-byte-longer": lambda lim: lim.max_mr_size + 1,
    "of-1-TiB": lambda lim: 1 << 40,
    "a-page-longer": lambda lim: lim.max_mr_size + PAGE,
}


@pytest.mark.parametrize("length", MR_REFUSED.values(), ids=MR_REFUSED.keys())
def test_mr_longer_than_max_mr_size_refused(raw, lim, mr_buf, length):
    vmtest.refused(errno.EINVAL, raw.u.reg_mr, mr_buf, length(lim), raw.pd, 1)


# ---- the memory cgroup ---------------------------------------------------------------

# Rings of 2 MiB: the cgroup runs out at one of them, leaving the process
# room for its own small allocations.
RING = 2 * MIB


def test_cq_rings_are_charged_to_their_creators_memory_cgroup(device):
    if not os.path.exists(f"{CGROUP}/cgroup.controllers"):
        os.makedirs(CGROUP, exist_ok=True)
        assert os.system(f"mount -t cgroup2 none {CGROUP}") == 0, "cannot mount cgroup2"
    with open(f"{CGROUP}/cgroup.controllers") as f:
        assert "memory" in f.read().split(), "no memory controller"
    with open(f"{CGROUP}/cgroup.subtree_control", "w") as f:
        f.write("+memory")
    group = f"{CGROUP}/refa-limits"
    os.makedirs(group, exist_ok=True)
    with open(f"{group}/cgroup.procs", "w") as f:
        f.write(str(os.getpid()))
    made = []
    u = uv.Uverbs(device)
    try:
        sub_cqs = u.get_context()[2]
        cqe = RING // (32 * sub_cqs)
        with open(f"{group}/memory.current") as f:
            current = int(f.read())
        with open(f"{group}/memory.max", "w") as f:
            f.write(str(current + 8 * MIB))
        err = None
        for _ in range(64):
            try:
                handle, _, _ = u.create_cq(cqe, uv.cq_cmd(sub_cqs, entry_size=32))
            except OSError as e:
                err = e.errno
                break
            made.append(handle)
        assert err == errno.ENOMEM, \
            f"{len(made)} CQs of 2 MiB in a cgroup allowed 8 MiB more, then " \
            f"{errno.errorcode.get(err, 'none refused')}: the rings are not charged to it"
        assert 1 <= len(made) <= 4, f"{len(made)} CQs of 2 MiB in 8 MiB"
    finally:
        for handle in made:
            u.destroy_cq(handle)
        u.close()
        with open(f"{CGROUP}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
        os.rmdir(group)


def test_the_same_cq_outside_the_cgroup(raw):
    handle, _, _ = works(raw.u.create_cq, RING // (32 * raw.sub_cqs), uv.cq_cmd(raw.sub_cqs, entry_size=32))
    raw.u.destroy_cq(handle)


# ---- the kernel log ------------------------------------------------------------------

def test_a_storm_of_device_warnings_is_rate_limited(emu):
    """A device that raises warnings without end fills the log with at most
    ten lines per five seconds."""
    window = emu.win
    os.system("dmesg -C")
    start = time.monotonic()
    for _ in range(300):
        window.write(efa_emu.COMMAND, efa_emu.COMMANDS["warning"])
    time.sleep(1)
    elapsed = time.monotonic() - start
    log = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    printed = log.count("device warning")
    windows = int(elapsed // 5) + 1
    assert 0 < printed <= 10 * windows, f"{printed} 'device warning' lines for 300 events in {elapsed:.1f} s"
