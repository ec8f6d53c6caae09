# SPDX-License-Identifier: GPL-2.0
"""dma-buf memory regions and the efa MR query on refa, through libibverbs
and the efa provider's libefa (ctypes: pyverbs wraps dma-bufs only for
GPUs):

- a udmabuf (memfd pages exported as a dma-buf, /dev/udmabuf) registered
  with ibv_reg_dmabuf_mr() at several offsets and lengths: keys, then
  deregistration; a bad descriptor, a range past the buffer's end and rights
  the device cannot enforce are refused with an errno, and the PD is free
  on the device afterwards (efa-emu refuses to free a PD an MR still uses);
- efadv_query_mr() of a plain and a dma-buf MR reports the interconnect ids
  the device returned at registration (efa-emu: all three paths valid, ids
  equal to the device's index, so refa_1 proves they come from the
  device).
"""

import ctypes
import errno
import fcntl
import mmap
import os
import struct

import pytest

import vmtest
from vmtest import MIB, PAGE

IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_READ = 1, 2, 4
IBV_ACCESS_REMOTE_ATOMIC = 8
ACCESS = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ
UDMABUF_CREATE = 0x40187542  # _IOW('u', 0x42, struct udmabuf_create)
F_ADD_SEALS, F_SEAL_SHRINK = 1033, 0x0002
MFD_ALLOW_SEALING = 0x0002
VALIDITY_ALL = 0x7  # EFADV_MR_ATTR_VALIDITY_{RECV,RDMA_READ,RDMA_RECV}_IC_ID
SIZE = 8 * MIB


class MrAttr(ctypes.Structure):
    _fields_ = [("comp_mask", ctypes.c_uint64), ("ic_id_validity", ctypes.c_uint16),
                ("recv_ic_id", ctypes.c_uint16), ("rdma_read_ic_id", ctypes.c_uint16),
                ("rdma_recv_ic_id", ctypes.c_uint16)]


class IbvMr(ctypes.Structure):
    # struct ibv_mr: context, pd, addr, length, handle, lkey, rkey.
    _fields_ = [("context", ctypes.c_void_p), ("pd", ctypes.c_void_p), ("addr", ctypes.c_void_p),
                ("length", ctypes.c_size_t), ("handle", ctypes.c_uint32), ("lkey", ctypes.c_uint32),
                ("rkey", ctypes.c_uint32)]


ibv = ctypes.CDLL("libibverbs.so.1", use_errno=True)
efa = ctypes.CDLL("libefa.so.1", use_errno=True)
libc = ctypes.CDLL(None, use_errno=True)
ibv.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
ibv.ibv_get_device_list.argtypes = [ctypes.POINTER(ctypes.c_int)]
ibv.ibv_get_device_name.restype = ctypes.c_char_p
ibv.ibv_get_device_name.argtypes = [ctypes.c_void_p]
ibv.ibv_open_device.restype = ctypes.c_void_p
ibv.ibv_open_device.argtypes = [ctypes.c_void_p]
ibv.ibv_close_device.argtypes = [ctypes.c_void_p]
ibv.ibv_free_device_list.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
ibv.ibv_alloc_pd.restype = ctypes.c_void_p
ibv.ibv_alloc_pd.argtypes = [ctypes.c_void_p]
ibv.ibv_dealloc_pd.argtypes = [ctypes.c_void_p]
ibv.ibv_reg_mr.restype = ctypes.POINTER(IbvMr)
ibv.ibv_reg_mr.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
ibv.ibv_reg_dmabuf_mr.restype = ctypes.POINTER(IbvMr)
ibv.ibv_reg_dmabuf_mr.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint64,
                                  ctypes.c_int, ctypes.c_int]
ibv.ibv_dereg_mr.argtypes = [ctypes.POINTER(IbvMr)]
efa.efadv_query_mr.argtypes = [ctypes.POINTER(IbvMr), ctypes.POINTER(MrAttr), ctypes.c_uint32]
libc.memfd_create.argtypes = [ctypes.c_char_p, ctypes.c_uint]


class Device:
    """A device opened through libibverbs, with a PD and an 8 MiB
    udmabuf (memfd pages exported as a dma-buf)."""

    def __init__(self, name):
        assert os.path.exists("/dev/udmabuf"), "no /dev/udmabuf (CONFIG_UDMABUF)"
        self.ctx = open_device(name)
        self.pd = ibv.ibv_alloc_pd(self.ctx)
        assert self.pd, "ibv_alloc_pd"
        self.fd, self.view = udmabuf(SIZE)
        self.view.write(b"\x3c" * SIZE)
        self.mrs = []
        self.kept = []

    def reg_dmabuf(self, offset, length, access=ACCESS, fd=None):
        """ibv_reg_dmabuf_mr() on the udmabuf (or `fd`): (MR, 0) or (None,
        errno). The MR is deregistered by close()."""
        ctypes.set_errno(0)
        mr = ibv.ibv_reg_dmabuf_mr(self.pd, offset, length, offset, self.fd if fd is None else fd, access)
        if not mr:
            return None, ctypes.get_errno()
        self.mrs.append(mr)
        return mr, 0

    def reg_plain(self, length):
        """ibv_reg_mr() of `length` bytes of anonymous memory."""
        buf, addr = vmtest.anonymous(length, b"\1")
        self.kept.append(buf)
        mr = ibv.ibv_reg_mr(self.pd, addr, length, ACCESS)
        assert mr, f"ibv_reg_mr: errno {ctypes.get_errno()}"
        self.mrs.append(mr)
        return mr

    def close(self):
        """Deregisters every MR and frees the PD, which must work."""
        for mr in self.mrs:
            assert ibv.ibv_dereg_mr(mr) == 0, "ibv_dereg_mr"
        assert ibv.ibv_dealloc_pd(self.pd) == 0, f"ibv_dealloc_pd: errno {ctypes.get_errno()}"
        ibv.ibv_close_device(self.ctx)
        os.close(self.fd)


def open_device(name):
    n = ctypes.c_int()
    devs = ibv.ibv_get_device_list(ctypes.byref(n))
    try:
        for i in range(n.value):
            if ibv.ibv_get_device_name(devs[i]).decode() == name:
                ctx = ibv.ibv_open_device(devs[i])
                assert ctx, f"ibv_open_device({name}): errno {ctypes.get_errno()}"
                return ctx
    finally:
        ibv.ibv_free_device_list(devs)
    pytest.fail(f"no device {name}")


def udmabuf(size):
    """A dma-buf of `size` bytes of memfd pages, and the memfd mapped."""
    memfd = libc.memfd_create(b"refa-mr-extras", MFD_ALLOW_SEALING)
    assert memfd >= 0, f"memfd_create: errno {ctypes.get_errno()}"
    os.ftruncate(memfd, size)
    fcntl.fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK)
    dev = os.open("/dev/udmabuf", os.O_RDWR)
    try:
        # struct udmabuf_create: memfd, flags, offset, size.
        # A mutable buffer makes ioctl() return the call's result: the fd.
        req = bytearray(struct.pack("<IIQQ", memfd, 0, 0, size))
        fd = fcntl.ioctl(dev, UDMABUF_CREATE, req, True)
    finally:
        os.close(dev)
    view = mmap.mmap(memfd, size)
    os.close(memfd)
    return fd, view


@pytest.fixture
def dev(device):
    d = Device(device)
    yield d
    d.close()


DMABUF_MRS = [(0, PAGE), (PAGE, 3 * PAGE), (5, 2 * MIB), (0, SIZE)]


@pytest.mark.parametrize("offset,length", DMABUF_MRS, ids=[f"{n}-bytes-at-{o}" for o, n in DMABUF_MRS])
def test_dmabuf_mr(dev, offset, length):
    mr, err = dev.reg_dmabuf(offset, length)
    assert mr, f"errno {err}"
    assert mr.contents.length == length, f"dma-buf MR length {mr.contents.length}"


def test_dmabuf_mrs_have_distinct_lkeys(dev):
    mrs = [dev.reg_dmabuf(offset, length)[0] for offset, length in DMABUF_MRS]
    assert all(mrs), "a dma-buf MR failed"
    assert len({mr.contents.lkey for mr in mrs}) == len(mrs), "two dma-buf MRs share an lkey"


@pytest.mark.parametrize("kind", ["plain", "dma-buf"])
def test_query_mr_reports_the_devices_interconnect_ids(device, emu, dev, kind):
    if kind == "plain":
        mr = dev.reg_plain(4 * PAGE)
    else:
        mr, err = dev.reg_dmabuf(PAGE, 3 * PAGE)
        assert mr, f"errno {err}"
    attr = MrAttr()
    ret = efa.efadv_query_mr(mr, ctypes.byref(attr), ctypes.sizeof(attr))
    assert ret == 0, f"efadv_query_mr: {ret}"
    ids = (attr.recv_ic_id, attr.rdma_read_ic_id, attr.rdma_recv_ic_id)
    index = emu.index
    assert attr.ic_id_validity == VALIDITY_ALL and ids == (index,) * 3, \
        f"validity {attr.ic_id_validity:#x}, ids {ids}, expected all valid, {index}"


# The kernel's answers (dma_buf_get: EINVAL for a file that is no dma-buf),
# never "any error": a refusal by the provider or a wrong errno must fail.
REFUSED = {
    "no-dma-buf": (0, PAGE, ACCESS, "/dev/null", errno.EINVAL),
    "past-the-buffers-end": (SIZE - PAGE, 2 * PAGE, ACCESS, None, errno.EINVAL),
    "zero-length": (0, 0, ACCESS, None, errno.EINVAL),
    "atomic-rights": (0, PAGE, ACCESS | IBV_ACCESS_REMOTE_ATOMIC, None, errno.EOPNOTSUPP),
}


@pytest.mark.parametrize("case", REFUSED.values(), ids=REFUSED.keys())
def test_dmabuf_mr_refused(dev, case):
    offset, length, access, path, expected = case
    fd = os.open(path, os.O_RDONLY) if path else None
    try:
        mr, err = dev.reg_dmabuf(offset, length, access, fd)
    finally:
        if fd is not None:
            os.close(fd)
    assert mr is None and err == expected, f"errno {err}, expected {errno.errorcode[expected]}"


def test_every_mr_deregistered_and_the_pd_freed_on_the_device(device):
    mark = f"refa-mr-extras: start {device}"
    vmtest.kmsg(mark)
    d = Device(device)
    for offset, length in DMABUF_MRS:
        mr, err = d.reg_dmabuf(offset, length)
        assert mr, f"errno {err}"
    d.reg_plain(4 * PAGE)
    d.reg_dmabuf(0, 0)  # refused: nothing to release
    d.close()
    errors = vmtest.refa_failures_since(mark)
    assert not errors, f"the device kept something: {errors}"
