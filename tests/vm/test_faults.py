# SPDX-License-Identifier: GPL-2.0
"""Every create verb of refa against a device that fails:

- each admin command of each create verb fails once (efa-emu's INJECT
  register, RESOURCE_ALLOCATION_FAILURE): user context (ALLOC_UAR), PD
  (ALLOC_PD), CQ (CREATE_CQ), UD and SRD QPs (CREATE_QP), each step of
  RESET -> INIT -> RTR -> RTS (MODIFY_QP), AH (CREATE_AH), MRs with an
  inline, a one-buffer and a chained page list (REG_MR);
- the response of each create verb that has one cannot be copied to
  userspace (the driver's part of the response lies in a PROT_NONE page):
  user context, PD, CQ (ioctl), AH, UD QP (write()) and SRD QP
  (ioctl).

For each: the verb fails with the errno the device status maps to (ENOMEM)
or EFAULT, the fault was consumed, the kernel holds no new object (`rdma
resource`), a failed MODIFY_QP leaves the state as it was, the same verb
then works (the device stays usable), and nothing is left on the device:
efa-emu refuses to free a PD or a UAR that an object still uses, so once
everything is torn down the device must have written no error completion
but the injected one, and when a response copy fails the object must
have been destroyed by exactly one more admin command. The harness then
fails the run on any kernel splat or kmemleak report.
"""

import ctypes
import errno
import json
import mmap
import os
import struct
import subprocess

import pyverbs.enums as e
import pyverbs.providers.efa.efadv as efa
import pytest
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPCap, QPInitAttr

import uverbs as uv
import vmtest
from vmtest import MIB, PAGE, QKEY, errno_of, qattr, qp_state

# One device is enough: what these check does not depend on the device.
DEVICES = 1


class Scope:
    """The objects a case needs around its verb, created on first use and
    torn down in reverse order."""

    def __init__(self, device, buf):
        self.device = device
        self.buf = buf
        self.objs = []
        self._ctx = self._pd = self._cq = None

    def keep(self, obj):
        self.objs.append(obj)
        return obj

    @property
    def ctx(self):
        if self._ctx is None:
            self._ctx = self.keep(efa.EfaContext(name=self.device))
        return self._ctx

    @property
    def pd(self):
        if self._pd is None:
            self._pd = self.keep(PD(self.ctx))
        return self._pd

    @property
    def cq(self):
        if self._cq is None:
            self._cq = self.keep(CQ(self.ctx, 64))
        return self._cq

    def close(self):
        for obj in reversed(self.objs):
            obj.close()
        self.objs = []


def new_qp(s, kind):
    init = QPInitAttr(qp_type=e.IBV_QPT_UD if kind == "UD" else e.IBV_QPT_DRIVER, scq=s.cq, rcq=s.cq,
                      cap=QPCap(max_send_wr=16, max_recv_wr=16))
    return QP(s.pd, init) if kind == "UD" else efa.SRDQP(s.pd, init)


# The steps of bringing a QP up: (state, attributes, mask).
QP_STEPS = [
    (e.IBV_QPS_INIT, dict(qkey=QKEY, port_num=1),
     e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_QKEY),
    (e.IBV_QPS_RTR, {}, e.IBV_QP_STATE),
    (e.IBV_QPS_RTS, dict(sq_psn=0), e.IBV_QP_STATE | e.IBV_QP_SQ_PSN),
]


def modify_case(kind, step):
    """A case failing MODIFY_QP at `step` of QP_STEPS: prepare brings a QP
    to the step before; the verb takes it one step further."""
    state, fields, mask = QP_STEPS[step]

    def prepare(s):
        qp = s.keep(new_qp(s, kind))
        for st, f, m in QP_STEPS[:step]:
            qp.modify(qattr(qp_state=st, **f), m)
        s.qp = qp

    def verb(s):
        before = qp_state(s.qp)
        code, _ = errno_of(lambda: s.qp.modify(qattr(qp_state=state, **fields), mask))
        if code is not None:
            assert qp_state(s.qp) == before, f"{kind} QP: a failed MODIFY_QP changed its state"
            raise OSError(code, os.strerror(code))
        assert qp_state(s.qp) == state, f"{kind} QP: modified without reaching state {state}"
        return None

    return prepare, verb


def ah_verb(gid):
    return lambda s: efa.EfaAH(s.pd, attr=AHAttr(gr=GlobalRoute(dgid=gid, sgid_index=0), is_global=1,
                                                 port_num=1))


class Buffer:
    """Anonymous memory to register, touched so it is populated."""

    def __init__(self, size):
        self.map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.map.write(b"\x5a" * size)
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.map))


class WriteContext:
    """A user context opened through the uverbs write() interface.

    Not through rdma-core, whose GET_CONTEXT goes through ioctl(): when the
    driver fails the context there, Linux 7.3's core frees it without
    dropping the task reference its resource tracking took, and kmemleak
    reports the task (a core bug, not the driver's; the write() path
    drops it)."""

    def __init__(self, name):
        self.u = uv.Uverbs(name)
        try:
            self.u.get_context()
        except OSError:
            self.u.close()
            raise

    def close(self):
        self.u.close()


ACCESS = e.IBV_ACCESS_LOCAL_WRITE


def nothing(s):
    return None


# what: (opcode, prepare(scope), verb(scope))
ADMIN_CASES = {
    "user-context": ("alloc_uar", nothing, lambda s: WriteContext(s.device)),
    "PD": ("alloc_pd", lambda s: s.ctx, lambda s: PD(s.ctx)),
    "CQ": ("create_cq", lambda s: s.ctx, lambda s: CQ(s.ctx, 64)),
    "UD-QP": ("create_qp", lambda s: (s.pd, s.cq), lambda s: new_qp(s, "UD")),
    "SRD-QP": ("create_qp", lambda s: (s.pd, s.cq), lambda s: new_qp(s, "SRD")),
    "AH": ("create_ah", lambda s: s.pd, ah_verb(GID("fe80:0000:0000:0000:0000:0000:0000:0077"))),
    "MR-inline-page-list": ("reg_mr", lambda s: s.pd, lambda s: MR(s.pd, 2 * PAGE, ACCESS, address=s.buf.addr + 5)),
    "MR-one-page-list-buffer": ("reg_mr", lambda s: s.pd, lambda s: MR(s.pd, 3 * MIB, ACCESS, address=s.buf.addr)),
    "MR-chained-page-list": ("reg_mr", lambda s: s.pd, lambda s: MR(s.pd, 20 * MIB, ACCESS, address=s.buf.addr + 9)),
}
for _kind in ("UD", "SRD"):
    for _step, _name in enumerate(("INIT", "RTR", "RTS")):
        ADMIN_CASES[f"{_kind}-QP-to-{_name}"] = ("modify_qp", *modify_case(_kind, _step))


def resources(device):
    """The kernel's object counts for the device (`rdma resource`)."""
    out = subprocess.run(["rdma", "-j", "resource", "show"], capture_output=True, text=True, check=True).stdout
    for entry in json.loads(out):
        if entry.get("ifname") == device:
            return {k: v for k, v in entry.items() if k not in ("ifindex", "ifname")}
    pytest.fail(f"rdma resource does not list {device}")


@pytest.fixture(scope="module")
def buf():
    return Buffer(24 * MIB)


@pytest.mark.parametrize("case", ADMIN_CASES.values(), ids=ADMIN_CASES.keys())
def test_admin_command_failing_once(request, device, emu, buf, case):
    """The verb fails with ENOMEM, the fault was consumed, the kernel holds
    no new object, the same verb then works, and nothing is left on the
    device: the model wrote no error completion but the injected one."""
    opcode, prepare, verb = case
    start = resources(device)
    _, errors0, injected0 = emu.admin()
    mark = f"refa-faults: {request.node.name}"
    vmtest.kmsg(mark)
    s = Scope(device, buf)
    try:
        prepare(s)
        before = resources(device)
        emu.inject(opcode, "resource_allocation_failure")
        try:
            code, obj = errno_of(lambda: verb(s))
        finally:
            emu.clear()
        if obj is not None:
            s.keep(obj)
        assert code == errno.ENOMEM, f"errno {code} when {opcode} fails, expected ENOMEM"
        assert emu.admin()[2] == injected0 + 1, f"the injected {opcode} failure was not consumed"
        assert resources(device) == before, f"the kernel kept an object: {before} -> {resources(device)}"
        again = verb(s)
        if again is not None:
            s.keep(again)
    finally:
        s.close()
    assert resources(device) == start, f"objects left: {start} -> {resources(device)}"
    _, errors, _ = emu.admin()
    assert errors == errors0 + 1, \
        f"the device wrote {errors - errors0} error completions, expected only the injected one " \
        "(an object the driver forgot keeps its PD or UAR busy)"
    failures = vmtest.refa_failures_since(mark, "freeing", "destroying", "deregistering")
    assert not failures, f"{failures}"


class Unwritable:
    """A response buffer whose first `core_len` bytes are writable and end a
    page, followed by a PROT_NONE page: the core's part of a response can
    be written, the driver's part cannot."""

    def __init__(self, core_len):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        base = libc.mmap(None, 2 * PAGE, mmap.PROT_READ | mmap.PROT_WRITE,
                         mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        assert base not in (None, ctypes.c_void_p(-1).value), "mmap of a response buffer"
        assert libc.mprotect(base + PAGE, PAGE, 0) == 0, "mprotect of the driver's half"
        self.addr = base + PAGE - core_len
        self.driver = base + PAGE


def write_cmd(u, command, core_in, core_len, driver_in, driver_len, resp_addr):
    """A write() command with its response at `resp_addr`."""
    body = struct.pack("<Q", resp_addr) + core_in + driver_in
    hdr = struct.pack("<IHH", command, (8 + len(body)) // 4, (core_len + driver_len) // 4)
    os.write(u.fd, hdr + body)


def ioctl_create_cq(u, cqe, driver_in, out_addr, out_len):
    """CQ creation through ioctl() with the driver's response at `out_addr`."""
    resp_cqe = ctypes.create_string_buffer(4)
    u.ioctl(uv.OBJECT_CQ, uv.METHOD_CQ_CREATE,
            [(uv.CQ_HANDLE, 0, 0), (uv.CQ_CQE, 4, cqe), (uv.CQ_USER_HANDLE, 8, 0),
             (uv.CQ_COMP_VECTOR, 4, 0), (uv.CQ_RESP_CQE, 4, ctypes.addressof(resp_cqe)),
             (uv.UHW_IN, len(driver_in), u.keep(driver_in)), (uv.UHW_OUT, out_len, out_addr)])


# The QP object's create method (ib_user_ioctl_cmds.h) and its attributes.
OBJECT_QP, METHOD_QP_CREATE = 4, 0
QP_HANDLE, QP_PD, QP_SEND_CQ, QP_RECV_CQ, QP_USER_HANDLE, QP_CAP, QP_TYPE = 0, 2, 4, 5, 7, 8, 9
QP_RESP_CAP, QP_RESP_QP_NUM = 13, 14
QPT_DRIVER = 0xFF
QP_CAP_STRUCT = struct.Struct("<IIIII")  # struct ib_uverbs_qp_cap


def ioctl_create_srd_qp(u, pd, cq, out_addr):
    """An SRD QP created through ioctl() (the write() command has no
    driver QP types) with the driver's response at `out_addr`."""
    resp_cap = ctypes.create_string_buffer(QP_CAP_STRUCT.size)
    resp_qpn = ctypes.create_string_buffer(4)
    cap = QP_CAP_STRUCT.pack(16, 16, 1, 1, 0)
    driver_in = uv.EFA_QP_CMD.pack(0, 16 * uv.RX_DESC.size, 16 * 64, EFA_QP_DRIVER_TYPE_SRD, 0, 0, b"\0" * 5)
    u.ioctl(OBJECT_QP, METHOD_QP_CREATE,
            [(QP_HANDLE, 0, 0), (QP_PD, 0, pd), (QP_SEND_CQ, 0, cq), (QP_RECV_CQ, 0, cq),
             (QP_USER_HANDLE, 8, 0), (QP_CAP, len(cap), u.keep(cap)), (QP_TYPE, 8, QPT_DRIVER),
             (QP_RESP_CAP, QP_CAP_STRUCT.size, ctypes.addressof(resp_cap)),
             (QP_RESP_QP_NUM, 4, ctypes.addressof(resp_qpn)),
             (uv.UHW_IN, len(driver_in), u.keep(driver_in)),
             (uv.UHW_OUT, uv.EFA_QP_RESP.size, out_addr)])


EFA_QP_DRIVER_TYPE_SRD = 0


def ctx_fail(u, st, r):
    write_cmd(u, uv.GET_CONTEXT, b"", 8, uv.CAPS, uv.UCONTEXT_RESP.size, r.addr)


def pd_fail(u, st, r):
    write_cmd(u, uv.ALLOC_PD, b"", 4, b"", uv.PD_RESP.size, r.addr)


def cq_fail(u, st, r):
    ioctl_create_cq(u, 16, uv.cq_cmd(st["sub_cqs"]), r.driver, uv.CQ_RESP.size)


def ah_fail(u, st, r):
    u.create_ah(st["pd"], uv.ah_attr(st["gid"]), r.addr)


def ud_qp_fail(u, st, r):
    core_in = uv.QP_CREATE.pack(0, st["pd"], st["cq"], st["cq"], 0, 16, 16, 1, 1, 0, 0, uv.QPT_UD, 0, 0)
    driver_in = uv.EFA_QP_CMD.pack(0, 16 * uv.RX_DESC.size, 16 * 64, 0, 0, 0, b"\0" * 5)
    write_cmd(u, uv.CREATE_QP, core_in, uv.QP_CREATE_RESP.size, driver_in, uv.EFA_QP_RESP.size, r.addr)


def srd_qp_fail(u, st, r):
    ioctl_create_srd_qp(u, st["pd"], st["cq"], r.driver)


@pytest.fixture(scope="module")
def gid(device):
    """The device's GID (an AH's destination)."""
    with efa.EfaContext(name=device) as c:
        return bytes.fromhex(str(c.query_gid(1, 0)).replace(":", ""))


# what: (the verb with an unwritable driver response, core response length)
COPY_CASES = {
    "user-context": (ctx_fail, 8),
    "PD": (pd_fail, 4),
    "CQ": (cq_fail, 0),
    "AH": (ah_fail, 4),
    "UD-QP": (ud_qp_fail, uv.QP_CREATE_RESP.size),
    "SRD-QP": (srd_qp_fail, 0),
}


@pytest.mark.parametrize("case", COPY_CASES.values(), ids=COPY_CASES.keys())
def test_create_response_that_cannot_be_copied(request, device, emu, gid, case):
    """EFAULT, the kernel holds no new object, and the device object was
    created and destroyed: exactly one more admin command, none failing."""
    fail, core_len = case
    start = resources(device)
    mark = f"refa-faults: {request.node.name}"
    vmtest.kmsg(mark)
    u = uv.Uverbs(device)
    st = {}
    try:
        if fail is not ctx_fail:
            st["sub_cqs"] = u.get_context()[2]
            st["pd"], _ = u.alloc_pd()
            st["cq"], _, _ = u.create_cq(16, uv.cq_cmd(st["sub_cqs"]))
            st["gid"] = gid
        before = resources(device)
        cmds0, errors0, _ = emu.admin()
        r = Unwritable(core_len)
        code, _ = errno_of(lambda: fail(u, st, r))
        cmds, errors, _ = emu.admin()
        assert code == errno.EFAULT, f"errno {code} with an unwritable response, expected EFAULT"
        assert resources(device) == before, f"the kernel kept an object: {before} -> {resources(device)}"
        assert errors == errors0, f"{errors - errors0} admin commands failed"
        assert cmds == cmds0 + 2, f"{cmds - cmds0} admin commands, expected the create and the destroy of the object"
    finally:
        u.close()
    assert resources(device) == start, f"objects left: {start} -> {resources(device)}"
    failures = vmtest.refa_failures_since(mark, "freeing", "destroying", "deregistering")
    assert not failures, f"{failures}"
