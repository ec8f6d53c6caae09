# SPDX-License-Identifier: GPL-2.0
"""A memory region whose pages are physically contiguous across a 4 GiB
line (run by tests/vm/run-refa-limits, with the VM's memory laid out
for it, on one device).

ib_umem_get() merges physically contiguous user pages into scatter-gather
segments as long as the device's maximum segment size allows (EFA drivers
set it to 4 GiB - 1) and never splits them at the device's segment
boundary, which the DMA layer defaults to 4 GiB. A region that straddles
such a line is then mapped as one segment that crosses the boundary the
device declared, which DMA-API debugging reports (and an IOMMU backend may
refuse). An EFA device takes page lists, never segments, so it has no
boundary: refa declares none. efa.ko keeps the default, and the same
region makes DMA-API debugging warn under it (the harness runs it as a
referee, in expected-failure mode, to prove that this test builds the
case).

The test finds a 4 GiB line inside guest RAM and faults in anonymous
memory until the frames on either side of it are this process's (their
page frame numbers from /proc/self/pagemap), wherever they landed; then
it moves the two pages next to each other with mremap(), which keeps
their frames, registers a region across them, and moves known bytes
through it on one device: RDMA write into it, RDMA read out of it, an SRD
send from it and one into it, each compared byte for byte with the bytes
around it untouched. The VM boots with enough RAM for such a line and a
movable zone that begins a little below it, where user pages come from
first.
"""

import ctypes
import mmap
import os
import random
import struct

import pytest
from pyverbs.mr import MR

import payload
import vmtest
from vmtest import MIB, PAGE

LINE = 4 << 30
CHUNK = 64 * MIB
# Leave the guest this much when searching, so that the search ends with
# a clear failure, not the OOM killer.
RESERVE = 384 * MIB
PFN_MASK = (1 << 55) - 1
PRESENT = 1 << 63


def lines_in_ram():
    """The 4 GiB multiples with RAM on both sides, from /proc/iomem (root
    sees real addresses)."""
    ranges = []
    with open("/proc/iomem") as f:
        for line in f:
            if line.startswith(" ") or not line.rstrip().endswith(": System RAM"):
                continue
            lo, hi = line.split(" : ")[0].split("-")
            ranges.append((int(lo, 16), int(hi, 16)))
    found = []
    for lo, hi in ranges:
        line = (lo + LINE - 1) // LINE * LINE
        while line <= hi:
            if line - PAGE >= lo and line + PAGE - 1 <= hi:
                found.append(line)
            line += LINE
    return ranges, found


def available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


libc = ctypes.CDLL(None, use_errno=True)
libc.mremap.restype = ctypes.c_void_p
libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
MREMAP_MAYMOVE, MREMAP_FIXED = 1, 2
MAP_FAILED = ctypes.c_void_p(-1).value


def frames_of(addr, pages):
    """The page frame number behind each of `pages` pages at `addr`, all
    of which must be present."""
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(addr // PAGE * 8)
        raw = f.read(pages * 8)
    assert len(raw) == pages * 8, "short read of /proc/self/pagemap"
    entries = struct.unpack(f"<{pages}Q", raw)
    assert all(v & PRESENT for v in entries), "a page just written is not present"
    pfns = [v & PFN_MASK for v in entries]
    assert any(pfns), "/proc/self/pagemap hides page frame numbers (not root?)"
    return pfns


class Mapping:
    """`size` bytes of anonymous memory, every page faulted in with the
    canary."""

    def __init__(self, size):
        self.map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._anchor = ctypes.c_char.from_buffer(self.map)
        self.base = ctypes.addressof(self._anchor)
        ctypes.memset(self.base, payload.CANARY, size)

    def close(self):
        del self._anchor
        self.map.close()


def move_page(src, dst):
    """Moves the page at `src`, frame and all, to `dst` (mremap keeps the
    frame: it moves page table entries)."""
    got = libc.mremap(src, PAGE, PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, dst)
    if got == MAP_FAILED or got != dst:
        raise AssertionError(f"mremap of {src:#x} to {dst:#x}: {os.strerror(ctypes.get_errno())}")


class Straddle(payload.Region):
    """`length` bytes at `offset` into page 1 of `window` (pages 1 and 2
    are the two frames around the line, 0 and 3 guards), registered in
    `side`'s PD: a payload.Region over memory put together, not
    allocated."""

    def __init__(self, side, window, offset, length):
        self.length = length
        self.start = PAGE + offset
        self.map = window.map
        self.base = window.base
        self.mr = MR(side.pd, length, self.ACCESS, address=self.base + self.start)

    def close(self):
        self.mr.close()


def zones():
    with open("/proc/zoneinfo") as f:
        text = f.read()
    out = []
    for part in text.split("Node ")[1:]:
        name = part.split("\n")[0]
        start = [ln.split()[-1] for ln in part.split("\n") if "start_pfn:" in ln]
        out.append(f"{name.strip()} from pfn {int(start[0]):#x}" if start else name.strip())
    return "; ".join(out)


def find_pages():
    """Two virtually adjacent pages whose frames lie either side of a
    4 GiB line. The kernel decides which frames a process gets, not their
    virtual order: fault in memory until both frames are this process's,
    wherever they are, then move them next to each other."""
    ranges, lines = lines_in_ram()
    assert lines, "no 4 GiB line with RAM on both sides in the guest (System RAM: " \
        + ", ".join(f"{lo:#x}-{hi:#x}" for lo, hi in ranges) + "): boot it with more memory"
    line = lines[0]
    below, above = line // PAGE - 1, line // PAGE
    print(f"4 GiB line inside RAM: {line:#x}; zones: {zones()}")
    # Page cache may hold the frames; dropping it returns them.
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    window = Mapping(4 * PAGE)
    chunks, found = [], {}
    try:
        while len(found) < 2:
            room = available()
            if room < RESERVE + CHUNK:
                raise AssertionError(f"faulted in {len(chunks) * CHUNK // MIB} MiB without getting frames "
                           f"{below:#x} and {above:#x} (got {sorted(hex(p) for p in found)}; "
                           f"MemAvailable {room // MIB} MiB; zones: {zones()})")
            chunk = Mapping(CHUNK)
            chunks.append(chunk)
            for i, pfn in enumerate(frames_of(chunk.base, CHUNK // PAGE)):
                if pfn in (below, above):
                    found[pfn] = chunk.base + i * PAGE
        print(f"frames {below:#x} and {above:#x} are this process's after "
            f"{len(chunks) * CHUNK // MIB} MiB")
        move_page(found[below], window.base + PAGE)
        move_page(found[above], window.base + 2 * PAGE)
        pfns = frames_of(window.base + PAGE, 2)
        assert pfns == [below, above], f"after mremap the pages are frames {pfns}, " \
            f"expected {below:#x} and {above:#x}"
    except BaseException:
        window.close()
        raise
    finally:
        for c in chunks:
            c.close()
    return window, line


@pytest.fixture(scope="module")
def window():
    """The two pages either side of the line, put together (find_pages),
    and the line."""
    w, line = find_pages()
    yield w, line
    w.close()


@pytest.fixture(scope="module")
def pair(request):
    """Two sides (contexts) on the device under test."""
    names = request.config.getoption("device") or vmtest.ib_devices()
    assert len(names) == 1, f"test_dma_boundary wants one device (--device NAME), not {names}"
    a, b = payload.Side(names[0]), payload.Side(names[0])
    yield payload.Pair(a, b, f"{names[0]}->{names[0]}")
    a.close()
    b.close()


# Starts inside the page before the line and ends inside the one after it:
# one segment of two pages, with an offset and a partial page.
OFFSET, LENGTH = 0x321, 2 * PAGE - 0x321 - 0x123


@pytest.fixture(scope="module")
def regions(window, pair):
    """The region across the line registered in both PDs (as target and as
    source), and an ordinary region on each side."""
    w, line = window
    on_a = Straddle(pair.a, w, OFFSET, LENGTH)
    on_b = Straddle(pair.b, w, OFFSET, LENGTH)
    normal_a = payload.Region(pair.a, LENGTH, OFFSET)
    normal_b = payload.Region(pair.b, LENGTH, OFFSET)
    yield on_a, on_b, normal_a, normal_b, f"across {line:#x}"
    for obj in (on_a, on_b, normal_a, normal_b):
        obj.close()


def test_a_region_across_the_line_registers_on_each_pd(window, regions):
    w, line = window
    on_a, on_b = regions[:2]
    assert on_a.mr.lkey != on_b.mr.lkey, "the two registrations share an lkey"
    # Registered (and so pinned), the pages still hold the frames either
    # side of the line.
    assert frames_of(w.base + PAGE, 2) == [line // PAGE - 1, line // PAGE], "the pages moved off the line"


def test_rdma_write_into_the_region(pair, regions):
    on_a, on_b, normal_a, normal_b, tag = regions
    data = random.Random(0x4C1E).randbytes(LENGTH)
    normal_a.fill(data)
    on_b.clear()
    pair.rdma_write(normal_a, 0, on_b, 0, LENGTH, f"{tag}: RDMA write into it")
    on_b.expect(0, data, f"{tag}: RDMA write into it", data)


def test_rdma_read_out_of_the_region(pair, regions):
    on_a, on_b, normal_a, normal_b, tag = regions
    other = random.Random(0x4C1F).randbytes(LENGTH)
    on_b.fill(other)
    normal_a.clear()
    pair.rdma_read(normal_a, 0, on_b, 0, LENGTH, f"{tag}: RDMA read out of it")
    normal_a.expect(0, other, f"{tag}: RDMA read out of it", other)


def test_srd_send_from_the_region(pair, regions):
    on_a, on_b, normal_a, normal_b, tag = regions
    n = min(LENGTH, payload.SRD_MSG)
    third = random.Random(0x4C20).randbytes(LENGTH)
    on_a.fill(third)
    normal_b.clear()
    pair.srd_send(on_a, 0, normal_b, 0, n, f"{tag}: SRD send from it")
    normal_b.expect(0, third[:n], f"{tag}: SRD send from it", third)


def test_srd_send_into_the_region(pair, regions):
    on_a, on_b, normal_a, normal_b, tag = regions
    n = min(LENGTH, payload.SRD_MSG)
    data = random.Random(0x4C21).randbytes(LENGTH)
    normal_a.fill(data)
    on_b.clear()
    pair.srd_send(normal_a, 0, on_b, 0, n, f"{tag}: SRD send into it")
    on_b.expect(0, data[:n], f"{tag}: SRD send into it", data)
