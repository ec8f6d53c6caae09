# SPDX-License-Identifier: GPL-2.0
"""Objects kept on the device for mappings userspace kept stay inside the
rdma cgroup (run by tests/vm/run-refa-checks; issue 31, item 1).

refa keeps a destroyed QP on the device, stopped, while userspace still
maps its send queue (see test_isolation), and with it the PD and CQs it
uses. The core uncharges an object from the creator's rdma cgroup when
its destroy succeeds; refa charges what it keeps to the cgroup of the
task destroying it, and refuses the destroy (EBUSY) when that cgroup is at
its hca_object limit. So an attacker (uid nobody) in a cgroup allowed N
objects, which loops create QP, map its send queue, destroy, keep the
mapping, never has more than N objects on the device (efa-emu's live
counts say), and a victim in another cgroup creates its QPs throughout.

Also: the destroyed CQ and PD such kept QPs hold are charged the same
way; another process cannot map a send queue before the thread that
created the QP has (so the core's undoing of a creation, when it cannot
copy its response out, never meets a mapping: shown by such a creation);
a destroy at device removal is never refused, even by a task whose
cgroup allows nothing (the unbind at the end of the attack runs in one).

Before the fix the attacker held 26 objects on the device for a cgroup
allowed 8 (24 QPs kept after their destroy), and no destroy was refused.
"""

import ctypes
import errno
import json
import mmap
import os
import pwd
import select
import stat
import struct
import sys
import time

import pytest

import efa_emu
import uverbs as uv
import vmtest

# One device: the rdma cgroup's limits are per device, and the attack ends
# by unbinding it.
DEVICES = 1

PAGE = mmap.PAGESIZE
CGROUP = "/sys/fs/cgroup"
LIMIT = 8
libc = ctypes.CDLL(None, use_errno=True)


class Objects:
    """The device's live QPs, CQs and PDs (efa-emu's control window),
    through a window opened as root: a process that later drops its
    privileges keeps reading through the mapping it made."""

    def __init__(self, device):
        self.win = efa_emu.Window(vmtest.bdf_of(device))
        assert self.win.read(efa_emu.MAGIC) == efa_emu.MAGIC_VALUE, \
            f"{device} is not an efa-emu device with its control window on"
        assert self.win.read(efa_emu.VERSION) >= 4, "this efa-emu does not count objects"

    def now(self):
        return {name: self.win.read(off) for name, off in efa_emu.objects_registers()
                if name in ("qps", "cqs", "pds")}

    def beyond(self, base):
        """How many QPs, CQs and PDs the device has beyond `base`."""
        o = self.now()
        return sum(o[k] - base[k] for k in ("qps", "cqs", "pds"))


class Client:
    """A user context with a PD and one CQ; UD QPs on them."""

    def __init__(self, device):
        self.u = uv.Uverbs(device)
        self.sub_cqs = self.u.get_context()[2]
        self.pd, _ = self.u.alloc_pd()
        self.cq, _, _ = self.u.create_cq(64, uv.cq_cmd(self.sub_cqs))

    def qp_request(self):
        return (uv.QP_CREATE.pack(0, self.pd, self.cq, self.cq, 0, 16, 16, 1, 1, 0, 0, uv.QPT_UD, 0, 0),
                uv.EFA_QP_CMD.pack(0, 16 * uv.RX_DESC.size, 16 * 64, 0, 0, 0, b"\0" * 5))

    def create_qp(self):
        """A QP: (handle, its send queue's mmap cookie, the length to map)."""
        core_in, drv_in = self.qp_request()
        core, drv = self.u.cmd(uv.CREATE_QP, core_in, uv.QP_CREATE_RESP.size, drv_in, uv.EFA_QP_RESP.size)
        resp = uv.EFA_QP_RESP.unpack(drv)
        llq_off, llq_key = resp[3], resp[8]
        return uv.QP_CREATE_RESP.unpack(core)[0], llq_key, (llq_off + 16 * 64 + PAGE - 1) // PAGE * PAGE

    def destroy_qp(self, qp):
        self.u.cmd(uv.DESTROY_QP, struct.pack("<II", qp, 0), 4)


def errno_of(fn, *args):
    """0 when fn(*args) succeeds, else the errno it failed with."""
    try:
        fn(*args)
        return 0
    except OSError as e:
        return e.errno


def wait_for(cond, seconds=60):
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.1)
    return cond()


# ---- the rdma cgroup ----------------------------------------------------------

def rdma_cgroups(device):
    """The attacker's cgroup (LIMIT objects of the device), the victim's
    (4) and the unbinder's (none): {name: path}."""
    if not os.path.exists(f"{CGROUP}/cgroup.controllers"):
        os.makedirs(CGROUP, exist_ok=True)
        assert os.system(f"mount -t cgroup2 none {CGROUP}") == 0, "cannot mount cgroup2"
    with open(f"{CGROUP}/cgroup.controllers") as f:
        assert "rdma" in f.read().split(), "the kernel has no rdma cgroup controller (CONFIG_CGROUP_RDMA)"
    with open(f"{CGROUP}/cgroup.subtree_control", "w") as f:
        f.write("+rdma")
    groups = {}
    for name, objects in (("attacker", LIMIT), ("victim", 4), ("unbinder", 0)):
        path = f"{CGROUP}/refa-{name}"
        os.makedirs(path, exist_ok=True)
        with open(f"{path}/rdma.max", "w") as f:
            f.write(f"{device} hca_object={objects}")
        groups[name] = path
    return groups


def charged(group, device):
    """hca_object of `device` in the cgroup's rdma.current (0 if absent)."""
    with open(f"{group}/rdma.current") as f:
        for line in f:
            if line.startswith(device + " "):
                return int(dict(kv.split("=") for kv in line.split()[1:])["hca_object"])
    return 0


def join(group):
    with open(f"{group}/cgroup.procs", "w") as f:
        f.write(str(os.getpid()))


def become_nobody():
    nobody = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)
    assert os.geteuid() != 0, "still root"


class Line:
    """Lines over a pipe, with a timeout."""

    def __init__(self):
        self.r, self.w = os.pipe()
        self.buf = b""

    def send(self, word):
        os.write(self.w, word.encode() + b"\n")

    def recv(self, timeout=300):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.r], [], [], left)[0]:
                return ""
            chunk = os.read(self.r, 4096)
            if not chunk:
                return ""
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()


def in_child(fn):
    """Runs fn() in a child process: its exit status, 0 when fn returned
    0, else the errno of the OSError it raised (1 for anything else)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = fn()
        except OSError as e:
            code = e.errno or 1
        except BaseException as e:  # reported through the exit status
            print(f"child: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.fixture(scope="module")
def node_open_to_all(device):
    """The device's uverbs node readable and writable by anyone (the
    attacker is nobody) for the module's tests."""
    name = os.listdir(f"/sys/class/infiniband/{device}/device/infiniband_verbs")[0]
    node = f"/dev/infiniband/{name}"
    mode = os.stat(node).st_mode
    os.chmod(node, stat.S_IMODE(mode) | 0o666)
    yield node
    os.chmod(node, stat.S_IMODE(mode))


# ---- without a cgroup -----------------------------------------------------------------

def test_qps_are_created_and_destroyed_in_two_processes_at_once(device):
    """A send queue's pages, freed by one process's destroy, may go to the
    other's create before the first destroy's caller has seen its
    completion: no create may be refused for that (it was, with EIO)."""
    def worker():
        c = Client(device)
        for _ in range(40):
            qp, key, length = c.create_qp()
            c.u.mmap(length, key, mmap.PROT_WRITE).close()
            c.destroy_qp(qp)
        c.u.close()
        return 0
    pids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = worker()
            except OSError as e:
                code = e.errno or 1
            os._exit(code)
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
    assert codes == [0, 0], f"exit codes (errno) {codes}"


def test_another_process_cannot_map_a_send_queue_before_its_creator(device):
    c = Client(device)
    qp, key, length = c.create_qp()
    try:
        first = in_child(lambda: errno_of(c.u.mmap, length, key, mmap.PROT_WRITE))
        mine = c.u.mmap(length, key, mmap.PROT_WRITE)
        then = in_child(lambda: errno_of(c.u.mmap, length, key, mmap.PROT_WRITE))
        mine.close()
        c.destroy_qp(qp)
    finally:
        c.u.close()
    assert first == errno.EAGAIN, f"before the creator mapped it: errno {first}, expected EAGAIN"
    assert then == 0, f"after the creator mapped it: errno {then}, expected success"


def test_a_creation_the_core_undoes_leaves_nothing_on_the_device(device):
    """A CREATE_QP whose response cannot be copied out (it ends in a
    read-only page): the core destroys the new QP, which nobody could have
    mapped yet."""
    objects = Objects(device)
    c = Client(device)
    before = objects.now()
    area = mmap.mmap(-1, 2 * PAGE)
    start = ctypes.addressof(ctypes.c_char.from_buffer(area))
    assert libc.mprotect(ctypes.c_void_p(start), ctypes.c_size_t(PAGE), mmap.PROT_READ) == 0
    core_in, drv_in = c.qp_request()
    resp = start + PAGE - uv.QP_CREATE_RESP.size
    body = struct.pack("<Q", resp) + core_in + drv_in
    hdr = struct.pack("<IHH", uv.CREATE_QP, (8 + len(body)) // 4,
                      (uv.QP_CREATE_RESP.size + uv.EFA_QP_RESP.size) // 4)
    e = errno_of(os.write, c.u.fd, hdr + body)
    after = objects.now()
    c.u.close()
    assert e == errno.EFAULT, f"errno {e}, expected EFAULT"
    assert after == before, f"the device had {before}, then {after}"


# ---- the attacker and the victim -------------------------------------------------

def keep_qps(c, objects, base, report=None):
    """Create QP, map its send queue, destroy it, keep the mapping, until
    something is refused: (kept QPs, their mappings, the live QP whose
    destroy was refused or None, errno of the refusal, most objects seen on
    the device beyond `base`)."""
    kept, maps, live, refused = [], [], None, 0
    worst = objects.beyond(base)
    for _ in range(3 * LIMIT):
        try:
            qp, key, length = c.create_qp()
        except OSError as e:
            refused = e.errno
            break
        maps.append(c.u.mmap(length, key, mmap.PROT_WRITE))
        e = errno_of(c.destroy_qp, qp)
        worst = max(worst, objects.beyond(base))
        if e:
            refused, live = e, qp
            break
        kept.append(qp)
        if report:
            report("round")
    return kept, maps, live, refused, max(worst, objects.beyond(base))


def attacker(device, objects, groups, report, base, seen):
    """In its own process, in the attacker's cgroup, as nobody; `base` is
    what the device holds besides the attacker's objects. What it sees goes
    into `seen`; returns what it holds for the unbind."""
    join(groups["attacker"])
    become_nobody()
    c = Client(device)
    kept, maps, live, refused, worst = keep_qps(c, objects, base, report)
    seen.update(most=worst, kept=len(kept), refused=refused, live=live is not None)
    if live is None:
        return None
    seen["charged"] = (charged(groups["attacker"], device), objects.beyond(base))
    seen["create_at_limit"] = errno_of(c.create_qp)
    seen["after_refusals"] = objects.beyond(base)

    # The CQ and PD the kept QPs hold: charged as they are kept, refused at
    # the limit. The live QP goes (unmapped: nothing keeps it); one more PD
    # takes the cgroup back to its limit.
    maps.pop().close()
    seen["unmapped_destroy"] = errno_of(c.destroy_qp, live)
    pd2, _ = c.u.alloc_pd()
    seen["cq_pd_at_limit"] = (errno_of(c.u.destroy_cq, c.cq), errno_of(c.u.dealloc_pd, c.pd))
    c.u.dealloc_pd(pd2)
    seen["cq_pd_below"] = (errno_of(c.u.destroy_cq, c.cq), errno_of(c.u.dealloc_pd, c.pd))
    seen["held_below"] = (objects.beyond(base), len(kept) + 2, charged(groups["attacker"], device))
    c.u.close()
    for m in maps:
        m.close()
    wait_for(lambda: objects.beyond(base) == 0, 30)
    seen["unmapped"] = (objects.beyond(base), charged(groups["attacker"], device))

    # At the limit again, held through the unbind that follows.
    c = Client(device)
    held = keep_qps(c, objects, base)
    seen["again"] = (held[3], held[4])
    return c, held


def victim(device, groups, rounds, wait, done):
    """In its own process, in the victim's cgroup: a QP made and destroyed
    (its send queue mapped and unmapped, as the efa provider does) at each
    of the attacker's rounds, on a PD and a CQ it holds throughout."""
    join(groups["victim"])
    c = Client(device)
    done("ready")
    made = 0
    for _ in range(rounds):
        if not wait():
            break
        qp, key, length = c.create_qp()
        c.u.mmap(length, key, mmap.PROT_WRITE).close()
        c.destroy_qp(qp)
        made += 1
        done("made")
    c.u.close()
    return made


def unbind_and_bind(device, group):
    """The device unbound by a task in `group` and bound again: whether it
    came back."""
    bdf = vmtest.bdf_of(device)
    drv = os.path.realpath(f"/sys/bus/pci/devices/{bdf}/driver")

    def unbind():
        join(group)
        with open(f"{drv}/unbind", "w") as f:
            f.write(bdf)
        return 0
    in_child(unbind)
    with open(f"{drv}/bind", "w") as f:
        f.write(bdf)
    return wait_for(lambda: os.path.exists(f"/sys/class/infiniband/{device}"))


@pytest.fixture(scope="module")
def attack(device, node_open_to_all):
    """The victim, then the attacker, in lock-step; then the device
    unbound under the attacker's kept QPs by a task allowed nothing. What
    each saw: a dict."""
    groups = rdma_cgroups(device)
    objects = Objects(device)
    before = objects.now()
    from_attacker, to_attacker, from_victim, to_victim = Line(), Line(), Line(), Line()
    seen = {}

    # The victim first: it holds a PD and a CQ throughout, which the
    # attacker's count of its own objects leaves out.
    vpid = os.fork()
    if vpid == 0:
        made = -1
        try:
            made = victim(device, groups, 3 * LIMIT, lambda: to_victim.recv() == "r", from_victim.send)
        except OSError as e:
            print(f"victim: {e}", file=sys.stderr, flush=True)
        from_victim.send(f"total {made}")
        os._exit(0)
    assert from_victim.recv() == "ready", "the victim did not start"
    base = objects.now()

    pid = os.fork()
    if pid == 0:
        mine = {}
        try:
            def report(word):
                # Lock-step: the victim makes its QP before the attacker
                # goes on, so that every count sees the victim holding its
                # PD and CQ only.
                from_attacker.send(word)
                to_attacker.recv()
            # Held (mappings and all) until the parent is done with them.
            held = [attacker(device, objects, groups, report, base, mine)]
            from_attacker.send("seen " + json.dumps(mine))
            to_attacker.recv()
            held.clear()
        except BaseException as e:  # reported to the parent
            mine["error"] = f"{type(e).__name__}: {e}"
            from_attacker.send("seen " + json.dumps(mine))
        os._exit(0)

    rounds = made = 0
    while True:
        word = from_attacker.recv()
        if word != "round":
            break
        rounds += 1
        to_victim.send("r")
        made += from_victim.recv() == "made"
        to_attacker.send("go")
    to_victim.send("q")
    total_made = from_victim.recv()
    os.waitpid(vpid, 0)
    seen.update(json.loads(word[5:]) if word.startswith("seen ") else {"error": "the attacker died"})
    seen["victim"] = (made, rounds, total_made)

    # The device goes away while the attacker holds kept QPs at its limit:
    # the core destroys everything with its mappings still there. No
    # destroy may be refused (the core would warn); the task unbinding is
    # in a cgroup allowed nothing, so a charge there would fail.
    if "again" in seen:
        seen["rebound"] = unbind_and_bind(device, groups["unbinder"])
    to_attacker.send("go")
    os.waitpid(pid, 0)
    wait_for(lambda: all(v <= before[k] for k, v in objects.now().items()))
    seen["left"] = (before, objects.now())
    for g in groups.values():
        try:
            os.rmdir(g)
        except OSError:
            pass
    return seen


def reached(seen, key):
    assert "error" not in seen, f"the attacker failed: {seen['error']}"
    assert key in seen, f"the attack did not get that far ({seen})"
    return seen[key]


def test_the_attacker_never_holds_more_than_its_limit_on_the_device(attack):
    most = reached(attack, "most")
    assert most <= LIMIT, f"{most} objects (QPs, CQs, PDs) on the device for a cgroup allowed {LIMIT}: " \
        f"{attack['kept']} QPs kept after their destroy"


def test_a_destroy_that_would_keep_a_qp_past_the_limit_is_ebusy(attack):
    refused = reached(attack, "refused")
    assert attack["live"] and refused == errno.EBUSY, \
        f"{'destroy' if attack['live'] else 'create'} refused with errno {refused}, expected a destroy " \
        f"refused with EBUSY ({attack['kept']} QPs kept)"


def test_what_is_kept_is_charged_to_the_attackers_cgroup(attack):
    counted, held = reached(attack, "charged")
    assert counted == LIMIT, f"the cgroup counts {counted} objects, the device holds {held} of the attacker's"


def test_at_the_limit_a_create_is_eagain_and_leaves_nothing(attack):
    e = reached(attack, "create_at_limit")
    assert e == errno.EAGAIN, f"errno {e}, expected EAGAIN"
    assert attack["after_refusals"] <= LIMIT, f"{attack['after_refusals']} objects for a limit of {LIMIT}"


def test_an_unmapped_qp_is_destroyed_at_the_limit(attack):
    e = reached(attack, "unmapped_destroy")
    assert e == 0, f"errno {e}"


def test_a_cq_and_pd_kept_qps_hold_are_ebusy_past_the_limit(attack):
    e_cq, e_pd = reached(attack, "cq_pd_at_limit")
    assert (e_cq, e_pd) == (errno.EBUSY, errno.EBUSY), \
        f"destroy CQ: errno {e_cq}, dealloc PD: errno {e_pd}, expected EBUSY for both"


def test_below_the_limit_they_go_and_stay_on_the_device_charged(attack):
    e_cq, e_pd = reached(attack, "cq_pd_below")
    held, expected, counted = attack["held_below"]
    assert (e_cq, e_pd) == (0, 0), f"destroy CQ: errno {e_cq}, dealloc PD: errno {e_pd}"
    assert held == expected, f"{held} objects on the device, expected {expected} (the kept QPs, a CQ, a PD)"
    assert counted == held, f"{counted} charged, {held} kept"


def test_unmapped_everything_kept_goes_and_its_charge_with_it(attack):
    left, counted = reached(attack, "unmapped")
    assert (left, counted) == (0, 0), f"{left} objects left on the device, {counted} charged"


def test_the_victim_creates_its_qps_throughout(attack):
    made, rounds, total = reached(attack, "victim")
    assert rounds > 0 and made == rounds and total == f"total {rounds}", \
        f"the victim made its QP in {made} of {rounds} rounds ({total})"


def test_the_device_unbinds_under_kept_qps_at_the_limit_by_a_task_allowed_nothing(attack):
    errno_, most = reached(attack, "again")
    assert errno_ == errno.EBUSY and most <= LIMIT, \
        f"at the limit again: errno {errno_}, {most} objects on the device"
    assert attack["rebound"], "the device did not come back after unbind and bind"


def test_nothing_is_left_on_the_device_afterwards(attack):
    # No more than before the attack: what an earlier test left, a CQ a
    # mapping kept for a while, may go meanwhile (make test's boot saw
    # {'cqs': 1} -> {'cqs': 0}); it is not the attack's.
    before, now = reached(attack, "left")
    assert all(now[k] <= before[k] for k in now), f"{before} -> {now}"
