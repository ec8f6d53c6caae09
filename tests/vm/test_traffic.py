# SPDX-License-Identifier: GPL-2.0
"""Traffic through rdma-core's unmodified efa provider on refa's QPs, with
real clients: ibv_ud_pingpong between two processes on one device, across
two devices (two efa-emu processes joined by their socket fabric) and
with 4000-byte messages; perftest's SRD send, RDMA read and RDMA write
tests across the devices; libfabric's efa provider (fi_pingpong over RDM
endpoints) across the devices. The port counters of both sides must show
the traffic. Pingpongs with completion events (-e) must arrive as
interrupts of refa's event queues.

Each client run is one test, in the order written; they take the first two
devices under test. With one device the cross-device tests are skipped
when --one-device says so, and fail otherwise.

perftest's clients run with -F: without it a client whose estimate of the
CPU clock fails (a linear fit of TSC against gettimeofday, which a loaded
TCG host upsets: "Correlation coefficient r^2 < 0.9") exits with "Can't
produce a report" after the traffic went well. The figures are not what
this checks.
"""

import os
import subprocess

import pytest

import vmtest

ITERS = int(os.environ.get("PINGPONG_ITERS", "200"))


@pytest.fixture(scope="module")
def two(request, devices):
    """The server's and the client's device of the cross-device tests."""
    if len(devices) >= 2:
        return devices[0], devices[1]
    if request.config.getoption("one_device"):
        pytest.skip("one device (--one-device)")
    pytest.fail(f"one device ({devices[0]}): the cross-device tests cannot run "
                "(--one-device skips them explicitly)")


def eq_interrupts():
    """Interrupts taken by refa's completion event queues so far, on all
    CPUs."""
    total = 0
    with open("/proc/interrupts") as f:
        for line in f:
            if "refa-comp" in line:
                total += sum(int(field) for field in line.split()[1:] if field.isdigit())
    return total


def with_interrupts(round_trips, *run_args):
    """vmtest.pingpong(), where each side sleeps in ibv_get_cq_event() until
    refa's interrupt handler passes the device's event to the CQ's channel."""
    before = eq_interrupts()
    vmtest.pingpong(*run_args)
    taken = eq_interrupts() - before
    assert taken >= round_trips, \
        f"{taken} event queue interrupts for {round_trips} round trips with completion events"


def counted(wrs_counter, bytes_counter, ops, nbytes, sdev, cdev, *run_args):
    """vmtest.pingpong() of an RDMA read or write test: the client issues
    them against the server's memory, so the client counts the requests and
    the server the bytes it served or took in."""
    wrs = vmtest.counter(cdev, wrs_counter, port=1)
    served = vmtest.counter(sdev, bytes_counter, port=1)
    vmtest.pingpong(sdev, cdev, *run_args)
    wrs = vmtest.fresh_counter(cdev, wrs_counter, port=1) - wrs
    served = vmtest.fresh_counter(sdev, bytes_counter, port=1) - served
    assert wrs >= ops, f"{wrs_counter} of {cdev} grew by {wrs}, expected at least {ops}"
    assert served >= nbytes, f"{bytes_counter} of {sdev} grew by {served}, expected at least {nbytes}"


def fi_pingpong_counted(sdev, cdev):
    """libfabric's efa provider over RDM endpoints: its own protocol on top
    of refa's SRD QPs (handshake packets, then eager messages of 64 B to
    4 KiB, 100 of each size each way). fi_pingpong exchanges addresses over
    a TCP socket of its own choosing."""
    sent = vmtest.counter(cdev, "send_wrs", port=1)
    sent_bytes = vmtest.counter(cdev, "send_bytes", port=1)
    got = vmtest.counter(sdev, "recv_wrs", port=1)
    cmd = ["fi_pingpong", "-p", "efa", "-e", "rdm", "-I", "100"]
    vmtest.server_and_client([*cmd, "-d", f"{sdev}-rdm"], [*cmd, "-d", f"{cdev}-rdm", "127.0.0.1"],
                      lambda: "fi_pingpong" in subprocess.run(["ss", "-Hltnp"], capture_output=True,
                                                              text=True).stdout,
                      "fi_pingpong")
    sent = vmtest.fresh_counter(cdev, "send_wrs", port=1) - sent
    sent_bytes = vmtest.fresh_counter(cdev, "send_bytes", port=1) - sent_bytes
    got = vmtest.fresh_counter(sdev, "recv_wrs", port=1) - got
    assert sent >= 400, f"send_wrs of {cdev} grew by {sent} for 400 fi_pingpong messages"
    assert got >= 400, f"recv_wrs of {sdev} grew by {got} for 400 fi_pingpong messages"
    assert sent_bytes >= 100 * (64 + 256 + 1024 + 4096), f"send_bytes of {cdev} grew by {sent_bytes}"


def test_ud_pingpong_one_device_two_processes(devices):
    dev = devices[0]
    before = vmtest.counter(dev, "send_wrs", port=1)
    vmtest.pingpong(dev, dev, "ibv_ud_pingpong", "-g", "0", "-n", str(ITERS))
    after = vmtest.fresh_counter(dev, "send_wrs", port=1)
    assert after >= before + 2 * ITERS, f"send_wrs of {dev} {before} -> {after}: it did not count the pingpong"


def test_ud_pingpong_one_device_completion_events(devices):
    with_interrupts(ITERS, devices[0], devices[0], "ibv_ud_pingpong", "-g", "0", "-n", str(ITERS), "-e")


SRD = ("-c", "SRD", "-F", "-x", "0")
KIB64 = 65536
# Across the two devices: (name, function, its arguments after the
# devices' places). The first device serves, the second is the client;
# "swap" puts the second first.
CROSS = [
    ("UD pingpong, two devices, completion events",
     lambda a, b: with_interrupts(ITERS, a, b, "ibv_ud_pingpong", "-g", "0", "-n", str(ITERS), "-e")),
    ("SRD send latency, two devices, completion events",
     lambda a, b: with_interrupts(200, a, b, "ib_send_lat", *SRD, "-n", "200", "-e")),
    ("UD pingpong, two devices",
     lambda a, b: vmtest.pingpong(a, b, "ibv_ud_pingpong", "-g", "0", "-n", str(ITERS))),
    ("UD pingpong, two devices, 4000-byte messages",
     lambda a, b: vmtest.pingpong(b, a, "ibv_ud_pingpong", "-g", "0", "-n", str(ITERS), "-s", "4000")),
    ("SRD send latency, two devices",
     lambda a, b: vmtest.pingpong(a, b, "ib_send_lat", *SRD, "-n", "500")),
    ("SRD RDMA read latency, two devices",
     lambda a, b: counted("rdma_read_wrs", "rdma_read_resp_bytes", 200, 0, a, b,
                          "ib_read_lat", *SRD, "-n", "200")),
    ("SRD RDMA read bandwidth 64 KiB, two devices",
     lambda a, b: counted("rdma_read_wrs", "rdma_read_resp_bytes", 100, 100 * KIB64, a, b,
                          "ib_read_bw", *SRD, "-n", "100", "-s", str(KIB64))),
    # -I 0: ib_write_lat sends small writes inline, and rdma-core 56's efa
    # provider puts inline data where the remote address belongs (inline
    # RDMA write came with EFADV_QP_FLAGS_INLINE_WRITE in later rdma-core),
    # so the device fails them with a bad length, on efa.ko as on refa.
    ("SRD RDMA write latency, two devices",
     lambda a, b: counted("rdma_write_wrs", "rdma_write_recv_bytes", 200, 0, a, b,
                          "ib_write_lat", *SRD, "-n", "200", "-I", "0")),
    ("SRD RDMA write bandwidth 64 KiB, two devices",
     lambda a, b: counted("rdma_write_wrs", "rdma_write_recv_bytes", 100, 100 * KIB64, a, b,
                          "ib_write_bw", *SRD, "-n", "100", "-s", str(KIB64))),
    ("libfabric fi_pingpong, two devices", fi_pingpong_counted),
]


@pytest.mark.parametrize("check", [c for _, c in CROSS], ids=[n for n, _ in CROSS])
def test_across_two_devices(two, check):
    check(*two)
