# SPDX-License-Identifier: GPL-2.0
"""Steer an efa-emu device from inside the guest, through its control window,
or from the host, through its control socket: the module behind
tools/efa-emu/guest/efa-emu-inject (its command line) and the guest tests'
`emu` fixture (tests/vm/conftest.py).

The window is an emulator-only page of 32-bit registers at offset 0x1000 of
BAR0 (NOT part of the EFA interface; see Documentation/efa-emu.md). It is a
test feature: efa-emu turns it on only with --test-control (tools/vm/run
does); off, MAGIC reads "EEMD" and this tool says so and fails. This maps
BAR0 through /sys/bus/pci/devices/BDF/resource0, which works while a driver
is bound. Run as root.

  efa-emu-inject [-d DEV] inject OPCODE COUNT [fail [STATUS] | timeout | late [STATUS]] [after SKIP]
                                             COUNT commands OPCODE fail, time
                                             out, or are held for a late
                                             completion, after SKIP (0..7) that run
  efa-emu-inject [-d DEV] complete-late      complete the held commands late:
                                             write LATE-EMU into the buffers they
                                             named, then their completions
  efa-emu-inject [-d DEV] late               held commands, the first buffer the
                                             last one named, buffers written late
  efa-emu-inject [-d DEV] clear              disarm every injected fault
  efa-emu-inject [-d DEV] status             print the window's registers
  efa-emu-inject [-d DEV] objects            the QPs, CQs, PDs and UARs the device
                                             has, and the LLQ pages in use
  efa-emu-inject [-d DEV] admin-timeout MS   CAPS admin timeout (100..1500, 0:
                                             driver default), read at probe/reset
  efa-emu-inject [-d DEV] keep-alive MS      keep-alive period (0: none)
  efa-emu-inject [-d DEV] net-loss PPM       drop arriving packets (parts per million)
  efa-emu-inject [-d DEV] net-delay US       hold arriving packets up to US microseconds
  efa-emu-inject [-d DEV] net-reorder PPM    hold arriving packets 1 ms more (reorders)
  efa-emu-inject [-d DEV] net-dup PPM        deliver arriving packets twice
  efa-emu-inject [-d DEV] fatal|warning|notification   raise a device event
  efa-emu-inject [-d DEV] fatal-silent       a fatal error without its event: only
                                             DEV_STS says so
  efa-emu-inject [-d DEV] exit               the model process exits at once
  efa-emu-inject [-d DEV] hostile NAME [seed S] [after K] [count C]
                                             hostile mode: the device misbehaves
                                             on purpose (Documentation/efa-emu.md)
  efa-emu-inject [-d DEV] hostile off        hostile mode off
  efa-emu-inject [-d DEV] storm MS           an AENQ interrupt storm for MS ms (0:
                                             stop); waits for it to end, prints
                                             events=N passes=N max_pass=N
  efa-emu-inject [-d DEV] hostile-hits       times a malformation struck
  efa-emu-inject hostile-names               the malformations, by number
  efa-emu-inject list                        the efa-emu devices present
  efa-emu-inject --control-socket PATH COMMAND...
                                             any command above but list, from the
                                             host: through the control socket of a
                                             running efa-emu (--control-socket;
                                             tools/vm/run prints each device's), as
                                             its user, no root

DEV is a PCI address (0000:00:02.0) or an RDMA device name (efa_0); the
default is the only efa-emu device. OPCODE and STATUS are numbers or names
(create_qp, alloc_uar, ...; illegal_parameter, resource_busy, ...). The
control socket takes the window's reads and writes as lines ('read OFFSET',
'write OFFSET VALUE'; answers 'ok [VALUE]' or 'error WHY'), which efa-emu
makes exactly as it makes the guest's.
"""

import ctypes
import mmap
import os
import socket
import sys
import time

WINDOW = 0x1000
MAGIC, VERSION, INJECT, INJECTED = 0x00, 0x04, 0x08, 0x0C
ADMIN_TIMEOUT, KEEP_ALIVE_MS, COMMAND = 0x10, 0x14, 0x18
ADMIN_CMDS, ADMIN_ERRORS, KEEP_ALIVES, INDEX = 0x1C, 0x20, 0x24, 0x28
NET_LOSS_PPM, NET_DELAY_US, NET_DROPPED = 0x2C, 0x30, 0x34
LIVE_QPS, LIVE_CQS, LIVE_PDS, LIVE_UARS, LLQ_PAGES = 0x38, 0x3C, 0x40, 0x44, 0x48
HOSTILE, HOSTILE_SEED_LO, HOSTILE_SEED_HI, HOSTILE_HITS = 0x4C, 0x50, 0x54, 0x58
LATE_HELD, LATE_ADDR_LO, LATE_ADDR_HI, LATE_WRITES = 0x5C, 0x60, 0x64, 0x68
STORM_MS, STORM_EVENTS, STORM_PASSES, STORM_MAX_PASS = 0x6C, 0x70, 0x74, 0x78
NET_REORDER_PPM, NET_DUP_PPM = 0x7C, 0x80
REG_READS, REG_WRITES, INTERRUPTS = 0x84, 0x88, 0x8C
# What a late completion writes at the start of each buffer its command named.
LATE_MARKER = b"LATE-EMU"
# efa-emu's malformations (tools/efa-emu/src/device/hostile.rs), by number.
MALFORMATIONS = [
    "cqe-wrong-id", "cqe-stale-id", "cqe-duplicate", "cqe-bad-phase", "cqe-free-slot",
    "status-unknown", "resp-handle-reuse", "resp-db-outside", "resp-llq-outside",
    "resp-llq-overlap", "resp-db-foreign", "resp-size-larger", "resp-sub-cq-range",
    "eqe-garbage", "aenq-unknown-group", "aenq-storm", "aenq-fatal", "irq-spurious",
    "irq-after-reset", "readless-silent", "readless-wrong-reg", "reset-stuck", "bar-io",
    "resp-db-second-page",
]
MAGIC_VALUE = int.from_bytes(b"EEMU", "little")
# MAGIC of an efa-emu whose window is off (started without --test-control).
MAGIC_OFF_VALUE = int.from_bytes(b"EEMD", "little")
COMMANDS = {"exit": 1, "fatal": 2, "warning": 3, "notification": 4, "clear": 5,
            "complete-late": 7, "fatal-silent": 8}

OPCODES = {
    "create_qp": 1, "modify_qp": 2, "query_qp": 3, "destroy_qp": 4,
    "create_ah": 5, "destroy_ah": 6, "reg_mr": 7, "dereg_mr": 8,
    "create_cq": 9, "destroy_cq": 10, "get_feature": 11, "set_feature": 12,
    "get_stats": 13, "alloc_pd": 14, "dealloc_pd": 15, "alloc_uar": 16,
    "dealloc_uar": 17, "create_eq": 18, "destroy_eq": 19, "alloc_mr": 20,
    "service": 21, "create_event_counter": 25, "destroy_event_counter": 26,
    "attach_event_counter": 27, "modify_event_counter": 28,
    "detach_event_counter": 29,
}
STATUSES = {
    "resource_allocation_failure": 1, "bad_opcode": 2, "unsupported_opcode": 3,
    "malformed_request": 4, "illegal_parameter": 5, "unknown_error": 6,
    "resource_busy": 7,
}
PCI = "/sys/bus/pci/devices"


def die(msg):
    print(f"efa-emu-inject: {msg}", file=sys.stderr)
    sys.exit(1)


def number(s, names, what):
    s = s.lower().replace("-", "_")
    if s in names:
        return names[s]
    try:
        return int(s, 0)
    except ValueError:
        die(f"unknown {what} '{s}'")


def efa_functions():
    out = []
    for bdf in sorted(os.listdir(PCI)):
        try:
            with open(f"{PCI}/{bdf}/vendor") as v, open(f"{PCI}/{bdf}/device") as d:
                if int(v.read(), 16) == 0x1D0F and int(d.read(), 16) in range(0xEFA0, 0xEFA5):
                    out.append(bdf)
        except OSError:
            pass
    return out


class Window:
    def __init__(self, bdf):
        self.fd = os.open(f"{PCI}/{bdf}/resource0", os.O_RDWR | os.O_SYNC)
        self.map = mmap.mmap(self.fd, 0x1000, mmap.MAP_SHARED,
                             mmap.PROT_READ | mmap.PROT_WRITE, offset=WINDOW)

    def reg(self, off):
        # One 32-bit access: byte copies would not reach the model.
        return ctypes.c_uint32.from_buffer(self.map, off)

    def read(self, off):
        return self.reg(off).value

    def write(self, off, value):
        self.reg(off).value = value & 0xFFFFFFFF

    def inject(self, opcode, count=1, status=0, timeout=0, skip=0):
        """Arms a fault: the next `count` admin commands `opcode` (a number
        or a name) fail with `status` (0: the model's default,
        UNKNOWN_ERROR) or, with `timeout`, are never answered, after `skip`
        of them ran."""
        opcode = OPCODES.get(opcode, opcode)
        status = STATUSES.get(status, status)
        if not (0 <= opcode < 256 and 0 <= count < 4096 and 0 <= status < 256 and 0 <= skip < 8):
            raise ValueError("opcode < 256, count < 4096, status < 256, skip < 8")
        if skip and self.read(VERSION) < 3:
            raise ValueError("this efa-emu cannot skip commands (window version < 3)")
        self.write(INJECT, opcode | status << 8 | int(bool(timeout)) << 16 | skip << 17 | count << 20)

    def clear(self):
        """Disarms every injected fault (efa-emu-inject clear)."""
        self.write(COMMAND, COMMANDS["clear"])

    def hold(self, opcode, status="unknown_error", skip=0):
        """Holds the next admin command `opcode` (after `skip` that run)
        for a late completion with `status` (late mode: timeout mode with a
        status; window version 6)."""
        if self.read(VERSION) < 6:
            raise ValueError("this efa-emu cannot complete commands late (window version < 6)")
        status = STATUSES.get(status, status)
        if not status:
            raise ValueError("late mode needs a status")
        self.inject(opcode, 1, status, 1, skip)

    def complete_late(self):
        """Completes the held commands late, after writing LATE_MARKER at
        the start of each buffer they named."""
        self.write(COMMAND, COMMANDS["complete-late"])

    def storm(self, ms):
        """Starts an AENQ interrupt storm of `ms` milliseconds (0 stops
        it; window version 7)."""
        if self.read(VERSION) < 7:
            raise ValueError("this efa-emu has no interrupt storm (window version < 7)")
        self.write(STORM_MS, ms)

    def storm_result(self):
        """(ms left, events written, the driver's passes, the most events
        it took in one pass) of the last storm."""
        return tuple(self.read(r) for r in (STORM_MS, STORM_EVENTS, STORM_PASSES, STORM_MAX_PASS))

    def hostile(self, name, after=0, count=0, seed=0):
        """Arms malformation `name` (MALFORMATIONS) with `seed`: it strikes
        after `after` occasions that pass, `count` times (0: its default);
        `name` None disarms it (window version 5)."""
        if self.read(VERSION) < 5:
            raise ValueError("this efa-emu has no hostile mode (window version < 5)")
        if not (0 <= after < 256 and 0 <= count < 65536 and 0 <= seed < 2**64):
            raise ValueError("after < 256, count < 65536, seed < 2^64")
        self.write(HOSTILE_SEED_LO, seed)
        self.write(HOSTILE_SEED_HI, seed >> 32)
        self.write(HOSTILE, MALFORMATIONS.index(name) + 1 | after << 8 | count << 16 if name else 0)

    def late(self):
        """(commands held, the first buffer the last one held named,
        buffers written late)."""
        addr = self.read(LATE_ADDR_HI) << 32 | self.read(LATE_ADDR_LO)
        return self.read(LATE_HELD), addr, self.read(LATE_WRITES)


class SocketWindow(Window):
    """The control window of a running efa-emu, from the host: its control
    socket (efa-emu --control-socket PATH) reads and writes the registers
    as the guest's MMIO does, so every method of Window works unchanged.
    Needs no root, only efa-emu's user."""

    def __init__(self, path, timeout=30):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.answers = self.sock.makefile("rb")

    def close(self):
        self.answers.close()
        self.sock.close()

    def ask(self, request):
        """Sends one request line; returns what follows 'ok' in the answer
        (OSError for an error answer or a hang-up)."""
        self.sock.sendall(request.encode() + b"\n")
        answer = self.answers.readline().decode(errors="replace")
        if not answer.endswith("\n"):
            raise OSError(f"{self.path}: efa-emu hung up")
        word, _, rest = answer.rstrip("\n").partition(" ")
        if word != "ok":
            raise OSError(f"{self.path}: {request}: {answer.rstrip()}")
        return rest

    def read(self, off):
        return int(self.ask(f"read {off:#x}"), 16)

    def write(self, off, value):
        self.ask(f"write {off:#x} {value & 0xFFFFFFFF:#x}")


def objects_registers():
    return [("qps", LIVE_QPS), ("cqs", LIVE_CQS), ("pds", LIVE_PDS), ("uars", LIVE_UARS),
            ("llq_pages", LLQ_PAGES)]


def objects(dev):
    """What the device has: {"qps": n, "cqs": n, "pds": n, "uars": n,
    "llq_pages": n}."""
    _, w = open_window(dev)
    if w.read(VERSION) < 4:
        die("this efa-emu does not count objects (window version < 4)")
    return {name: w.read(off) for name, off in objects_registers()}


def costs_registers():
    return [("admin_cmds", ADMIN_CMDS), ("reg_writes", REG_WRITES), ("reg_reads", REG_READS),
            ("interrupts", INTERRUPTS)]


def costs(window):
    """What the driver cost the device so far, seen from the device:
    {"admin_cmds": n, "reg_writes": n, "reg_reads": n, "interrupts": n}
    (32-bit counters that wrap; differences modulo 2**32)."""
    if window.read(VERSION) < 10:
        die("this efa-emu does not count register accesses and interrupts (window version < 10)")
    return {name: window.read(off) for name, off in costs_registers()}


def open_window(dev):
    if dev is None:
        found = [b for b in efa_functions() if is_emu(b)]
        if len(found) != 1:
            die(f"{len(found)} efa-emu devices; pick one with -d ({', '.join(found)})")
        dev = found[0]
    elif not dev.count(":"):
        try:
            dev = os.path.basename(os.readlink(f"/sys/class/infiniband/{dev}/device"))
        except OSError:
            die(f"no RDMA device {dev}")
    w = Window(dev)
    magic = w.read(MAGIC)
    if magic == MAGIC_OFF_VALUE:
        die(f"{dev}: the efa-emu control window is off; start efa-emu with "
            "--test-control to use it (tools/vm/run does)")
    if magic != MAGIC_VALUE:
        die(f"{dev} has no efa-emu control window (a real EFA device?)")
    return dev, w


def open_socket(path):
    """(path, SocketWindow) of the efa-emu serving the control socket
    `path`."""
    try:
        w = SocketWindow(path)
        magic = w.read(MAGIC)
    except OSError as e:
        die(f"{path}: no efa-emu control socket there ({e})")
    if magic != MAGIC_VALUE:
        die(f"{path}: MAGIC reads {magic:#x}, not efa-emu's control window")
    return path, w


def window_state(bdf):
    """'on' or 'off' for an efa-emu device, None for anything else."""
    try:
        magic = Window(bdf).read(MAGIC)
    except OSError:
        return None
    return {MAGIC_VALUE: "on", MAGIC_OFF_VALUE: "off"}.get(magic)


def is_emu(bdf):
    return window_state(bdf) is not None


def main(argv):
    dev = sock = None
    if argv[:1] == ["--control-socket"]:
        if len(argv) < 2:
            die("--control-socket needs a path")
        sock, argv = argv[1], argv[2:]
    if argv[:1] == ["-d"]:
        if len(argv) < 2:
            die("-d needs a device")
        dev, argv = argv[1], argv[2:]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd, args = argv[0], argv[1:]
    if cmd == "hostile-names":
        for i, name in enumerate(MALFORMATIONS):
            print(i + 1, name)
        return 0
    if cmd == "list":
        for bdf in efa_functions():
            ib = os.listdir(f"{PCI}/{bdf}/infiniband") if os.path.isdir(f"{PCI}/{bdf}/infiniband") else []
            state = window_state(bdf)
            what = f"efa-emu (control window {state})" if state else "not efa-emu"
            print(bdf, what, " ".join(ib))
        return 0
    bdf, w = open_window(dev) if sock is None else open_socket(sock)
    if cmd == "inject":
        if len(args) < 2:
            die("inject OPCODE COUNT [fail [STATUS] | timeout] [after SKIP]")
        skip = 0
        if len(args) > 3 and args[-2] == "after":
            skip, args = int(args[-1], 0), args[:-2]
        opcode = number(args[0], OPCODES, "opcode")
        count = int(args[1], 0)
        mode = args[2] if len(args) > 2 else "fail"
        status, timeout = 0, 0
        if mode == "timeout":
            timeout = 1
        elif mode in ("fail", "late"):
            status = number(args[3], STATUSES, "status") if len(args) > 3 else 0
            if mode == "late":
                if w.read(VERSION) < 6:
                    die("this efa-emu cannot complete commands late (window version < 6)")
                timeout, status = 1, status or STATUSES["unknown_error"]
        else:
            die(f"mode is fail, timeout or late, not '{mode}'")
        try:
            w.inject(opcode, count, status, timeout, skip)
        except ValueError as e:
            die(str(e))
    elif cmd in COMMANDS:
        w.write(COMMAND, COMMANDS[cmd])
    elif cmd == "admin-timeout":
        w.write(ADMIN_TIMEOUT, (int(args[0], 0) + 99) // 100)
    elif cmd == "keep-alive":
        w.write(KEEP_ALIVE_MS, int(args[0], 0))
    elif cmd == "net-loss":
        w.write(NET_LOSS_PPM, int(args[0], 0))
    elif cmd == "net-delay":
        w.write(NET_DELAY_US, int(args[0], 0))
    elif cmd == "net-reorder":
        w.write(NET_REORDER_PPM, int(args[0], 0))
    elif cmd == "net-dup":
        w.write(NET_DUP_PPM, int(args[0], 0))
    elif cmd == "status":
        for name, off in [("index", INDEX), ("admin_cmds", ADMIN_CMDS),
                          ("admin_errors", ADMIN_ERRORS), ("injected", INJECTED),
                          ("keep_alives", KEEP_ALIVES), ("keep_alive_ms", KEEP_ALIVE_MS),
                          ("admin_timeout_100ms", ADMIN_TIMEOUT), ("inject", INJECT),
                          ("net_loss_ppm", NET_LOSS_PPM), ("net_delay_us", NET_DELAY_US),
                          ("net_dropped", NET_DROPPED), ("net_reorder_ppm", NET_REORDER_PPM),
                          ("net_dup_ppm", NET_DUP_PPM), ("reg_reads", REG_READS),
                          ("reg_writes", REG_WRITES), ("interrupts", INTERRUPTS)]:
            print(f"{bdf} {name} {w.read(off):#x}" if name == "inject" else f"{bdf} {name} {w.read(off)}")
    elif cmd == "hostile":
        if args[:1] == ["off"]:
            w.write(HOSTILE, 0)
            return 0
        if not args or args[0] not in MALFORMATIONS:
            die(f"hostile NAME: one of {', '.join(MALFORMATIONS)}")
        opts = dict(zip(args[1::2], (int(v, 0) for v in args[2::2])))
        if set(opts) - {"seed", "after", "count"} or len(args) % 2 == 0:
            die("hostile NAME [seed S] [after K] [count C]")
        try:
            w.hostile(args[0], **opts)
        except ValueError as e:
            die(str(e))
    elif cmd == "late":
        held, addr, writes = w.late()
        print(f"held={held} addr={addr:#x} writes={writes}")
    elif cmd == "storm":
        if len(args) != 1:
            die("storm MS")
        try:
            w.storm(int(args[0], 0))
        except ValueError as e:
            die(str(e))
        while w.read(STORM_MS):
            time.sleep(0.05)
        _, events, passes, max_pass = w.storm_result()
        print(f"events={events} passes={passes} max_pass={max_pass}")
    elif cmd == "hostile-hits":
        print(w.read(HOSTILE_HITS))
    elif cmd == "objects":
        if w.read(VERSION) < 4:
            die("this efa-emu does not count objects (window version < 4)")
        print(" ".join(f"{name}={w.read(off)}" for name, off in objects_registers()))
    else:
        die(f"unknown command '{cmd}' (try --help)")
    return 0


