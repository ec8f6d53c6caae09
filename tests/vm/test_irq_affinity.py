# SPDX-License-Identifier: GPL-2.0
"""Interrupt affinity hints of the EFA driver's MSI-X vectors (the test VM
has 2 vCPUs): as efa.ko, the admin vector is hinted (and pointed) at the
first CPU and completion vector i at the i-th CPU, so that irqbalance and
the kernel keep each event queue's interrupt on its own CPU.

Reads /proc/interrupts for the driver's vectors (refa-mgmnt/refa-comp
under refa, efa-mgmnt/efa-comp under efa.ko) and each one's
/proc/irq/N/affinity_hint and smp_affinity_list, for every device. Then
unbinds and binds the first device again: the hints must be cleared before
the interrupts are freed (the kernel WARNs otherwise, which fails the run)
and come back.
"""

import os
import time

import vmtest


def vectors(driver, bdf):
    """[(name, irq)] of the driver's vectors of PCI function `bdf` (refa
    names every completion vector alike), in /proc/interrupts order."""
    found = []
    with open("/proc/interrupts") as f:
        for line in f:
            fields = line.split()
            if not fields or not fields[0].endswith(":") or not fields[0][:-1].isdigit():
                continue
            name = fields[-1]
            if f"PCI-MSIX-{bdf}" not in fields:
                continue
            if name.startswith(f"{driver}-mgmnt") or name.startswith(f"{driver}-comp"):
                found.append((name, int(fields[0][:-1])))
    return found


def cpus_of_mask(text):
    mask = int(text.strip().replace(",", ""), 16)
    return [cpu for cpu in range(mask.bit_length()) if mask >> cpu & 1]


def check_hints(driver, bdf):
    found = vectors(driver, bdf)
    admin = [v for v in found if v[0].startswith(f"{driver}-mgmnt")]
    comp = [v for v in found if v[0].startswith(f"{driver}-comp")]
    ncpus = os.cpu_count()
    assert len(admin) == 1, f"admin vectors {admin}"
    assert len(comp) == ncpus, f"{len(comp)} completion vectors for {ncpus} CPUs: {comp}"
    # Completion vectors in the order of their MSI-X index: the IRQ numbers
    # of one device's vectors are consecutive.
    comp.sort(key=lambda v: v[1])
    expected = [(admin[0], 0)] + [(v, i) for i, v in enumerate(comp)]
    for (name, irq), cpu in expected:
        with open(f"/proc/irq/{irq}/affinity_hint") as f:
            hint = cpus_of_mask(f.read())
        with open(f"/proc/irq/{irq}/smp_affinity_list") as f:
            affinity = f.read().strip()
        assert hint == [cpu], f"{name} (IRQ {irq}) hints CPUs {hint}, expected [{cpu}]"
        assert affinity == str(cpu), f"{name} (IRQ {irq}) has affinity {affinity}, expected {cpu}"


def test_hints_after_probe(bdf, driver):
    check_hints(driver, bdf)


def test_hints_after_unbind_and_bind(devices):
    bdf, driver = vmtest.bdf_of(devices[0]), vmtest.driver_of(devices[0])
    path = f"/sys/bus/pci/drivers/{driver}"
    with open(f"{path}/unbind", "w") as f:
        f.write(bdf)
    assert not vectors(driver, bdf), "vectors left after unbind"
    with open(f"{path}/bind", "w") as f:
        f.write(bdf)
    deadline = time.monotonic() + 20
    while not os.path.isdir(f"/sys/bus/pci/devices/{bdf}/infiniband") and time.monotonic() < deadline:
        time.sleep(0.1)
    check_hints(driver, bdf)
