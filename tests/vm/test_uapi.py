# SPDX-License-Identifier: GPL-2.0
"""The driver's uAPI at the byte level: malformed driver data (udata) and
mmap cookies, sent through the uverbs write() interface of one RDMA device
(uverbs.py), the way a buggy or hostile process could; rdma-core only ever
sends well-formed requests. CQ creation goes through the ioctl() method,
which has no write() form for drivers that, like efa, only create user CQs.

Each refusal asserts the errno, and that the driver's error counter of the
verb counted it once (or not at all when the core refuses it before the
driver sees it). The capability handshake (a context from userspace
lacking a capability the device needs is refused) needs a device that
needs one (efa-emu --limit max_tx_batch=N or min_sq_depth=N): elsewhere it
is skipped, and --require-handshake fails unless some device under test
ran it.
"""

import ctypes
import errno
import mmap
import struct

import pytest

import uverbs as uv
import vmtest
from vmtest import PAGE, counter, fresh_counter

CAPS = uv.CAPS_TX_BATCH | uv.CAPS_MIN_SQ_WR
ERROR_COUNTERS = ("create_cq_err", "mmap_err")
# Each device's error counters before this run's first refusal on it, and
# the refusals the tests made since, for test_statistics.
BASELINE, REFUSED = {}, {}


def baseline(device):
    if device not in BASELINE:
        BASELINE[device] = {name: counter(device, name) for name in ERROR_COUNTERS}
        REFUSED[device] = dict.fromkeys(ERROR_COUNTERS, 0)
    return BASELINE[device]


def refused(device, expected, fn, *args, counter_name=None, counted=True):
    """fn(*args) must fail with errno `expected`, counted once in the
    driver's error counter `counter_name`, or (`counted` False: the core
    refuses it before the driver sees it) not at all."""
    baseline(device)
    before = fresh_counter(device, counter_name) if counter_name else 0
    vmtest.refused(expected, fn, *args)
    if counter_name:
        grew = fresh_counter(device, counter_name) - before
        assert grew == int(counted), f"{counter_name} grew by {grew}, expected {int(counted)}" + (
            "" if counted else " (the core refuses it; the driver never sees it)")
        REFUSED[device][counter_name] += int(counted)


def context(device):
    u = uv.Uverbs(device)
    return u, u.get_context(struct.pack("<I4s", CAPS, b"\0" * 4))


def cq_refused(device, expected, u, *args, counted=True):
    refused(device, expected, u.create_cq, *args, counter_name="create_cq_err", counted=counted)


def mmap_refused(device, expected, u, *args):
    refused(device, expected, u.mmap, *args, counter_name="mmap_err")


# ---- the user context ---------------------------------------------------------

# The one verb that is lenient, as in efa.ko (the referee): request fields
# the kernel does not know, reserved bytes and whatever follows the request
# it knows, are ignored, so that newer userspace keeps working, and the
# response is what the kernel understood: the same as for the request
# without them. Every other verb refuses them (below).
LENIENT = {
    "nonzero-reserved": struct.pack("<I4s", CAPS, b"\1\0\0\0"),
    "longer-with-nonzero-tail": struct.pack("<I4sI", CAPS, b"\0" * 4, 1),
    "nonzero-reserved-and-64-more-bytes": struct.pack("<I4s", CAPS, b"\xff" * 4) + b"\xa5" * 64,
}


@pytest.mark.parametrize("request_bytes", LENIENT.values(), ids=LENIENT.keys())
def test_alloc_ucontext_ignores_what_it_does_not_know(device, request_bytes):
    with uv.Uverbs(device) as u:
        base = u.get_context(struct.pack("<I4s", CAPS, b"\0" * 4))
    errors = fresh_counter(device, "alloc_ucontext_err")
    with uv.Uverbs(device) as u:
        resp = u.get_context(request_bytes)
    assert resp == base, "not answered as the request without the unknown bytes"
    grew = fresh_counter(device, "alloc_ucontext_err") - errors
    assert grew == 0, f"alloc_ucontext_err grew by {grew} for a request that succeeded"


def test_alloc_ucontext_accepts_unknown_capability_bits(device):
    # Capability bits say what userspace can handle: bits from a newer
    # rdma-core are no reason to refuse it.
    with uv.Uverbs(device) as u:
        comp_mask = u.get_context(struct.pack("<I4s", 0xffffffff, b"\0" * 4))[0]
    assert comp_mask == 0, "alloc_ucontext response comp_mask"


def needs_capability(device):
    with uv.Uverbs(device) as u:
        _, _, _, _, _, max_tx_batch, min_sq_wr, _ = u.get_context()
    return bool(max_tx_batch or min_sq_wr)


LACKING = {
    # What it does not know is ignored; what it knows is still checked.
    "lacking-a-capability": struct.pack("<I4s", 0, b"\0" * 4),
    "lacking-a-capability-with-unknown-fields": struct.pack("<I4sI", 0, b"\1\0\0\0", 1),
}


@pytest.mark.parametrize("request_bytes", LACKING.values(), ids=LACKING.keys())
def test_handshake_refuses_userspace_lacking_a_capability(device, request_bytes):
    if not needs_capability(device):
        pytest.skip(f"{device} needs no capability (max_tx_batch 0, min_sq_wr 0)")
    with uv.Uverbs(device) as u:
        vmtest.refused(errno.EOPNOTSUPP, u.get_context, request_bytes)


def test_handshake_ran(request, devices):
    """With --require-handshake, some device under test needs a capability
    (efa-emu --limit max_tx_batch=N), so that the handshake ran."""
    if not request.config.getoption("require_handshake"):
        pytest.skip("--require-handshake not given")
    assert any(needs_capability(d) for d in devices), \
        f"no device of {devices} needs a capability, so the handshake never ran"


# ---- protection domains ---------------------------------------------------------

def test_alloc_pd_refuses_driver_input(device):
    u, _ = context(device)
    with u:
        vmtest.refused(errno.EOPNOTSUPP, u.alloc_pd, b"\1\0\0\0")


def test_alloc_pd_takes_all_zero_driver_input(device):
    u, _ = context(device)
    with u:
        pd, _ = u.alloc_pd(b"\0" * 8)
        u.dealloc_pd(pd)


def test_alloc_pd_without_room_for_the_driver_response(device):
    # Old userspace with no room for the response still gets its PD.
    u, _ = context(device)
    with u:
        pd, _ = u.alloc_pd(driver_out=0)
        u.dealloc_pd(pd)


# ---- completion queues: malformed requests ------------------------------------------

# (entries, request(sub_cqs), errno, counted by the driver)
MALFORMED_CQ = {
    "short-request": (16, lambda n: uv.cq_cmd(n)[:8], errno.EINVAL, True),
    "nonzero-tail": (16, lambda n: uv.cq_cmd(n) + b"\0\0\0\1", errno.EOPNOTSUPP, True),
    "unknown-comp-mask-bit": (16, lambda n: uv.cq_cmd(n, comp_mask=1), errno.EOPNOTSUPP, True),
    "nonzero-reserved-field": (16, lambda n: uv.cq_cmd(n, reserved=b"\0\0\0\0\1"), errno.EINVAL, True),
    "unknown-flag": (16, lambda n: uv.cq_cmd(n, flags=0x80), errno.EINVAL, True),
    "bad-entry-size": (16, lambda n: uv.cq_cmd(n, entry_size=24), errno.EINVAL, True),
    "source-gids-in-16-byte-entries":
        (16, lambda n: uv.cq_cmd(n, entry_size=16, flags=uv.CQ_WITH_SGID), errno.EINVAL, True),
    "wrong-number-of-sub-cqs": (16, lambda n: uv.cq_cmd(n + 1), errno.EINVAL, True),
    # The core refuses zero entries itself: the driver never counts it.
    "zero-entries": (0, lambda n: uv.cq_cmd(n), errno.EINVAL, False),
    "more-entries-than-the-device-has": (1 << 30, lambda n: uv.cq_cmd(n), errno.EINVAL, True),
}


@pytest.mark.parametrize("case", MALFORMED_CQ.values(), ids=MALFORMED_CQ.keys())
def test_create_cq_refuses(device, case):
    entries, request_bytes, expected, counted = case
    u, ctx = context(device)
    with u:
        cq_refused(device, expected, u, entries, request_bytes(ctx[2]), counted=counted)


# ---- completion queues: mappings -------------------------------------------------

class MappedCq:
    """A CQ of 64 entries with source GIDs, its ring and doorbell mapped."""

    def __init__(self, device):
        self.u, ctx = context(device)
        self.sub_cqs = ctx[2]
        self.handle, self.cqe, out = self.u.create_cq(64, uv.cq_cmd(self.sub_cqs, entry_size=32,
                                                                    flags=uv.CQ_WITH_SGID))
        self.comp_mask, self.ring_key, self.ring_size, self.cq_idx, self.db_off, self.db_key = \
            uv.CQ_RESP.unpack(out)
        self.ring = self.u.mmap(self.ring_size, self.ring_key)
        self.doorbell = self.u.mmap(PAGE, self.db_key, mmap.PROT_WRITE)

    def close(self):
        self.ring.close()
        self.doorbell.close()
        self.u.close()


@pytest.fixture
def mapped_cq(device):
    c = MappedCq(device)
    yield c
    c.close()


def test_cq_ring_and_doorbell_map(mapped_cq):
    c = mapped_cq
    assert c.cqe == 64, f"CQ has {c.cqe} entries, asked for 64"
    assert c.comp_mask & uv.CQ_RESP_DB_OFF, "no doorbell offset in the CQ response"
    assert c.ring_size >= 64 * 32 * c.sub_cqs and c.ring_size % PAGE == 0, f"ring size {c.ring_size}"
    assert c.db_off < PAGE, f"doorbell offset {c.db_off} is not within a page"
    assert c.ring[:] == b"\0" * c.ring_size, "a new CQ ring is not zeroed"


def other_context(device):
    return context(device)[0]


# (what: mmap(c, other context) that must fail with EINVAL)
BAD_MMAPS = {
    "ring-with-a-shorter-length": lambda c, o: (c.u, c.ring_size - PAGE or 2 * PAGE, c.ring_key),
    "doorbell-with-a-longer-length": lambda c, o: (c.u, 2 * PAGE, c.db_key, mmap.PROT_WRITE),
    "unknown-key": lambda c, o: (c.u, PAGE, max(c.ring_key, c.db_key) + (1 << 20) * PAGE),
    "another-contexts-ring-key": lambda c, o: (o, c.ring_size, c.ring_key),
    "another-contexts-doorbell-key": lambda c, o: (o, PAGE, c.db_key, mmap.PROT_WRITE),
}


@pytest.mark.parametrize("case", BAD_MMAPS.values(), ids=BAD_MMAPS.keys())
def test_mmap_refuses(device, mapped_cq, case):
    other = other_context(device)
    with other:
        u, *args = case(mapped_cq, other)
        mmap_refused(device, errno.EINVAL, u, *args)


def test_mmap_refuses_a_destroyed_cqs_key(device, mapped_cq):
    c = mapped_cq
    c.u.destroy_cq(c.handle)
    mmap_refused(device, errno.EINVAL, c.u, c.ring_size, c.ring_key)


def test_old_mappings_outlive_the_cq_harmlessly(mapped_cq):
    # Mappings made before the destroy stay safe to use: the ring pages are
    # the process's until it unmaps them.
    c = mapped_cq
    c.u.destroy_cq(c.handle)
    assert len(c.ring[:]) == c.ring_size, "reading the ring after destroy"


def test_cq_with_16_byte_entries(device):
    """The context creates CQs of the other entry size."""
    u, ctx = context(device)
    with u:
        handle, _, _ = u.create_cq(16, uv.cq_cmd(ctx[2], entry_size=16))
        u.destroy_cq(handle)


# ---- completion queues: rings in user memory (CQ_WITH_EXT_MEM) ------------------------

@pytest.fixture
def one_page():
    # One page: 16 entries of 32 bytes per sub-CQ fit, and a page is
    # contiguous for the device.
    m, addr = vmtest.anonymous(PAGE, b"\xa5")
    yield addr
    m.close()


def test_cq_on_one_page_of_user_memory(device, one_page):
    u, ctx = context(device)
    with u:
        handle, cqe, out = u.create_cq(16, uv.cq_cmd(ctx[2]), buffer=(one_page, PAGE))
        comp_mask, ring_key, ring_size, cq_idx, db_off, db_key = uv.CQ_RESP.unpack(out)
        assert cqe == 16, f"CQ on user memory has {cqe} entries, asked for 16"
        assert ring_key == 0 and ring_size == 0, \
            f"CQ on user memory offers a ring mapping ({ring_key:#x}, {ring_size})"
        assert comp_mask & uv.CQ_RESP_DB_OFF, "no doorbell for a CQ on user memory"
        u.mmap(PAGE, db_key, mmap.PROT_WRITE).close()
        u.destroy_cq(handle)


def test_cq_on_a_buffer_smaller_than_the_ring_refused(device, one_page):
    u, ctx = context(device)
    with u:
        sub_cqs = ctx[2]
        cq_refused(device, errno.EINVAL, u, 16, uv.cq_cmd(sub_cqs), uv.CQ_RESP.size,
                   (one_page, 16 * 32 * sub_cqs // 2))


def small_ring_entries(sub_cqs):
    """8 entries a sub-CQ: a ring of less than a page."""
    if 8 * 32 * sub_cqs >= PAGE:
        pytest.skip(f"8 entries of {sub_cqs} sub-CQs fill a page: no case to make")
    return 8


# As efa.ko: the buffer covers the ring rounded up to whole pages.
def test_cq_on_a_buffer_of_the_rings_size_below_a_page_refused(device, one_page):
    u, ctx = context(device)
    with u:
        sub_cqs = ctx[2]
        n = small_ring_entries(sub_cqs)
        cq_refused(device, errno.EINVAL, u, n, uv.cq_cmd(sub_cqs), uv.CQ_RESP.size, (one_page, n * 32 * sub_cqs))


def test_cq_on_a_buffer_of_the_rings_whole_pages(device, one_page):
    u, ctx = context(device)
    with u:
        sub_cqs = ctx[2]
        handle, _, _ = u.create_cq(small_ring_entries(sub_cqs), uv.cq_cmd(sub_cqs), buffer=(one_page, PAGE))
        u.destroy_cq(handle)


def page_frames(addr, pages):
    """The physical page frames behind `pages` pages of this process's
    memory at `addr` (root reads them from /proc/self/pagemap)."""
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(addr // PAGE * 8)
        entries = struct.unpack(f"<{pages}Q", f.read(8 * pages))
    assert all(e >> 63 for e in entries), "pages of the CQ buffer are not present"
    return [e & ((1 << 55) - 1) for e in entries]


def test_cq_on_physically_scattered_user_memory_refused(device):
    # 128 entries of 32 bytes per sub-CQ take 4 pages; find 4 pages of a
    # bigger buffer that are not physically contiguous (touched in reverse,
    # they rarely are), so the device could not write them as one block.
    u, ctx = context(device)
    with u:
        sub_cqs = ctx[2]
        pages = 32
        many = mmap.mmap(-1, pages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(many))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(pages * PAGE), 14)  # MADV_NOHUGEPAGE
        for i in reversed(range(pages)):
            many[i * PAGE] = 1
        frames = page_frames(addr, pages)
        span = 128 * 32 * sub_cqs // PAGE
        start = next((i for i in range(pages - span + 1)
                      if frames[i:i + span] != list(range(frames[i], frames[i] + span))), None)
        assert start is not None, f"{pages} pages touched in reverse are physically contiguous"
        cq_refused(device, errno.EINVAL, u, 128, uv.cq_cmd(sub_cqs), uv.CQ_RESP.size,
                   (addr + start * PAGE, span * PAGE))


# ---- the port ---------------------------------------------------------------------

def test_query_port_speed_is_the_ports_rate(device):
    # sysfs shows the rate query_port reports, e.g. "100 Gb/sec (4X EDR)".
    with open(f"/sys/class/infiniband/{device}/ports/1/rate") as f:
        rate_gbps = int(f.read().split()[0])
    u, _ = context(device)
    with u:
        speed = u.query_port_speed(1)
    assert speed == rate_gbps * 10, f"QUERY_PORT_SPEED says {speed} x 100 Mb/s, sysfs rate {rate_gbps} Gb/s"


def test_query_port_speed_of_port_2_refused(device):
    u, _ = context(device)
    with u:
        vmtest.refused(errno.EINVAL, u.query_port_speed, 2)


# ---- statistics (last: it counts what the tests above refused) ------------------------

def test_statistics(device):
    # Each refused request above counted once, whether the driver or the
    # core's udata helpers refused it: exactly as many as were refused.
    start = baseline(device)
    for name in ERROR_COUNTERS:
        grew = counter(device, name) - start[name]
        assert grew == REFUSED[device][name], \
            f"{name} grew by {grew}, expected {REFUSED[device][name]} (one per refused request)"
    submitted, completed = counter(device, "submitted_cmds"), counter(device, "completed_cmds")
    assert submitted > 0 and completed <= submitted, f"admin commands: {submitted} submitted, {completed} completed"
    assert counter(device, "keep_alive_rcvd") > 0, "no keep-alive counted"
    # Port counters come from the device (GET_STATS); nothing was sent yet.
    assert counter(device, "tx_pkts", 1) == 0, "packets counted before any traffic"
