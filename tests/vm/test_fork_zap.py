# SPDX-License-Identifier: GPL-2.0
"""A child forked while the RDMA core cannot track its copy of a device
mapping never reaches another process's send queue (run by
tests/vm/run-refa-checks; issue 31, item 4).

fork() duplicates each mapping (dup_mmap()) and calls its open operation
before it copies the page tables; device mappings (VM_PFNMAP) have their
entries copied. The core's open operation, rdma_umap_open(), tracks the
child's copy so that it can zap it when the device goes away; when it
cannot (its allocation fails, or it races a device removal that holds the
file's hw_destroy_rwsem), it "zaps" the new mapping, which has no entries
yet, and leaves it untracked: the copy of the entries that follows is the
child's for good. For a QP's send queue that means: the child's copy
holds no reference, so the QP is destroyed on the device when the parent
destroys it and unmaps its own copy, the device gives the pages to the
next QP, maybe another process's, and the child writes into its queue.

Here the allocation in rdma_umap_open() fails on purpose (failslab,
limited to that function's stack and to this process), which is the path
an unbind racing the fork takes. refa marks its device mappings
VM_DONTCOPY: a child gets no copy of them, tracked or not. Before that,
the child had a copy and the victim's new send queue held its canary.
"""

import ctypes
import mmap
import os
import select
import struct
import time

import pytest

import efa_emu
import uverbs as uv
import vmtest

DEVICES = 1

PAGE = mmap.PAGESIZE
FAILSLAB = "/sys/kernel/debug/failslab"
CANARY = b"FORKED-CHILD-CANARY!"


def function_range(name):
    """[start, end) of kernel function `name` (the next symbol's address
    ends it), from /proc/kallsyms."""
    syms = []
    with open("/proc/kallsyms") as f:
        for line in f:
            addr, _, sym = line.split()[:3]
            syms.append((int(addr, 16), sym))
    syms.sort()
    for i, (addr, sym) in enumerate(syms):
        if sym == name:
            return addr, next(a for a, _ in syms[i + 1:] if a > addr)
    pytest.fail(f"no {name} in /proc/kallsyms")


def failslab_read(key):
    with open(f"{FAILSLAB}/{key}") as f:
        return f.read().strip()


def failslab_write(settings):
    for k, v in settings.items():
        with open(f"{FAILSLAB}/{k}", "w") as f:
            f.write(str(v))


def make_it_fail(v):
    with open("/proc/self/make-it-fail", "w") as f:
        f.write(str(v))


def mapped(addr):
    """Whether `addr` is in one of this process's mappings."""
    with open("/proc/self/maps") as f:
        for line in f:
            a, b = (int(x, 16) for x in line.split()[0].split("-"))
            if a <= addr < b:
                return True
    return False


class Pipe:
    def __init__(self):
        self.r, self.w = os.pipe()

    def send(self, s):
        os.write(self.w, s.encode() + b"\n")

    def recv(self, timeout=120):
        deadline = time.monotonic() + timeout
        data = b""
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.r], [], [], left)[0]:
                return ""
            chunk = os.read(self.r, 256)
            if not chunk:
                return ""
            data += chunk
        return data.decode().strip()


class Client:
    """A user context with a PD and a CQ, and UD QPs on them."""

    def __init__(self, device):
        self.u = uv.Uverbs(device)
        sub_cqs = self.u.get_context()[2]
        self.pd, _ = self.u.alloc_pd()
        self.cq, _, _ = self.u.create_cq(64, uv.cq_cmd(sub_cqs))

    def create_qp(self):
        """A QP and its send queue mapped: (handle, the mapping)."""
        core, drv = self.u.cmd(
            uv.CREATE_QP,
            uv.QP_CREATE.pack(0, self.pd, self.cq, self.cq, 0, 16, 16, 1, 1, 0, 0, uv.QPT_UD, 0, 0),
            uv.QP_CREATE_RESP.size,
            uv.EFA_QP_CMD.pack(0, 16 * uv.RX_DESC.size, 16 * 64, 0, 0, 0, b"\0" * 5),
            uv.EFA_QP_RESP.size)
        resp = uv.EFA_QP_RESP.unpack(drv)
        llq_off, llq_key = resp[3], resp[8]
        length = (llq_off + 16 * 64 + PAGE - 1) // PAGE * PAGE
        return uv.QP_CREATE_RESP.unpack(core)[0], self.u.mmap(length, llq_key, mmap.PROT_READ | mmap.PROT_WRITE)

    def destroy_qp(self, qp):
        self.u.cmd(uv.DESTROY_QP, struct.pack("<II", qp, 0), 4)


@pytest.fixture
def objects(device):
    """The device's live QPs (efa-emu's control window)."""
    win = efa_emu.Window(vmtest.bdf_of(device))
    assert win.read(efa_emu.VERSION) >= 4, "this efa-emu does not count objects"
    return lambda: win.read(efa_emu.LIVE_QPS)


@pytest.fixture
def fork_through_the_zap_path():
    """fork() with the slab allocations made with rdma_umap_open() on the
    stack failing, only in this process, once: the child runs `child` and
    the fixture returns (its pid, whether the allocation failed: it is
    not made when the child gets no copy to open). The
    settings are put back after the fork (fail-nth, which later tests use,
    obeys the stack filter too)."""
    start, end = function_range("rdma_umap_open")
    keys = ("ignore-gfp-wait", "verbose", "task-filter", "stacktrace-depth", "require-start",
            "require-end", "reject-start", "reject-end", "interval", "times", "probability")
    saved = {k: failslab_read(k) for k in keys}

    def fork(child):
        failslab_write({"ignore-gfp-wait": "N", "verbose": 0, "task-filter": "Y", "stacktrace-depth": 32,
                        "require-start": start, "require-end": end, "reject-start": 0, "reject-end": 0,
                        "interval": 1, "times": 1, "probability": 100})
        make_it_fail(1)
        pid = os.fork()
        if pid == 0:
            make_it_fail(0)
            try:
                child()
            finally:
                os._exit(0)
        make_it_fail(0)
        # One failure allowed: none left if rdma_umap_open()'s allocation
        # failed.
        struck = failslab_read("times") == "0"
        failslab_write({"probability": 0})
        failslab_write(saved)
        return pid, struck
    yield fork
    make_it_fail(0)
    failslab_write({"probability": 0})
    failslab_write(saved)


def test_a_child_forked_through_the_cores_zap_path_never_reaches_another_send_queue(
        device, objects, fork_through_the_zap_path):
    base = objects()
    c = Client(device)
    qp, llq = c.create_qp()
    at = ctypes.addressof(ctypes.c_char.from_buffer(llq))
    to_child, from_child = Pipe(), Pipe()

    def child():
        has = mapped(at)
        from_child.send("mapped" if has else "absent")
        if to_child.recv() == "write" and has:
            # The child's copy, at the same address as the parent's was.
            llq[:len(CANARY) * 8] = CANARY * 8
            from_child.send("written")
        else:
            from_child.send("nothing")
        to_child.recv()

    pid, struck = fork_through_the_zap_path(child)
    has_copy = from_child.recv() == "mapped"

    # The parent gives its QP up as the efa provider does: unmapped, then
    # destroyed.
    llq.close()
    c.destroy_qp(qp)
    time.sleep(0.2)
    gone = objects() == base

    # A victim's QP, and what the child writes through its copy.
    v = Client(device)
    vqp, vllq = v.create_qp()
    to_child.send("write")
    wrote = from_child.recv() == "written"
    seen = CANARY in bytes(vllq[:len(CANARY) * 8])
    to_child.send("bye")
    os.waitpid(pid, 0)
    vllq.close()
    v.destroy_qp(vqp)
    v.u.close()
    c.u.close()

    assert not has_copy, \
        f"the child has a copy of the send queue, {'untracked (the allocation failed)' if struck else 'tracked'}: " \
        f"the QP was {'destroyed' if gone else 'kept'} on the device under it"
    assert not seen, "the victim's new send queue holds the child's canary" + \
        (", written through its copy" if wrote else "")
    assert wait_for(lambda: objects() == base), f"{objects() - base} QPs left on the device"


def wait_for(cond, seconds=30):
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.1)
    return cond()
