# SPDX-License-Identifier: GPL-2.0
"""Payloads end to end, the machinery of tests/vm/test_payload.py and
test_dma_boundary.py: known bytes moved through SRD send, UD send, RDMA
read, RDMA write and RDMA write with immediate, through the unmodified efa
provider (pyverbs), compared byte for byte at the far side, and the bytes
around every destination checked untouched.

The memory regions take each form of page list the driver builds (FORMS:
up to 4 pages inline in REG_MR, up to 4096 pages in one DMA buffer,
chained 4 KiB chunks beyond), at each form's edges, with starts inside a
page and ends in the middle of one: a page list in the wrong order, a
chunk link off by one or an offset lost in a page would move the right
amount of the wrong bytes, which no completion status shows. Transfers
cover whole regions and pieces at page and chunk boundaries. A mismatch
names the page that differs and, when the bytes came from elsewhere in the
source, where from (test_payload_compare.py shows the comparison catching
each).
"""

import ctypes
import mmap
import socket
import time

import pyverbs.enums as e
import pyverbs.providers.efa.efa_enums as efa_enums
import pyverbs.providers.efa.efadv as efa
from pyverbs.addr import AH, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr, QPInitAttrEx
from pyverbs.wr import SGE, RecvWR, SendWR

from vmtest import GRH, KIB, MIB, PAGE, QKEY, WAIT

CANARY = 0xEE
SRD_MSG = 8000  # below max_msg_sz (8928) of efa-emu and EFA devices
UD_MSG = 4000  # below the 4096-byte MTU

# (name, length, page offset of the start): each form of page list, and
# its edges. Pages = ceil((offset + length) / 4096).
FORMS = [
    ("inline-3-pages", 8 * KIB, 0x7B),
    ("inline-4-whole-pages", 16 * KIB, 0),
    ("one-buffer-5-pages", 16 * KIB + 1, 0),
    ("one-buffer-258-pages", MIB + 0x123, 0x321),
    ("one-buffer-4096-whole-pages", 16 * MIB, 0),
    ("chained-4097-pages", 16 * MIB + 1, 0),
    ("chained-8193-pages", 32 * MIB - 0x99, 0x5),
]


class Side:
    """One context on a device: a PD, a CQ, an SRD QP (extended post API:
    send, RDMA read, write, write with immediate) and a UD QP, in RTS."""

    def __init__(self, name):
        self.name = name
        self.ctx = efa.EfaContext(name=name)
        dv = self.ctx.query_efa_device()
        caps = dv.device_caps
        assert caps & efa_enums.EFADV_DEVICE_ATTR_CAPS_RDMA_READ, f"{name} offers no RDMA read"
        assert caps & efa_enums.EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE, f"{name} offers no RDMA write"
        self.max_rdma = dv.max_rdma_size
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 512)
        cap = QPCap(max_send_wr=64, max_recv_wr=64, max_send_sge=1, max_recv_sge=1)
        ops = (e.IBV_QP_EX_WITH_SEND | e.IBV_QP_EX_WITH_RDMA_READ | e.IBV_QP_EX_WITH_RDMA_WRITE
               | e.IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM)
        init = QPInitAttrEx(cap=cap, qp_type=e.IBV_QPT_DRIVER, scq=self.cq, rcq=self.cq, pd=self.pd,
                            comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                            send_ops_flags=ops)
        attr = efa.EfaQPInitAttr()
        attr.driver_qp_type = efa_enums.EFADV_QP_DRIVER_TYPE_SRD
        self.srd = efa.SRDQPEx(self.ctx, init, attr)
        self.ud = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=self.cq, rcq=self.cq, cap=cap))
        for qp in (self.srd, self.ud):
            a = QPAttr(port_num=1)
            a.qkey, a.pkey_index, a.sq_psn = QKEY, 0, 0
            qp.to_rts(a)
        self.gid = self.ctx.query_gid(1, 0)
        self.ahs = {}
        # Receives that only consume a WQE (RDMA write with immediate).
        self.scratch = MR(self.pd, PAGE, e.IBV_ACCESS_LOCAL_WRITE)

    def ah(self, other):
        if other.name not in self.ahs:
            gr = GlobalRoute(dgid=other.gid, sgid_index=0)
            self.ahs[other.name] = AH(self.pd, attr=AHAttr(gr=gr, is_global=1, port_num=1))
        return self.ahs[other.name]

    def poll(self, wr_id, what):
        """The completion of `wr_id` on this side's CQ (in order: one
        operation is in flight at a time)."""
        deadline = time.monotonic() + WAIT
        while True:
            n, wcs = self.cq.poll()
            if n:
                wc = wcs[0]
                assert wc.status == e.IBV_WC_SUCCESS, \
                    f"{what}: completion status {wc.status} (vendor error {wc.vendor_err}) on {self.name}"
                assert wc.wr_id == wr_id, f"{what}: completion of wr_id {wc.wr_id:#x}, expected {wr_id:#x}"
                return wc
            assert time.monotonic() < deadline, f"{what}: no completion on {self.name} within {WAIT} s"

    def close(self):
        for obj in list(self.ahs.values()) + [self.srd, self.ud, self.scratch, self.cq, self.pd, self.ctx]:
            obj.close()


class Region:
    """`length` bytes starting `offset` bytes into a page, between guard
    pages, registered for local and remote access; every byte outside
    the region holds CANARY."""

    ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE

    def __init__(self, side, length, offset):
        self.length = length
        self.start = PAGE + offset
        total = PAGE + (offset + length + PAGE - 1) // PAGE * PAGE + PAGE
        self.map = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.map.write(bytes([CANARY]) * total)
        self._anchor = ctypes.c_char.from_buffer(self.map)
        self.base = ctypes.addressof(self._anchor)
        # (No side: test_payload_compare.py, which copies bytes itself.)
        self.mr = MR(side.pd, length, self.ACCESS, address=self.base + self.start) if side else None

    def addr(self, at):
        return self.base + self.start + at

    def fill(self, data):
        assert len(data) == self.length, "fill with the wrong length"
        self.map[self.start:self.start + self.length] = data

    def clear(self, at=0, n=None):
        """CANARY over the region, or over `n` bytes at `at` and the 64
        on each side (what expect() looks at: cheaper than the whole of a
        32 MiB region under TCG)."""
        if n is None:
            lo, hi = self.start, self.start + self.length
        else:
            lo, hi = max(0, self.start + at - 64), min(len(self.map), self.start + at + n + 64)
        self.map[lo:hi] = bytes([CANARY]) * (hi - lo)

    def expect(self, at, data, what, source=None, written_from=None):
        """The region holds `data` at `at`, and CANARY in the 64 bytes
        before (before `written_from`, if the device wrote more than
        `data`: a UD receive's GRH area) and after, inside the region or
        in a guard page."""
        lo, hi = self.start + at, self.start + at + len(data)
        got = self.map[lo:hi]
        if got != data:
            raise AssertionError(f"{what}: {diagnose(got, data, at, source)}")
        if written_from is not None:
            lo = self.start + written_from
        before = self.map[max(0, lo - 64):lo]
        after = self.map[hi:hi + 64]
        assert before == bytes([CANARY]) * len(before), f"{what}: bytes before the destination changed"
        assert after == bytes([CANARY]) * len(after), f"{what}: bytes after the destination changed"

    def close(self):
        if self.mr:
            self.mr.close()
        del self._anchor
        self.map.close()


def diagnose(got, want, at, source):
    """Where `got` (read back at region offset `at`) first differs from
    `want`, and what it holds there instead: the canary (never written),
    or bytes of the source from elsewhere (a page list in the wrong
    order, a lost offset)."""
    for i in range(0, len(want), PAGE):
        g, w = got[i:i + PAGE], want[i:i + PAGE]
        if g == w:
            continue
        first = i + next(k for k in range(len(w)) if g[k] != w[k])
        where = f"first difference at byte {at + first} of the region ({first} into the transfer)"
        seen = got[first:first + 64]
        if seen == bytes([CANARY]) * len(seen):
            return f"{where}: never written (still the canary)"
        if source is not None and len(seen) >= 16:
            found = source.find(seen)
            if found >= 0:
                return f"{where}: holds the bytes of source offset {found} (expected those of offset {first})"
        return f"{where}: holds bytes found nowhere in the source"
    return "lengths differ"


def pieces(length, offset, size):
    """(at, n) transfers of up to `size` bytes inside a region: the start,
    across the first page boundary, across the boundaries of pages 511/512
    and 4095/4096 (chunk edges) when the region reaches them, the end."""
    out = [(0, min(size, length))]
    first_edge = PAGE - offset
    for edge in [first_edge, first_edge + 511 * PAGE, first_edge + 4095 * PAGE]:
        if edge < length:
            at = max(0, edge - size // 2)
            out.append((at, min(size, length - at)))
    out.append((max(0, length - size), min(size, length)))
    seen, unique = set(), []
    for p in out:
        if p not in seen:
            seen.add(p)
            unique.append(p)
    return unique


class Pair:
    """Checks from side `a` to side `b` (their QPs talk through efa-emu)."""

    def __init__(self, a, b, label):
        self.a, self.b, self.label = a, b, label
        self.wr = 0

    def next_id(self):
        self.wr += 1
        return self.wr

    def post(self, side, verb, what, *args, lkey, addr, length, remote):
        wr_id = self.next_id()
        qp = side.srd
        qp.wr_start()
        qp.wr_id = wr_id
        qp.wr_flags = e.IBV_SEND_SIGNALED
        getattr(qp, verb)(*args)
        qp.wr_set_sge(SGE(addr, length, lkey))
        qp.wr_set_ud_addr(side.ah(remote), remote.srd.qp_num, QKEY)
        qp.wr_complete()
        return side.poll(wr_id, what)

    def rdma_write(self, src, s_at, dst, d_at, n, what, imm=None):
        """`n` bytes of src (on a) at s_at into dst (on b) at d_at."""
        if imm is not None:
            recv_id = self.next_id()
            scratch = self.b.scratch
            self.b.srd.post_recv(RecvWR(wr_id=recv_id, num_sge=1, sg=[SGE(scratch.buf, 64, scratch.lkey)]))
            self.post(self.a, "wr_rdma_write_imm", what, dst.mr.rkey, dst.addr(d_at), imm,
                      lkey=src.mr.lkey, addr=src.addr(s_at), length=n, remote=self.b)
            wc = self.b.poll(recv_id, what + " (the target's completion)")
            # pyverbs sends the immediate in network order (htobe32) and
            # hands the completion's __be32 back as it is.
            got = socket.ntohl(wc.imm_data)
            assert wc.opcode == e.IBV_WC_RECV_RDMA_WITH_IMM and got == imm, \
                f"{what}: target completion opcode {wc.opcode} imm {got:#x}, expected {imm:#x}"
        else:
            self.post(self.a, "wr_rdma_write", what, dst.mr.rkey, dst.addr(d_at),
                      lkey=src.mr.lkey, addr=src.addr(s_at), length=n, remote=self.b)

    def rdma_read(self, dst, d_at, src, s_at, n, what):
        """`n` bytes of src (on b) at s_at read into dst (on a) at d_at."""
        self.post(self.a, "wr_rdma_read", what, src.mr.rkey, src.addr(s_at),
                  lkey=dst.mr.lkey, addr=dst.addr(d_at), length=n, remote=self.b)

    def srd_send(self, src, s_at, dst, d_at, n, what):
        recv_id = self.next_id()
        self.b.srd.post_recv(RecvWR(wr_id=recv_id, num_sge=1, sg=[SGE(dst.addr(d_at), n, dst.mr.lkey)]))
        self.post(self.a, "wr_send", what, lkey=src.mr.lkey, addr=src.addr(s_at), length=n, remote=self.b)
        wc = self.b.poll(recv_id, what + " (the receive)")
        assert wc.byte_len == n, f"{what}: received {wc.byte_len} bytes, sent {n}"

    def ud_send(self, src, s_at, dst, d_at, n, what):
        """The receive buffer starts at d_at: the GRH area, then the
        payload at d_at + 40."""
        recv_id, send_id = self.next_id(), self.next_id()
        self.b.ud.post_recv(RecvWR(wr_id=recv_id, num_sge=1,
                                   sg=[SGE(dst.addr(d_at), GRH + n, dst.mr.lkey)]))
        wr = SendWR(wr_id=send_id, opcode=e.IBV_WR_SEND, num_sge=1,
                    sg=[SGE(src.addr(s_at), n, src.mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_ud(self.a.ah(self.b), self.b.ud.qp_num, QKEY)
        self.a.ud.post_send(wr)
        self.a.poll(send_id, what)
        wc = self.b.poll(recv_id, what + " (the receive)")
        assert wc.byte_len == GRH + n, f"{what}: received {wc.byte_len} bytes, expected {GRH + n}"

    def rdma_write_checks(self, src, dst, data, offset):
        """RDMA write: the whole region, then pieces at the edges, each from
        another offset of the source."""
        length, tag = src.length, self.label
        src.fill(data)
        n = min(length, self.a.max_rdma)
        dst.clear()
        self.rdma_write(src, 0, dst, 0, n, f"{tag}: RDMA write of {n} bytes")
        dst.expect(0, data[:n], f"{tag}: RDMA write of {n} bytes", data)
        for at, m in pieces(length, offset, 3 * PAGE + 17):
            s_at = (at + 4099) % (length - m + 1)
            dst.clear(at, m)
            self.rdma_write(src, s_at, dst, at, m, f"{tag}: RDMA write {m}@{at}")
            dst.expect(at, data[s_at:s_at + m], f"{tag}: RDMA write {m}@{at} from {s_at}", data)

    def rdma_write_imm_checks(self, src, dst, data):
        """RDMA write with immediate: the whole region."""
        length, tag = src.length, self.label
        src.fill(data)
        n = min(length, self.a.max_rdma)
        dst.clear()
        self.rdma_write(src, 0, dst, 0, n, f"{tag}: RDMA write with immediate", imm=0x5A000000 | length & 0xFFFFFF)
        dst.expect(0, data[:n], f"{tag}: RDMA write with immediate", data)

    def rdma_read_checks(self, src, dst, data, offset):
        """RDMA read: other bytes in the far region (b's), read into a's."""
        length, tag = src.length, self.label
        n = min(length, self.a.max_rdma)
        other = data[length // 3:] + data[:length // 3]
        dst.fill(other)
        src.clear()
        self.rdma_read(src, 0, dst, 0, n, f"{tag}: RDMA read of {n} bytes")
        src.expect(0, other[:n], f"{tag}: RDMA read of {n} bytes", other)
        for at, m in pieces(length, offset, 3 * PAGE + 17):
            s_at = (at + 8191) % (length - m + 1)
            src.clear(at, m)
            self.rdma_read(src, at, dst, s_at, m, f"{tag}: RDMA read {m}@{at}")
            src.expect(at, other[s_at:s_at + m], f"{tag}: RDMA read {m}@{at} from {s_at}", other)

    def send_checks(self, verb, src, dst, data, offset):
        """Sends (verb "SRD send" or "UD send"): messages from and into the
        edges."""
        length, tag = src.length, self.label
        size, send = {"SRD send": (SRD_MSG, self.srd_send), "UD send": (UD_MSG, self.ud_send)}[verb]
        src.fill(data)
        room = GRH if verb == "UD send" else 0
        for at, m in pieces(length - room, offset, size):
            s_at = (at + 333) % (length - m + 1)
            dst.clear(at, m + room)
            send(src, s_at, dst, at, m, f"{tag}: {verb} {m}@{at}")
            dst.expect(at + room, data[s_at:s_at + m], f"{tag}: {verb} {m}@{at} from {s_at}", data,
                       written_from=at)
