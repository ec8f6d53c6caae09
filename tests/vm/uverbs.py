# SPDX-License-Identifier: GPL-2.0
"""The kernel's RDMA uAPI spoken byte by byte, for the guest tests: rdma-core
only ever sends well-formed requests, so the tests that send what it never
would (malformed driver data, unknown mmap cookies, CQ rings in user
memory, completion counters, which rdma-core 56 has no verbs for) speak the
kernel's ABI themselves (include/uapi/rdma/ib_user_verbs.h,
rdma_user_ioctl_cmds.h, ib_user_ioctl_cmds.h and efa-abi.h): write()
commands, and ioctl() methods.

    u = Uverbs("refa_0")
    sub_cqs = u.get_context()[2]
    handle, entries, resp = u.create_cq(16, cq_cmd(sub_cqs))
"""

import ctypes
import fcntl
import mmap
import os
import struct

PAGE = mmap.PAGESIZE

# enum ib_uverbs_write_cmds, and what they take (ib_user_verbs.h).
GET_CONTEXT, ALLOC_PD, DEALLOC_PD, CREATE_COMP_CHANNEL, DESTROY_CQ = 0, 3, 4, 17, 20
REG_MR, DEREG_MR, CREATE_QP, MODIFY_QP, DESTROY_QP = 9, 13, 24, 26, 27
QP_CREATE = struct.Struct("<QIIIIIIIIIBBBB")  # after the response pointer
QP_CREATE_RESP = struct.Struct("<IIIIIIII")
QP_DEST = struct.Struct("<16sIHHBBBBBBBB")
QP_MODIFY = struct.Struct("<IIIIIIIHHBBBBBBBBBBBBBB2x")  # after two QP_DESTs
# enum ib_qp_type, ib_qp_state, ib_qp_attr_mask
QPT_UD = 4
QPS_INIT, QPS_RTR, QPS_RTS = 1, 2, 3
QP_STATE, QP_PKEY_INDEX, QP_PORT, QP_QKEY, QP_SQ_PSN = 1 << 0, 1 << 4, 1 << 5, 1 << 6, 1 << 16

# The ioctl() interface: RDMA_VERBS_IOCTL, struct ib_uverbs_ioctl_hdr and
# struct ib_uverbs_attr, the CQ object's create method and its attributes.
RDMA_VERBS_IOCTL = 0xC0181B01
IOCTL_HDR = struct.Struct("<HHHHQII")
IOCTL_ATTR = struct.Struct("<HHHHQ")
RDMA_DRIVER_EFA = 17
OBJECT_CQ, METHOD_CQ_CREATE = 3, 0
CQ_HANDLE, CQ_CQE, CQ_USER_HANDLE, CQ_COMP_CHANNEL, CQ_COMP_VECTOR, CQ_RESP_CQE = 0, 1, 2, 3, 4, 6
CQ_BUFFER_VA, CQ_BUFFER_LENGTH = 8, 9
UHW_IN, UHW_OUT = 0x1000, 0x1001
OBJECT_DEVICE, METHOD_QUERY_PORT_SPEED = 0, 7
PORT_SPEED_PORT_NUM, PORT_SPEED_RESP = 0, 1

# efa-abi.h
CAPS_TX_BATCH, CAPS_MIN_SQ_WR = 1 << 0, 1 << 1
CQ_WITH_COMPLETION_CHANNEL, CQ_WITH_SGID = 1 << 0, 1 << 1
CQ_RESP_DB_OFF = 1 << 0
UCONTEXT_RESP = struct.Struct("<IIHHIHHH2x")  # efa_ibv_alloc_ucontext_resp
PD_RESP = struct.Struct("<IH2x")  # efa_ibv_alloc_pd_resp
CQ_CMD = struct.Struct("<IIHB5s")  # efa_ibv_create_cq
CQ_RESP = struct.Struct("<I4xQQH2xIQ")  # efa_ibv_create_cq_resp
EFA_QP_CMD = struct.Struct("<IIIIHB5s")  # efa_ibv_create_qp
EFA_QP_RESP = struct.Struct("<IIIIQQQQQHH4x")  # efa_ibv_create_qp_resp
RX_DESC = struct.Struct("<IIHHI")  # efa_io_rx_desc
RX_FIRST, RX_LAST = 1 << 30, 1 << 31
# GET_CONTEXT's driver data with every capability the efa provider of
# rdma-core 56 announces.
CAPS = struct.pack("<I4s", CAPS_TX_BATCH | CAPS_MIN_SQ_WR, b"\0" * 4)
# CREATE_AH, DESTROY_AH and struct ib_uverbs_ah_attr after its GRH's GID:
# flow label, source GID index, hop limit, traffic class, reserved; DLID,
# SL, source path bits, static rate, is_global, port, reserved.
CREATE_AH, DESTROY_AH = 5, 8
AH_ATTR = struct.Struct("<IBBBBHBBBBBB")


def ah_attr(gid, is_global=1, dlid=0, port=1):
    """struct ib_uverbs_ah_attr for destination GID `gid` (16 bytes)."""
    return gid + AH_ATTR.pack(0, 0, 64, 0, 0, dlid, 0, 0, 0, is_global, port, 0)


class Uverbs:
    """One open of the device's uverbs file: one user context once
    GET_CONTEXT succeeded."""

    def __init__(self, device):
        path = f"/sys/class/infiniband/{device}/device/infiniband_verbs"
        name = os.listdir(path)[0]
        self.fd = os.open(f"/dev/infiniband/{name}", os.O_RDWR)
        self.kept = []  # buffers the kernel may read through pointers

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def keep(self, data):
        """A buffer holding `data` that lives as long as this object: its
        address."""
        buf = ctypes.create_string_buffer(data, len(data))
        self.kept.append(buf)
        return ctypes.addressof(buf)

    def ioctl(self, obj, method, attrs):
        """Calls method `method` of object `obj` with `attrs`, a list of
        (attribute id, length, data): data is the value itself for
        handles, constants and inputs of at most 8 bytes, an address
        otherwise. Returns the data of each attribute afterwards (a new
        object's handle for its handle attribute)."""
        length = IOCTL_HDR.size + IOCTL_ATTR.size * len(attrs)
        buf = bytearray(IOCTL_HDR.pack(length, obj, method, len(attrs), 0, RDMA_DRIVER_EFA, 0))
        for attr_id, size, data in attrs:
            buf += IOCTL_ATTR.pack(attr_id, size, 0, 0, data)
        fcntl.ioctl(self.fd, RDMA_VERBS_IOCTL, buf, True)
        return [IOCTL_ATTR.unpack_from(buf, IOCTL_HDR.size + IOCTL_ATTR.size * i)[4] for i in range(len(attrs))]

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def cmd(self, command, core_in, resp_len, driver_in=b"", driver_out=0):
        """Sends a write() command whose core request `core_in` follows the
        response pointer; returns (core response, driver response)."""
        resp = ctypes.create_string_buffer(resp_len + driver_out)
        body = b""
        if resp_len or driver_out:
            body = struct.pack("<Q", ctypes.addressof(resp))
        body += core_in + driver_in
        hdr = struct.pack("<IHH", command, (8 + len(body)) // 4, (resp_len + driver_out) // 4)
        os.write(self.fd, hdr + body)
        raw = resp.raw
        return raw[:resp_len], raw[resp_len:]

    def get_context(self, driver_in=None):
        """GET_CONTEXT with `driver_in` (default: every capability, as the
        efa provider asks): the driver's response, UCONTEXT_RESP's fields."""
        if driver_in is None:
            driver_in = CAPS
        _, out = self.cmd(GET_CONTEXT, b"", 8, driver_in, UCONTEXT_RESP.size)
        return UCONTEXT_RESP.unpack(out)

    def alloc_pd(self, driver_in=b"", driver_out=PD_RESP.size):
        core, out = self.cmd(ALLOC_PD, b"", 4, driver_in, driver_out)
        return struct.unpack("<I", core)[0], out

    def dealloc_pd(self, handle):
        hdr = struct.pack("<IHH", DEALLOC_PD, 3, 0)
        os.write(self.fd, hdr + struct.pack("<I", handle))

    def create_comp_channel(self):
        """A completion channel: its file descriptor."""
        core, _ = self.cmd(CREATE_COMP_CHANNEL, b"", 4)
        return struct.unpack("<I", core)[0]

    def create_cq(self, cqe, driver_in, driver_out=CQ_RESP.size, buffer=None, channel=None, user_handle=0):
        """CQ creation through ioctl(), with its ring in `buffer` (address,
        length) if given, its events on completion channel `channel` (a
        file descriptor) if given: returns (handle, entries, driver
        response)."""
        resp_cqe = ctypes.create_string_buffer(4)
        out = ctypes.create_string_buffer(max(driver_out, 1))
        attrs = [
            (CQ_HANDLE, 0, 0),
            (CQ_CQE, 4, cqe),
            (CQ_USER_HANDLE, 8, user_handle),
            (CQ_COMP_VECTOR, 4, 0),
            (CQ_RESP_CQE, 4, ctypes.addressof(resp_cqe)),
        ]
        if driver_in:
            inline = len(driver_in) <= 8
            data = struct.unpack("<Q", driver_in.ljust(8, b"\0"))[0] if inline else self.keep(driver_in)
            attrs.append((UHW_IN, len(driver_in), data))
        if driver_out:
            attrs.append((UHW_OUT, driver_out, ctypes.addressof(out)))
        if channel is not None:
            attrs.append((CQ_COMP_CHANNEL, 0, channel))
        if buffer:
            attrs += [(CQ_BUFFER_VA, 8, buffer[0]), (CQ_BUFFER_LENGTH, 8, buffer[1])]
        handle = self.ioctl(OBJECT_CQ, METHOD_CQ_CREATE, attrs)[0]
        return handle, struct.unpack("<I", resp_cqe.raw)[0], out.raw[:driver_out]

    def destroy_cq(self, handle):
        self.cmd(DESTROY_CQ, struct.pack("<II", handle, 0), 8)

    def query_port_speed(self, port):
        """The core's QUERY_PORT_SPEED method: the port's rate in 100 Mb/s
        units (rdma-core 56 has no verb for it)."""
        speed = ctypes.create_string_buffer(8)
        # A constant attribute is always 8 bytes (UVERBS_ATTR_CONST_IN).
        self.ioctl(OBJECT_DEVICE, METHOD_QUERY_PORT_SPEED,
                   [(PORT_SPEED_PORT_NUM, 8, port), (PORT_SPEED_RESP, 8, ctypes.addressof(speed))])
        return struct.unpack("<Q", speed.raw)[0]

    def create_ah(self, pd, attr, response):
        """CREATE_AH in PD `pd` with `attr` (ah_attr()), its response (the
        core's 4 bytes and the driver's 8) written at address
        `response`."""
        body = struct.pack("<QQII", response, 0, pd, 0) + attr
        os.write(self.fd, struct.pack("<IHH", CREATE_AH, (8 + len(body)) // 4, 12 // 4) + body)

    def destroy_ah(self, handle):
        os.write(self.fd, struct.pack("<IHHI", DESTROY_AH, 3, 0, handle))

    def reg_mr(self, addr, length, pd, access):
        """Registers `length` bytes at `addr` in PD `pd`: (handle, lkey)."""
        core, _ = self.cmd(REG_MR, struct.pack("<QQQII", addr, length, addr, pd, access), 12)
        handle, lkey, _ = struct.unpack("<III", core)
        return handle, lkey

    def dereg_mr(self, handle):
        os.write(self.fd, struct.pack("<IHHI", DEREG_MR, 3, 0, handle))

    def create_ud_qp(self, pd, cq, qkey, rq_depth=16):
        """A UD QP on CQ `cq` for sends and receives, in RTS."""
        return UdQp(self, pd, cq, qkey, rq_depth)

    def mmap(self, length, offset, prot=mmap.PROT_READ):
        return mmap.mmap(self.fd, length, flags=mmap.MAP_SHARED, prot=prot, offset=offset)


class UdQp:
    """A UD QP driven byte by byte: created and moved to RTS with write()
    commands, its receives posted through its mapped RQ ring and doorbell
    (efa-abi.h's layout). Sends are not offered."""

    def __init__(self, u, pd, cq, qkey, rq_depth):
        self.u = u
        core, drv = u.cmd(CREATE_QP,
                          QP_CREATE.pack(0, pd, cq, cq, 0, 16, rq_depth, 1, 1, 0, 0, QPT_UD, 0, 0),
                          QP_CREATE_RESP.size,
                          EFA_QP_CMD.pack(0, rq_depth * RX_DESC.size, 16 * 64, 0, 0, 0, b"\0" * 5),
                          EFA_QP_RESP.size)
        self.handle, self.qpn = QP_CREATE_RESP.unpack(core)[:2]
        (_, self.rq_db_off, _, _, rq_key, rq_size, rq_db_key, _, _, _, self.recv_sub_cq) = EFA_QP_RESP.unpack(drv)
        self.modify(QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_QKEY, QPS_INIT, qkey=qkey, port=1)
        self.modify(QP_STATE, QPS_RTR)
        self.modify(QP_STATE | QP_SQ_PSN, QPS_RTS)
        self.rq_depth = rq_depth
        self.rq = u.mmap(rq_size, rq_key, mmap.PROT_READ | mmap.PROT_WRITE)
        self.rq_db = u.mmap(PAGE, rq_db_key, mmap.PROT_WRITE)
        self.posted = 0

    def modify(self, mask, state, qkey=0, port=0, sq_psn=0):
        no_dest = QP_DEST.pack(b"\0" * 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        body = no_dest + no_dest + QP_MODIFY.pack(self.handle, mask, qkey, 0, sq_psn, 0, 0, 0, 0, state,
                                                  0, 0, 0, 0, 0, 0, 0, port, 0, 0, 0, 0, 0)
        os.write(self.u.fd, struct.pack("<IHH", MODIFY_QP, (8 + len(body)) // 4, 0) + body)

    def post_recv(self, addr, length, lkey, req_id):
        """One receive into `length` bytes at `addr`: its descriptor in the
        RQ ring, then the producer counter in the RQ doorbell."""
        at = self.posted % self.rq_depth * RX_DESC.size
        self.rq[at:at + RX_DESC.size] = RX_DESC.pack(addr & 0xFFFFFFFF, addr >> 32, req_id, length,
                                                     lkey | RX_FIRST | RX_LAST)
        self.posted += 1
        struct.pack_into("<I", self.rq_db, self.rq_db_off, self.posted & 0xFFFF)

    def unmap(self):
        """Drops the mappings, which hold the context."""
        self.rq.close()
        self.rq_db.close()

    def close(self):
        self.unmap()
        self.u.cmd(DESTROY_QP, struct.pack("<II", self.handle, 0), 4)


def cq_cmd(sub_cqs, entry_size=32, flags=0, comp_mask=0, reserved=b"\0" * 5):
    """efa_ibv_create_cq, the driver's part of a CQ creation."""
    return CQ_CMD.pack(comp_mask, entry_size, sub_cqs, flags, reserved)


def anonymous_page(fill):
    """A page of this process filled with `fill`, and its address."""
    page = mmap.mmap(-1, PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    page.write(fill * PAGE)
    return page, ctypes.addressof(ctypes.c_char.from_buffer(page))


# Completion counters: the device's QUERY_COMP_CNTR_CAPS, the COMP_CNTR
# object's methods and the QP's ATTACH_COMP_CNTR (ib_user_ioctl_cmds.h,
# ib_user_ioctl_verbs.h), with efa-abi.h's buffer attributes.
OBJECT_QP, OBJECT_COMP_CNTR = 4, 19
METHOD_QUERY_COMP_CNTR_CAPS = 8
METHOD_QP_ATTACH_COMP_CNTR = 2
METHOD_CC_CREATE, METHOD_CC_DESTROY, METHOD_CC_MODIFY, METHOD_CC_READ = 0, 1, 2, 3
ENTRY_COMP, ENTRY_ERR = 0, 1
OP_SET, OP_INC = 0, 1
OPS_SEND, OPS_RECV, ALL_OPS = 1 << 0, 1 << 1, 0x3F
BUFFER_TYPE_VA = 1
BUFFER_DESC = struct.Struct("<IiIIQQ")  # struct ib_uverbs_buffer_desc
COMP_BUFFER, ERR_BUFFER = 0x1000, 0x1001  # enum efa_comp_cntr_create_attrs


def buffer(addr, length=8):
    """A buffer descriptor of `length` bytes of user memory at `addr`."""
    return BUFFER_DESC.pack(BUFFER_TYPE_VA, 0, 0, 0, addr, length)


class Counters:
    """Completion counters and their verbs on one uverbs context."""

    def __init__(self, u):
        self.u = u

    def caps(self):
        """(counters, largest value, operations)."""
        out = [ctypes.create_string_buffer(n) for n in (4, 8, 4)]
        self.u.ioctl(OBJECT_DEVICE, METHOD_QUERY_COMP_CNTR_CAPS,
                     [(i, len(b), ctypes.addressof(b)) for i, b in enumerate(out)])
        return (struct.unpack("<I", out[0].raw)[0], struct.unpack("<Q", out[1].raw)[0],
                struct.unpack("<I", out[2].raw)[0])

    def create(self, comp, err):
        """A counter whose values the device keeps in the buffers `comp`
        and `err` (descriptors, or None to leave one out): its handle."""
        attrs = [(0, 0, 0)]
        for attr_id, desc in ((COMP_BUFFER, comp), (ERR_BUFFER, err)):
            if desc is not None:
                attrs.append((attr_id, len(desc), self.u.keep(desc)))
        return self.u.ioctl(OBJECT_COMP_CNTR, METHOD_CC_CREATE, attrs)[0]

    def destroy(self, handle):
        self.u.ioctl(OBJECT_COMP_CNTR, METHOD_CC_DESTROY, [(0, 0, handle)])

    def modify(self, handle, entry, op, value):
        # Constant attributes are always 8 bytes (UVERBS_ATTR_CONST_IN).
        self.u.ioctl(OBJECT_COMP_CNTR, METHOD_CC_MODIFY, [(0, 0, handle), (1, 8, entry), (2, 8, op), (3, 8, value)])

    def read(self, handle, entry):
        out = ctypes.create_string_buffer(8)
        self.u.ioctl(OBJECT_COMP_CNTR, METHOD_CC_READ, [(0, 0, handle), (1, 8, entry), (2, 8, ctypes.addressof(out))])
        return struct.unpack("<Q", out.raw)[0]

    def attach(self, qp_handle, handle, ops):
        self.u.ioctl(OBJECT_QP, METHOD_QP_ATTACH_COMP_CNTR, [(0, 0, qp_handle), (1, 0, handle), (2, 8, ops)])
