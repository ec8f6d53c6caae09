# SPDX-License-Identifier: GPL-2.0
"""Memory the device was given (Documentation/refa.md): what refa hands the
device with an admin command stays allocated, and pinned, while the device
may still act on the command, that is until a reset has been acknowledged;
and when the reset fails, bus mastering goes off before anything the device
could reach is freed. The defects of issue 34 ("what is wrong today"), each
of which these tests caught on the code before their fixes:

- a REG_MR given up on for want of an answer: its page list was kept, but
  the region's pages were unpinned;
- a REG_MR, or the CREATE_EVENT_COUNTER of a completion counter, in flight
  when the device reported a fatal error (the admin queue dies, the
  command fails with ENODEV): the page list, the pages, the counter's
  memory were all released;
- SET_FEATURE HOST_INFO at probe given up on: its buffer was freed;
- a reset at unbind that the device never acknowledges: the admin queue,
  the AENQ and the readless-read buffer were freed with bus mastering
  still on.

efa-emu holds the command (late mode: neither executed nor answered) until
the test asks it to complete the command late; it then writes LATE-EMU at
the start of each buffer the command named, as a device acting on a
command the driver gave up on would. What the driver freed is read from a
trace of the device's coherent DMA buffers freed (dma:dma_free) and of
PCI command register writes (a kprobe event), in a tracing instance of
their own; what it unpinned from the process's VmPin.

Each test leaves the device bound and working, with the admin timeout it
found; the memory refa keeps goes at the next reset (the unbinds here),
and the harness's kmemleak scan says it went.
"""

import ctypes
import errno
import mmap
import os
import threading
import time

import pytest

import efa_emu
import uverbs as uv
import vmtest
from vmtest import MIB, PAGE, vm_pinned

DEVICES = 1

DRIVER = "/sys/bus/pci/drivers/refa"
ACCESS = 1  # IBV_ACCESS_LOCAL_WRITE
# CAPS.ADMIN_CMD_TO while a test waits for refa to give up: 1.5 s.
SHORT = 15
# BAR0 registers holding the queues' and the readless buffer's addresses.
QUEUE_REGISTERS = {"AQ": 0x10, "ACQ": 0x20, "AENQ": 0x38, "readless": 0x60}
TRACEFS = "/sys/kernel/tracing"
GROUP = "refa_mem"
PCI_COMMAND, PCI_COMMAND_MASTER = 4, 0x4


def wait_for(what, cond, seconds=vmtest.WAIT):
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not after {seconds} s"
        time.sleep(0.01)


class Binding:
    """The device under test, rebound when a test needs another admin
    timeout or a fresh device."""

    def __init__(self, device):
        self.bdf = vmtest.bdf_of(device)
        self.win = efa_emu.Window(self.bdf)
        self.index = self.win.read(efa_emu.INDEX)
        # The timeout the device had at its last probe, which no test here
        # changed yet.
        self.original = self.bound_with = self.win.read(efa_emu.ADMIN_TIMEOUT)

    def rebind(self, timeout=None):
        """Unbinds and binds the device, with CAPS.ADMIN_CMD_TO `timeout`
        (100 ms units; default: unchanged). Returns its RDMA name."""
        # Bound, even without an RDMA device (one that failed and stays
        # down).
        if vmtest.pci_driver_of(self.bdf) == "refa":
            vmtest.write_sysfs(f"{DRIVER}/unbind", self.bdf)
        if timeout is not None:
            self.win.write(efa_emu.ADMIN_TIMEOUT, timeout)
            self.bound_with = timeout
        vmtest.write_sysfs(f"{DRIVER}/bind", self.bdf)
        wait_for("the device after bind", lambda: vmtest.ib_of(self.bdf))
        return vmtest.ib_of(self.bdf)

    def with_timeout(self, timeout):
        """The RDMA name of the device, bound with admin timeout `timeout`."""
        if self.bound_with != timeout:
            return self.rebind(timeout)
        return vmtest.ib_of(self.bdf)

    def late(self):
        return self.win.late()


@pytest.fixture(scope="module")
def binding(device):
    b = Binding(device)
    # Held commands and fatal errors are injected faults; a device whose
    # reset never came keeps writing its AENQ after bus mastering went off.
    vmtest.emu_may_report("injected", "dma_failed", index=b.index)
    yield b
    b.win.clear()
    if b.bound_with != b.original or not vmtest.ib_of(b.bdf):
        b.rebind(b.original)


class Trace:
    """Coherent DMA buffers of the device freed (the dma:dma_free
    tracepoint), streaming mappings of it undone (dma:dma_unmap_phys: the
    rings refa allocates with alloc_pages_exact() and maps), and writes of a PCI command register (a kprobe event on
    pci_write_config_word()), in order, in a tracing instance of their own
    (the harness's callback counts use the global one, with tracing
    off)."""

    KPROBE = f"p:{GROUP}/cmd pci_write_config_word reg=%si:s32 val=%dx:x16"
    DMA = ("dma/dma_free", "dma/dma_unmap_phys")

    def __init__(self, bdf):
        self.dir = f"{TRACEFS}/instances/{GROUP}"
        self.remove()  # what a test that failed half-way may have left
        # Appended without the seek to the end that Python's "a" mode does,
        # which kprobe_events refuses (EINVAL).
        self.control(f"{TRACEFS}/kprobe_events", self.KPROBE)
        os.mkdir(self.dir)
        self.control(f"{self.dir}/events/{GROUP}/cmd/filter", f"reg == {PCI_COMMAND}")
        for event in self.DMA:
            self.control(f"{self.dir}/events/{event}/filter", f'device == "{bdf}"')
        for event in (f"{GROUP}/cmd", *self.DMA):
            self.control(f"{self.dir}/events/{event}/enable", "1")

    @staticmethod
    def control(path, text):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, f"{text}\n".encode())
        finally:
            os.close(fd)

    def events(self, since=0):
        """[("free", DMA address freed or unmapped) | ("cmd", value
        written), ...] so far, from the `since`th on."""
        out = []
        with open(f"{self.dir}/trace") as f:
            for line in f:
                if line.startswith("#"):
                    continue
                if (" dma_free: " in line or " dma_unmap_phys: " in line) and "dma_addr=" in line:
                    out.append(("free", int(line.split("dma_addr=")[1].split()[0], 16)))
                elif " cmd: " in line and "val=" in line:
                    out.append(("cmd", int(line.split("val=")[1].split()[0], 16)))
        return out[since:]

    def mark(self):
        """Where the events from now on start: addresses freed before may
        be given out again."""
        return len(self.events())

    def freed(self, since):
        return {v for k, v in self.events(since) if k == "free"}

    def close(self):
        for event in (f"{GROUP}/cmd", *self.DMA):
            self.control(f"{self.dir}/events/{event}/enable", "0")
        self.remove()

    def remove(self):
        if os.path.isdir(self.dir):
            os.rmdir(self.dir)
        try:
            self.control(f"{TRACEFS}/kprobe_events", f"-:{GROUP}/cmd")
        except FileNotFoundError:
            pass  # no such event


@pytest.fixture
def trace(binding):
    t = Trace(binding.bdf)
    yield t
    t.close()


def kept(device):
    """refa's count of buffers kept until a reset (None without it)."""
    try:
        return vmtest.fresh_counter(device, "mem_kept_until_reset")
    except FileNotFoundError:
        return None


def read_bar0(bdf, offsets):
    """32-bit registers of BAR0 (plain reads, which efa-emu answers)."""
    fd = os.open(f"/sys/bus/pci/devices/{bdf}/resource0", os.O_RDWR | os.O_SYNC)
    try:
        with mmap.mmap(fd, PAGE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
            values = []
            for off in offsets:
                # One 32-bit access: byte copies would not reach the model.
                reg = ctypes.c_uint32.from_buffer(m, off)
                values.append(reg.value)
                del reg
            return values
    finally:
        os.close(fd)


def small_pages(size):
    """`size` bytes of anonymous memory in 4 KiB pages (no huge page, so
    that a REG_MR of it needs a page list buffer): (the mapping, its
    address)."""
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        m.madvise(mmap.MADV_NOHUGEPAGE)
    except OSError:
        pass  # EINVAL: a kernel without transparent huge pages
    m.write(b"\0" * size)
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


def complete_late(binding, writes):
    """Has the model complete the held commands late; waits until it wrote
    `writes` buffers more."""
    held, _, before = binding.late()
    binding.win.complete_late()
    wait_for("the late writes", lambda: binding.late()[2] == before + writes)
    assert binding.late()[0] == 0, "commands still held"


# ---- a command in flight when the admin queue dies ---------------------------

class InFlight:
    """A verb that runs in a thread of this process (whose VmPin counts)
    while the test kills the device under it."""

    def __init__(self, fn, *args):
        self.result = None
        self.thread = threading.Thread(target=self.run, args=(fn, *args))
        self.thread.start()

    def run(self, fn, *args):
        self.result = vmtest.errno_of(fn, *args)[0]

    def join(self):
        self.thread.join(vmtest.WAIT)
        assert not self.thread.is_alive(), "the verb did not return"
        return self.result


def reg_mr_case(u, pd, sub_cqs):
    region, addr = small_pages(3 * MIB)
    return region, 0, 3 * MIB // 1024, 3 * MIB // 1024, lambda: u.reg_mr(addr, 3 * MIB, pd, ACCESS)


def comp_cntr_case(u, pd, sub_cqs):
    # Both values in one page: each is pinned on its own; the completion
    # value's counter, created first, is the one held.
    region, addr = uv.anonymous_page(b"\xff")
    cc = uv.Counters(u)
    kb = PAGE // 1024
    return region, 0, 2 * kb, kb, lambda: cc.create(uv.buffer(addr), uv.buffer(addr + 64))


def create_qp_case(u, pd, sub_cqs):
    # The QP's receive ring is kernel memory mapped for the device, not the
    # process's: no region to read the late write from, nothing pinned.
    cq, _, _ = u.create_cq(64, uv.cq_cmd(sub_cqs))
    return None, 0, 0, 0, lambda: u.create_ud_qp(pd, cq, vmtest.QKEY)


# opcode held: (its buffers the model writes late, the case), the case
# giving (the user region the command named or None, where in it the late
# write lands, kB the verb pins, kB kept pinned, the verb).
IN_FLIGHT = {
    "REG_MR": ("reg_mr", 2, reg_mr_case),
    "CREATE_EVENT_COUNTER": ("create_event_counter", 1, comp_cntr_case),
    "CREATE_QP": ("create_qp", 1, create_qp_case),
}


@pytest.fixture
def no_recovery(binding):
    """refa loaded with recovery off (refa.recovery=0): a device that
    reported a fatal error stays as it failed, its admin queue dead, until
    the test rebinds it; with recovery on, the reset would come (and the
    kept memory go, as it may then) before the test could look. The
    recovery's own order, memory after the reset, is test_recovery's."""
    vmtest.reload_refa("recovery=0")
    yield
    vmtest.reload_refa()


@pytest.mark.parametrize("case", IN_FLIGHT.values(), ids=IN_FLIGHT.keys())
def test_a_command_in_flight_when_the_device_dies_keeps_what_it_named(binding, no_recovery, trace,
                                                                       case):
    opcode, writes, make = case
    # Long enough that the fatal error, not the timeout, ends the wait.
    device = binding.with_timeout(0)
    u = uv.Uverbs(device)
    rebound = False
    try:
        sub_cqs = u.get_context()[2]
        pd, _ = u.alloc_pd()
        region, marker_at, pinned_by_verb, pinned_kept, verb = make(u, pd, sub_cqs)
        before, kept_before, since = vm_pinned(), kept(device), trace.mark()
        binding.win.hold(opcode)
        verb_thread = InFlight(verb)
        wait_for(f"{opcode} held", lambda: binding.late()[0] == 1)
        _, named, _ = binding.late()
        assert vm_pinned() == before + pinned_by_verb, "the verb's memory is not pinned while in flight"
        binding.win.write(efa_emu.COMMAND, efa_emu.COMMANDS["fatal"])
        code = verb_thread.join()
        assert code == errno.ENODEV, \
            f"errno {code} ({vmtest.name_of(code)}), expected ENODEV from the fatal error, not the timeout"
        assert named not in trace.freed(since), \
            f"{opcode}: memory it named ({named:#x}) freed while the device may still use it"
        assert vm_pinned() == before + pinned_kept, \
            f"VmPin {before} -> {vm_pinned()} kB, expected +{pinned_kept}: memory the device may still " \
            "write was unpinned"
        assert kept_before is not None and kept(device) == kept_before + 1, \
            "the kept memory was not counted (mem_kept_until_reset)"
        complete_late(binding, writes)
        assert named not in trace.freed(since), \
            f"{opcode}: memory it named ({named:#x}) freed before the late write"
        if region is not None:
            assert region[marker_at:marker_at + 8] == efa_emu.LATE_MARKER, \
                "the late write did not reach the memory still pinned"
            region.close()
        u.close()
        # The device is dead until reset; the reset frees what was kept.
        binding.rebind()
        rebound = True
        if region is None:
            # Kernel memory: the trace must see it go now, else it could
            # not have seen it go too early either.
            assert named in trace.freed(since), \
                f"{opcode}: memory it named ({named:#x}) not freed after the reset: the trace misses it"
    finally:
        u.close()
        if not rebound:
            binding.rebind()


# ---- a command given up on for want of an answer -----------------------------

def test_a_reg_mr_given_up_on_keeps_its_page_list_and_its_pages(binding, trace):
    device = binding.with_timeout(SHORT)
    u = uv.Uverbs(device)
    try:
        u.get_context()
        pd, _ = u.alloc_pd()
        # 768 pages: a page list in a buffer of its own.
        region, addr = small_pages(3 * MIB)
        before, kept_before, since = vm_pinned(), kept(device), trace.mark()
        binding.win.hold("reg_mr")
        vmtest.refused(errno.ETIMEDOUT, u.reg_mr, addr, 3 * MIB, pd, ACCESS)
        held, list_addr, _ = binding.late()
        assert held == 1 and list_addr, "the model holds no REG_MR"
        assert list_addr not in trace.freed(since), \
            "the page list was freed while the device may still read it"
        assert vm_pinned() == before + 3 * MIB // 1024, \
            f"VmPin {before} -> {vm_pinned()} kB: the region's pages were unpinned while the device " \
            "may still register and write them"
        assert kept_before is not None and kept(device) == kept_before + 1, \
            "the kept memory was not counted (mem_kept_until_reset)"
        # The device acts on the command at last: into memory still pinned.
        complete_late(binding, 2)
        assert region[:8] == efa_emu.LATE_MARKER, "the late write did not reach the region's pages"
        assert list_addr not in trace.freed(since), "the page list was freed before a reset"
        assert any("late admin completion" in line for line in vmtest.dmesg()), \
            "refa did not see the late completion"
        region.close()
    finally:
        u.close()


# ---- at probe: HOST_INFO -----------------------------------------------------

def test_host_info_given_up_on_at_probe_keeps_its_buffer(binding, trace):
    binding.with_timeout(SHORT)
    with open(f"{DRIVER}/unbind", "w") as f:
        f.write(binding.bdf)
    # Probe's SET_FEATUREs: AENQ_CONFIG, then HOST_INFO.
    binding.win.hold("set_feature", skip=1)
    mark = f"refa-test: host info {time.monotonic()}"
    vmtest.kmsg(mark)
    since = trace.mark()
    device = binding.rebind()
    held, buf, _ = binding.late()
    assert held == 1 and buf, "the model holds no HOST_INFO"
    assert any("could not pass host information: -110" in line for line in vmtest.log_since(mark)), \
        "probe did not give up on HOST_INFO"
    assert buf not in trace.freed(since), "the HOST_INFO buffer was freed while the device may still read it"
    assert kept(device) == 1, "the kept buffer was not counted (mem_kept_until_reset)"
    complete_late(binding, 1)
    # The device works; its next reset frees the buffer.
    u = uv.Uverbs(device)
    try:
        u.get_context()
        u.alloc_pd()
    finally:
        u.close()
    binding.rebind()
    assert buf in trace.freed(since), "the HOST_INFO buffer was not freed after the reset"


# ---- a reset that never comes ------------------------------------------------

def test_a_reset_that_fails_at_unbind_turns_bus_mastering_off_before_freeing(binding, trace):
    binding.with_timeout(SHORT)
    buffers = {}
    for name, off in QUEUE_REGISTERS.items():
        lo, hi = read_bar0(binding.bdf, (off, off + 4))
        buffers[name] = hi << 32 | lo
    assert all(buffers.values()), f"a queue without an address: {buffers}"
    # Hostile mode: RESET_IN_PROGRESS never rises.
    binding.win.write(efa_emu.HOSTILE, efa_emu.MALFORMATIONS.index("reset-stuck") + 1)
    mark = f"refa-test: reset stuck {time.monotonic()}"
    vmtest.kmsg(mark)
    since = trace.mark()
    with open(f"{DRIVER}/unbind", "w") as f:
        f.write(binding.bdf)
    binding.win.write(efa_emu.HOSTILE, 0)
    assert any("reset" in line and "failed" in line for line in vmtest.log_since(mark)), \
        "the reset at unbind did not fail"
    events = trace.events(since)
    master_off = next((i for i, (k, v) in enumerate(events)
                       if k == "cmd" and not v & PCI_COMMAND_MASTER), None)
    assert master_off is not None, f"bus mastering never went off: {events}"
    for name, addr in buffers.items():
        freed = next((i for i, (k, v) in enumerate(events) if k == "free" and v == addr), None)
        assert freed is not None, f"the {name} buffer ({addr:#x}) was not freed at unbind"
        assert freed > master_off, \
            f"the {name} buffer ({addr:#x}) was freed with bus mastering on, after a failed reset"
    binding.rebind()
