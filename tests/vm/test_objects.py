# SPDX-License-Identifier: GPL-2.0
"""Address handles, memory regions and QPs on refa, through rdma-core's efa
provider (pyverbs):

- AHs: one device handle per (PD, GID), shared by every AH for the pair and
  destroyed with the last; different PDs get their own; an AH without a
  GRH is refused by the kernel with EINVAL (sent byte by byte, so that
  the provider cannot refuse it first), as is a zero-length MR;
- MRs of many sizes and page offsets, so that the page list is inline,
  one buffer, and a chain of chunks; access rights the device cannot
  enforce are refused, optional hints are not;
- each admin command of each create verb failed once by efa-emu: the verb
  fails with an errno, then works again;
- QPs (UD and SRD): RESET -> RTS refused (EINVAL), attributes the device
  has no use for refused, a failing MODIFY_QP leaves the state as it was,
  a failing CREATE_QP fails the verb and counts in create_qp_err, then the
  full RESET -> INIT -> RTR -> RTS sequence and QUERY_QP;
- CREATE_AH whose response cannot be copied to userspace: the device's
  handle is released (checked through the PD, which the device frees only
  when nothing uses it).

The harness then unloads the driver and fails the run on any kernel splat
or kmemleak report.
"""

import ctypes
import errno
import mmap
import struct

import pyverbs.enums as e
import pyverbs.providers.efa.efa_enums as efa_enums
import pyverbs.providers.efa.efadv as efa
import pytest
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPCap, QPInitAttr

import uverbs as uv
import vmtest
from vmtest import MIB, PAGE, errno_of, qattr, qp_state

START = "refa-objects: start"


@pytest.fixture(scope="module", autouse=True)
def start_mark():
    """The kernel log's mark that test_nothing_left_unreleased looks from."""
    vmtest.kmsg(START)


@pytest.fixture(scope="module")
def buf_addr():
    """64 MiB of anonymous memory, populated, to register."""
    m, addr = vmtest.anonymous(64 * MIB, b"\x5a")
    yield addr
    m.close()


def ah(pd, gid, port=1):
    attr = AHAttr(gr=GlobalRoute(dgid=gid, sgid_index=0), is_global=1, port_num=port)
    a = efa.EfaAH(pd, attr=attr)
    return a, a.query_efa_ah().ahn


def gid_str(n):
    """A GID nobody has: fe80::n."""
    return GID("fe80:0000:0000:0000:0000:0000:%04x:%04x" % (n >> 16, n & 0xFFFF))


def test_ahs_share_one_handle_per_pd_and_gid(ctx, peers):
    pd1, pd2 = PD(ctx), PD(ctx)
    a1, n1 = ah(pd1, peers[0])
    a2, n2 = ah(pd1, peers[0])
    assert n1 == n2, f"two AHs for one GID in one PD: handles {n1} and {n2}"
    b1, m1 = ah(pd2, peers[0])
    assert m1 != n1, f"AHs in two PDs share handle {n1}"
    others = [ah(pd1, gid_str(i)) for i in range(1, 17)]
    handles = {n for _, n in others}
    assert len(handles) == 16 and n1 not in handles, f"16 GIDs got handles {sorted(handles)}"
    a1.close()
    a3, n3 = ah(pd1, peers[0])
    assert n3 == n1, f"the handle changed from {n1} to {n3} while an AH still used it"
    for a in [a2, a3, b1] + [a for a, _ in others]:
        a.close()
    a4, _ = ah(pd1, peers[0])
    a4.close()
    # Every AH is gone: the device frees the PDs only if no handle is left.
    pd1.close()
    pd2.close()


def mr_access(ctx):
    """Local write, and the remote rights the device can enforce."""
    caps = ctx.query_efa_device().device_caps
    access = e.IBV_ACCESS_LOCAL_WRITE
    if caps & efa_enums.EFADV_DEVICE_ATTR_CAPS_RDMA_READ:
        access |= e.IBV_ACCESS_REMOTE_READ
    if caps & efa_enums.EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE:
        access |= e.IBV_ACCESS_REMOTE_WRITE
    return access


# (length, page offset): inline (<= 4 pages), one buffer (up to 4096
# pages), chained (beyond).
MR_CASES = [
    (1, 0), (PAGE, 0), (PAGE, 1), (3 * PAGE + 5, 7), (4 * PAGE, 0),
    (5 * PAGE, 0), (MIB, 123), (2 * MIB + 1, PAGE - 1), (16 * MIB, 0),
    (16 * MIB, 1), (33 * MIB + 77, 333), (48 * MIB, 3 * PAGE + 1),
]


@pytest.mark.parametrize("length,offset", MR_CASES, ids=[f"{n}-bytes-at-{o}" for n, o in MR_CASES])
def test_mr(ctx, pd, buf_addr, length, offset):
    MR(pd, length, mr_access(ctx), address=buf_addr + offset).close()


def test_mrs_have_distinct_lkeys(ctx, pd, buf_addr):
    access = mr_access(ctx)
    mrs = [MR(pd, length, access, address=buf_addr + off) for length, off in MR_CASES]
    keys = {mr.lkey for mr in mrs}
    for mr in mrs:
        mr.close()
    assert len(keys) == len(mrs), "two MRs share an lkey"


def test_read_only_and_local_write_only_mrs(pd, buf_addr):
    for a in (0, e.IBV_ACCESS_LOCAL_WRITE):
        MR(pd, 3 * PAGE, a, address=buf_addr).close()


REFUSED_RIGHTS = {
    "remote-atomic": e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_ATOMIC,
    "memory-window-bind": e.IBV_ACCESS_MW_BIND,
}


@pytest.mark.parametrize("access", REFUSED_RIGHTS.values(), ids=REFUSED_RIGHTS.keys())
def test_mr_rights_the_device_cannot_enforce_refused(pd, buf_addr, access):
    vmtest.refused(errno.EOPNOTSUPP, MR, pd, PAGE, access, address=buf_addr)


def test_mr_remote_read_only_where_the_device_reads(ctx, pd, buf_addr):
    caps = ctx.query_efa_device().device_caps
    if caps & efa_enums.EFADV_DEVICE_ATTR_CAPS_RDMA_READ:
        MR(pd, PAGE, e.IBV_ACCESS_REMOTE_READ, address=buf_addr).close()
    else:
        vmtest.refused(errno.EOPNOTSUPP, MR, pd, PAGE, e.IBV_ACCESS_REMOTE_READ, address=buf_addr)


def test_mr_relaxed_ordering_a_hint_accepted(pd, buf_addr):
    MR(pd, PAGE, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_RELAXED_ORDERING, address=buf_addr).close()


# ---- each admin command of each create verb fails once ------------------------------

FAULTS = {
    "AH": ("create_ah", lambda pd, access, buf: ah(pd, gid_str(0x1234))[0]),
    "MR-inline-list": ("reg_mr", lambda pd, access, buf: MR(pd, 2 * PAGE, access, address=buf + 5)),
    "MR-one-buffer": ("reg_mr", lambda pd, access, buf: MR(pd, 3 * MIB, access, address=buf)),
    "MR-chained-list": ("reg_mr", lambda pd, access, buf: MR(pd, 20 * MIB, access, address=buf + 9)),
}


@pytest.mark.refa_only
@pytest.mark.parametrize("case", FAULTS.values(), ids=FAULTS.keys())
def test_create_fails_with_its_admin_command_then_works(ctx, pd, emu, peers, buf_addr, case):
    opcode, make = case
    access = mr_access(ctx)
    holder, _ = ah(pd, peers[0])
    emu.inject(opcode)
    code, obj = errno_of(make, pd, access, buf_addr)
    emu.clear()
    if obj is not None:
        obj.close()
    # The model's default status is UNKNOWN_ERROR: EINVAL, as efa.ko maps
    # it (efa_com_status_to_errno).
    assert code == errno.EINVAL, f"errno {code} for a failing {opcode}, expected EINVAL"
    make(pd, access, buf_addr).close()
    holder.close()


@pytest.mark.refa_only
def test_an_ah_for_a_gid_the_pd_has_an_ah_for_sends_no_create_ah(pd, emu, peers):
    holder, _ = ah(pd, peers[0])
    # A second AH for a (PD, GID) sends no command: the fault stays armed.
    emu.inject("create_ah")
    again, _ = ah(pd, peers[0])
    code, obj = errno_of(lambda: ah(pd, gid_str(0x4321))[0])
    emu.clear()
    if obj is not None:
        obj.close()
    assert code == errno.EINVAL, f"the armed CREATE_AH fault did not fire (errno {code}, expected EINVAL)"
    ah(pd, gid_str(0x4321))[0].close()
    again.close()
    holder.close()


# ---- QPs ---------------------------------------------------------------------------

QP_MAKERS = {
    "UD": lambda pd, cq: QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq,
                                           cap=QPCap(max_send_wr=16, max_recv_wr=16))),
    "SRD": lambda pd, cq: efa.SRDQP(pd, QPInitAttr(qp_type=e.IBV_QPT_DRIVER, scq=cq, rcq=cq,
                                                   cap=QPCap(max_send_wr=16, max_recv_wr=16))),
}


@pytest.mark.refa_only
@pytest.mark.parametrize("make", QP_MAKERS.values(), ids=QP_MAKERS.keys())
def test_qp_state_machine_refusals_and_failing_commands(pd, cq, emu, hw_counter, make):
    init = e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_QKEY
    qp = make(pd, cq)
    assert qp_state(qp) == e.IBV_QPS_RESET, "a new QP is not in RESET"
    code, _ = errno_of(qp.modify, qattr(qp_state=e.IBV_QPS_RTS, sq_psn=0), e.IBV_QP_STATE | e.IBV_QP_SQ_PSN)
    assert code == errno.EINVAL, f"RESET -> RTS: errno {code}"
    code, _ = errno_of(qp.modify, qattr(qp_state=e.IBV_QPS_INIT, qkey=0x11111111, port_num=1),
                       init | e.IBV_QP_ACCESS_FLAGS)
    # An attribute the device has no use for: EOPNOTSUPP, as efa.ko answers
    # (its attribute mask check comes before the state machine's), for UD
    # and SRD alike.
    assert code == errno.EOPNOTSUPP, f"INIT with access flags: errno {code}, expected EOPNOTSUPP"
    emu.inject("modify_qp")
    code, _ = errno_of(qp.modify, qattr(qp_state=e.IBV_QPS_INIT, qkey=0x11111111, port_num=1), init)
    emu.clear()
    assert code == errno.EINVAL, f"errno {code} for a failing MODIFY_QP, expected EINVAL"
    assert qp_state(qp) == e.IBV_QPS_RESET, "a failed MODIFY_QP changed the state"
    qp.modify(qattr(qp_state=e.IBV_QPS_INIT, qkey=0x11111111, port_num=1), init)
    qp.modify(qattr(qp_state=e.IBV_QPS_RTR), e.IBV_QP_STATE)
    qp.modify(qattr(qp_state=e.IBV_QPS_RTS, sq_psn=0), e.IBV_QP_STATE | e.IBV_QP_SQ_PSN)
    attr, _ = qp.query(e.IBV_QP_STATE | e.IBV_QP_QKEY)
    assert attr.qp_state == e.IBV_QPS_RTS and attr.qkey == 0x11111111, \
        f"query after RTS: state {attr.qp_state} qkey {attr.qkey:#x}"
    qp.close()
    before = hw_counter("create_qp_err")
    emu.inject("create_qp")
    code, obj = errno_of(make, pd, cq)
    emu.clear()
    if obj is not None:
        obj.close()
    assert code == errno.EINVAL, f"errno {code} for a failing CREATE_QP, expected EINVAL"
    after = hw_counter("create_qp_err")
    assert after == before + 1, f"create_qp_err {before} -> {after}"
    make(pd, cq).close()


# ---- requests refused by the kernel itself ----------------------------------------------

@pytest.fixture
def raw(device):
    """A byte-level context and PD: requests rdma-core would never send go
    straight to the kernel, so that the errno is the driver's and not the
    provider's."""
    u = uv.Uverbs(device)
    u.get_context()
    pd, _ = u.alloc_pd()
    yield u, pd
    u.dealloc_pd(pd)
    u.close()


def gid_bytes(gid):
    return bytes.fromhex(str(gid).replace(":", ""))


def test_ah_without_a_grh_refused(raw, peers):
    # An EFA address is a GID: efa.ko sends whatever the unused GRH holds,
    # refa refuses.
    u, pd = raw
    resp = ctypes.create_string_buffer(12)
    vmtest.refused(errno.EINVAL, u.create_ah, pd, uv.ah_attr(gid_bytes(peers[0]), is_global=0, dlid=1),
                   ctypes.addressof(resp))


def test_zero_length_mr_refused(raw, buf_addr):
    u, pd = raw
    vmtest.refused(errno.EINVAL, u.reg_mr, buf_addr, 0, pd, e.IBV_ACCESS_LOCAL_WRITE)


def unwritable_page():
    """A page the kernel cannot write to (PROT_NONE)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    addr = libc.mmap(None, PAGE, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value), "mmap of a PROT_NONE page"
    return addr


def create_ah_three_times_unwritable(u, pd, gid):
    """CREATE_AH with a response the kernel cannot copy out, three times:
    each must fail with EFAULT."""
    addr = unwritable_page()
    for attempt in range(3):
        vmtest.refused(errno.EFAULT, u.create_ah, pd, uv.ah_attr(gid), addr)


def test_create_ah_with_an_uncopyable_response_efault(raw, peers):
    u, pd = raw
    create_ah_three_times_unwritable(u, pd, gid_bytes(peers[0]))


def test_create_ah_with_an_uncopyable_response_releases_the_handle(device, peers):
    """The device's handles are released: the device frees the PD only
    when nothing uses it, and refa would report failing to."""
    u = uv.Uverbs(device)
    u.get_context()
    pd, _ = u.alloc_pd()
    create_ah_three_times_unwritable(u, pd, gid_bytes(peers[0]))
    resp = ctypes.create_string_buffer(12)
    u.create_ah(pd, uv.ah_attr(gid_bytes(peers[0])), ctypes.addressof(resp))
    u.destroy_ah(struct.unpack_from("<I", resp.raw)[0])
    mark = f"refa-objects: copy fault PD {device}"
    vmtest.kmsg(mark)
    u.dealloc_pd(pd)
    errors = vmtest.refa_failures_since(mark)
    u.close()
    assert not errors, f"the PD was still in use on the device: {errors}"


def test_nothing_left_unreleased():
    """The device released every object the tests above destroyed."""
    errors = vmtest.refa_failures_since(START, "freeing", "destroying", "deregistering")
    assert not errors, f"objects the device failed to release: {errors}"
