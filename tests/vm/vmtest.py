# SPDX-License-Identifier: GPL-2.0
"""What the guest tests share besides their fixtures (conftest.py): sizes
and waits, errno assertions, the kernel log, pinned memory, UD QPs and a
sender through the efa provider (pyverbs), the sysfs views of a device,
and what a test declares to the harness about the device models.

In the spirit of rdma-core's tests/utils.py: small functions, asserting
with plain `assert` so that pytest explains a failure.
"""

import contextlib
import ctypes
import errno
import mmap
import os
import random
import signal
import subprocess
import time

import pyverbs.enums as e
from pyverbs.addr import AH, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

PAGE = mmap.PAGESIZE
KIB, MIB = 1 << 10, 1 << 20
GRH = 40  # the room a UD receive leaves for the global route header
QKEY = 0x11111111
# Seconds for one completion or event under TCG on a loaded host (a pass
# never waits it out).
WAIT = 60


# ---- errnos ----------------------------------------------------------------

def errno_of(fn, *args, **kw):
    """Runs fn(*args, **kw): (the errno it failed with, None), or (None, its
    result). A pyverbs error without an errno (the provider refused the
    request itself) is -1."""
    try:
        return None, fn(*args, **kw)
    except PyverbsRDMAError as err:
        return err.error_code, None
    except PyverbsError as err:
        return -1, err
    except OSError as err:
        return err.errno, None


def timed_errno(fn, *args, **kw):
    """(the errno fn(*args, **kw) failed with, None if it succeeded; the
    seconds it took)."""
    start = time.monotonic()
    code, _ = errno_of(fn, *args, **kw)
    return code, time.monotonic() - start


def name_of(code):
    return errno.errorcode.get(code, str(code))


def refused(expected, fn, *args, **kw):
    """fn(*args, **kw) must fail with errno `expected`: the kernel's own
    answer, never "any error"."""
    code, result = errno_of(fn, *args, **kw)
    assert code is not None, f"accepted ({result!r}), expected {name_of(expected)}"
    assert code == expected, f"errno {code} ({name_of(code)}), expected {expected} ({name_of(expected)})"


@contextlib.contextmanager
def deadline(seconds, what):
    """Fails the test, rather than hanging the boot, when `what` takes
    longer than `seconds` (a driver that hangs a verb). As `timeout` would,
    it ends a wait, not a task stuck in the kernel."""
    def expired(*_):
        raise TimeoutError(f"{what} took more than {seconds} s: hung")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---- the kernel log and the harness -----------------------------------------

def kmsg(text):
    """A line in the kernel log (a mark that later checks look from)."""
    with open("/dev/kmsg", "w") as f:
        f.write(f"{text}\n")


def dmesg():
    return subprocess.run(["dmesg"], capture_output=True, text=True).stdout.splitlines()


def log_since(mark):
    """The kernel log from the last line that ends with `mark` on (the
    whole log when there is none)."""
    log = dmesg()
    start = max((i for i, line in enumerate(log) if line.endswith(mark)), default=0)
    return log[start:]


def refa_failures_since(mark, *what):
    """refa's lines saying it failed, after `mark`; only those naming one
    of `what` (e.g. "freeing", "destroying") when given."""
    return [line for line in log_since(mark) if "refa" in line and "failed" in line
            and (not what or any(w in line for w in what))]


def emu_may_report(*classes, index=None):
    """Declares to the harness (tools/vm/check-log) that the device models
    (or model `index`) may count `classes` of errors in this run: admin
    commands failed on purpose, say. Through the kernel log, where the
    harness reads it whatever the test's output is nested in."""
    which = "" if index is None else f" {index}"
    kmsg(f"refa-vm: efa-emu{which} may report {' '.join(classes)}")


def emu_may_exit(index):
    """Declares that device model `index` may exit during the run."""
    kmsg(f"refa-vm: efa-emu {index} may exit")


# ---- memory -----------------------------------------------------------------

def vm_pinned():
    """This process's pinned memory (VmPin), in kB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmPin:"))


def anonymous(size, fill=b"\0"):
    """`size` bytes of anonymous memory, every page written with `fill`:
    (the mapping, its address)."""
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.write(fill * size)
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


# ---- devices ----------------------------------------------------------------

def ib_devices(prefix=""):
    try:
        names = os.listdir("/sys/class/infiniband")
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(prefix))


def bdf_of(device):
    """The PCI function of RDMA device `device`."""
    return os.path.basename(os.readlink(f"/sys/class/infiniband/{device}/device"))


def driver_of(device):
    return os.path.basename(os.readlink(f"/sys/class/infiniband/{device}/device/driver"))


AMAZON = "0x1d0f"
PCI = "/sys/bus/pci/devices"


def amazon_functions():
    """The Amazon PCI functions, in bus order, bound or not."""
    found = []
    for bdf in sorted(os.listdir(PCI)):
        with open(f"{PCI}/{bdf}/vendor") as f:
            if f.read().strip() == AMAZON:
                found.append(bdf)
    return found


def pci_driver_of(bdf):
    """The driver PCI function `bdf` is bound to, or None."""
    try:
        return os.path.basename(os.readlink(f"{PCI}/{bdf}/driver"))
    except FileNotFoundError:
        return None


def ib_of(bdf):
    """The RDMA device of PCI function `bdf`, or None."""
    try:
        names = os.listdir(f"{PCI}/{bdf}/infiniband")
    except FileNotFoundError:
        return None
    return names[0] if names else None


def write_sysfs(path, text):
    """One write(2) of `text`: its error raised here, once. (A buffered
    file whose flush failed keeps the bytes and writes them again when it
    is collected: a bind refused, then done behind the test's back.)"""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def unbind(driver, bdf):
    write_sysfs(f"/sys/bus/pci/drivers/{driver}/unbind", bdf)
    assert ib_of(bdf) is None, f"{bdf} still has an RDMA device after unbind"


def bind(driver, bdf):
    """Binds `bdf` to `driver`; returns its RDMA device, which the driver
    registers at the end of probe."""
    write_sysfs(f"/sys/bus/pci/drivers/{driver}/bind", bdf)
    deadline = time.monotonic() + 10
    while ib_of(bdf) is None:
        assert time.monotonic() < deadline, f"no RDMA device on {bdf} 10 s after binding"
        time.sleep(0.1)
    return ib_of(bdf)


def rebind(driver, bdf):
    unbind(driver, bdf)
    return bind(driver, bdf)


def counter(device, name, port=None):
    """A hardware counter of the device (port=None) or of a port."""
    where = f"ports/{port}/hw_counters" if port else "hw_counters"
    with open(f"/sys/class/infiniband/{device}/{where}/{name}") as f:
        return int(f.read())


def fresh_counter(device, name, port=None):
    """counter(), read after the core's cache of it has expired: sysfs
    serves the values it read from the driver for 10 ms (the counters'
    lifespan), and two requests can come closer than that."""
    time.sleep(0.03)
    return counter(device, name, port)


def refa_module():
    """The refa.ko the run loaded (tools/vm/run says which)."""
    return os.environ.get("REFA_MODULE") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "refa.ko")


@contextlib.contextmanager
def no_kunit_at_load():
    """Loads of refa within run none of its KUnit suites: they ran at the
    boot's load (tools/vm/run --kunit checks them), and at a reload would
    only cost time."""
    kunit_glob = "/sys/module/kunit/parameters/filter_glob"
    with open(kunit_glob) as f:
        glob = f.read().rstrip("\n")
    if glob in ("", "(null)"):  # no filter: every suite
        glob = "*"
    write_sysfs(kunit_glob, "refa_reloads_run_no_kunit_suite")
    try:
        yield
    finally:
        write_sysfs(kunit_glob, glob)  # no newline: sysfs would keep it in the glob


def reload_refa(*params, seconds=30):
    """Unloads refa and loads it again with module parameters `params`
    ("recovery=0"), without running its KUnit suites again; waits until
    every function it had bound has its RDMA device back."""
    bdfs = [bdf for bdf in amazon_functions() if pci_driver_of(bdf) == "refa"]
    with no_kunit_at_load():
        subprocess.run(["rmmod", "refa"], check=True)
        subprocess.run(["insmod", refa_module(), *params], check=True)
    end = time.monotonic() + seconds
    for bdf in bdfs:
        while ib_of(bdf) is None:
            assert time.monotonic() < end, f"{bdf} has no RDMA device {seconds} s after insmod"
            time.sleep(0.05)


# ---- verbs through the efa provider -----------------------------------------

def ud_qp(pd, scq, rcq, depth=16):
    """A UD QP in RTS."""
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=scq, rcq=rcq,
                           cap=QPCap(max_send_wr=depth, max_recv_wr=depth, max_send_sge=1, max_recv_sge=1)))
    attr = QPAttr()
    attr.qp_state, attr.qkey, attr.port_num, attr.pkey_index = e.IBV_QPS_INIT, QKEY, 1, 0
    qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_QKEY)
    attr = QPAttr()
    attr.qp_state = e.IBV_QPS_RTR
    qp.modify(attr, e.IBV_QP_STATE)
    attr = QPAttr()
    attr.qp_state, attr.sq_psn = e.IBV_QPS_RTS, 0
    qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_SQ_PSN)
    return qp


def qattr(**fields):
    """QPAttr with `fields` set."""
    attr = QPAttr()
    for k, v in fields.items():
        setattr(attr, k, v)
    return attr


def qp_state(qp):
    attr, _ = qp.query(e.IBV_QP_STATE)
    return attr.qp_state


def poll(cq, what):
    """The next completion on `cq`, which must be a success, within WAIT."""
    deadline = time.monotonic() + WAIT
    while True:
        n, wcs = cq.poll()
        if n:
            assert wcs[0].status == e.IBV_WC_SUCCESS, f"{what}: completion status {wcs[0].status}"
            return wcs[0]
        assert time.monotonic() < deadline, f"{what}: no completion within {WAIT} s"
        time.sleep(0.001)


def self_ah(pd, ctx):
    """An AH to the device's own GID."""
    gid = ctx.query_gid(1, 0)
    return AH(pd, attr=AHAttr(gr=GlobalRoute(dgid=gid, sgid_index=0), is_global=1, port_num=1))


class Sender:
    """UD sends through the efa provider: a PD, a CQ, a UD QP and an AH to
    the device itself on context `ctx`, which it does not own."""

    def __init__(self, ctx, size=PAGE):
        self.pd = PD(ctx)
        self.cq = CQ(ctx, 64)
        self.qp = ud_qp(self.pd, self.cq, self.cq)
        self.ah = self_ah(self.pd, ctx)
        self.size = size
        self.mr = MR(self.pd, size, e.IBV_ACCESS_LOCAL_WRITE)

    def send(self, qpn, payload=None):
        """Sends `payload` (default: `size` bytes) to QP `qpn` and waits
        for the send's completion."""
        payload = bytes(self.size) if payload is None else payload
        self.mr.write(payload, len(payload))
        wr = SendWR(wr_id=7, opcode=e.IBV_WR_SEND, num_sge=1, sg=[SGE(self.mr.buf, len(payload), self.mr.lkey)],
                    send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_ud(self.ah, qpn, QKEY)
        self.qp.post_send(wr)
        poll(self.cq, "send")

    def close(self):
        for obj in (self.qp, self.ah, self.mr, self.cq, self.pd):
            obj.close()


def listening(port):
    """Whether a TCP socket listens on `port` (/proc/net/tcp{,6})."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    return True
    return False


def listening_server(server_cmd, listens, what):
    """Starts `server_cmd` and returns it once `listens()` (a server
    started under TCG can take seconds to listen); kills it if it does not
    listen."""
    server = subprocess.Popen(server_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not listens():
            assert server.poll() is None, f"the {what} server exited: {server.communicate()[0]}"
            assert time.monotonic() < deadline, f"the {what} server does not listen"
            time.sleep(0.1)
    except BaseException:
        if server.poll() is None:
            server.kill()
            server.wait()
        raise
    return server


def server_and_client(server_cmd, client_cmd, listens, what):
    """Starts `server_cmd`, waits until `listens()`, runs `client_cmd`;
    both must exit 0."""
    server = listening_server(["timeout", "150", *server_cmd], listens, what)
    try:
        client = subprocess.run(["timeout", "120", *client_cmd],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(client.stdout)
        assert client.returncode == 0, f"the {what} client exited with {client.returncode}"
        out, _ = server.communicate(timeout=150)
        print(out)
        assert server.returncode == 0, f"the {what} server exited with {server.returncode}"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def pingpong(sdev, cdev, tool, *opts):
    """Runs `tool` as a server on `sdev` and its client on `cdev` (rdma-core
    and perftest tools, which meet over a TCP port given with -p)."""
    port = 18515 + random.randrange(1000)
    server_and_client([tool, "-d", sdev, "-p", str(port), *opts],
                      [tool, "-d", cdev, "-p", str(port), *opts, "127.0.0.1"],
                      lambda: listening(port), tool)
