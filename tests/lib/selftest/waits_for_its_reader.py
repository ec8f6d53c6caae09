# SPDX-License-Identifier: GPL-2.0
"""A fixture of tests/lib/ktap-selftest: its second test waits until the
reader of its results has seen the first one (the reader creates the file
KTAP_SELFTEST_SIGNAL names), as a person watching a long run would."""

import os
import time


def test_first():
    pass


def test_waits_for_the_reader():
    signal = os.environ["KTAP_SELFTEST_SIGNAL"]
    # Long enough for a loaded host (make test runs VMs beside it): a
    # reader that sees nothing before the end fails either way.
    deadline = time.monotonic() + 90
    while not os.path.exists(signal):
        assert time.monotonic() < deadline, "the first result never reached the reader"
        time.sleep(0.05)
