# SPDX-License-Identifier: GPL-2.0
"""A pytest plugin that reports in KTAP, for the project's guest tests.

The plan is the number of collected tests, printed before the first runs,
so that a run that dies half way (the guest's kernel oopsed, the device
model went away, pytest was killed) is short of its plan and fails in
tools/test's parser (the kernel's kunit_parser.py), which names the tests
that did not report. Each test is one result line, "ok N NAME",
"not ok N NAME" or "ok N NAME # SKIP WHY", preceded by pytest's account of
a failure as diagnostic lines ("# ...").

With several test files, each is a subtest of its own (its name the
file's, its plan its tests), so that one pytest process, which takes half
a minute to start in the test VM, runs a boot's files.

Run through tests/lib/ktap-pytest, which gives this plugin the test's
standard output (file descriptor $KTAP_FD) and drops pytest's terminal
report: its progress letters would land inside the KTAP lines, and it
only repeats them. A failed test's output (what pytest captured) is
shown as diagnostic lines with its failure.

Where the time goes, as diagnostic lines: how long pytest took to start
and collect (Python's imports are slow in the test VM), each file's time,
and each test that took more than SLOW seconds.
"""

import os
import sys
import time

import pytest


def _name(item):
    # A KTAP description may hold neither the directive's '#' nor a line
    # break.
    return item.name.replace("#", "-").replace("\n", " ")


def _module(item):
    return item.path.stem


# A test slower than this (seconds, in the test VM) has its time printed.
SLOW = 10


def _process_age():
    """Seconds since this process started, from its start time in
    /proc/self/stat (clock ticks after boot) and the boot clock."""
    try:
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError):
        return None


class KtapReporter:
    def __init__(self):
        self.number = 0
        self.outcomes = {}
        self.items = {}
        # With several files: their names and test counts, in order; the
        # file being run, its tests so far and whether one failed.
        self.modules = []
        self.module = None
        self.module_number = 0
        self.module_failed = False
        self.indent = ""
        self.module_started = 0.0
        self.test_started = 0.0
        fd = os.environ.get("KTAP_FD")
        self.out = os.fdopen(int(fd), "w", buffering=1) if fd else sys.stdout

    def emit(self, line):
        self.out.write(self.indent + line + "\n")
        self.out.flush()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session):
        self.items = {item.nodeid: item for item in session.items}
        for item in session.items:
            name = _module(item)
            if self.modules and self.modules[-1][0] == name:
                self.modules[-1][1] += 1
            else:
                self.modules.append([name, 1])
        self.emit("KTAP version 1")
        if len(self.modules) > 1:
            self.emit(f"1..{len(self.modules)}")
        else:
            self.modules = []
            self.emit(f"1..{len(session.items)}")
        age = _process_age()
        if age is not None:
            self.emit(f"# pytest started and collected {len(session.items)} tests in {age:.1f} s")

    def pytest_runtest_logstart(self, nodeid, location):
        self.test_started = time.monotonic()
        if not self.modules:
            return
        item = self.items.get(nodeid)
        name = _module(item) if item else None
        if name == self.module:
            return
        self.module = name
        self.module_number += 1
        self.number = 0
        self.module_failed = False
        self.module_started = self.test_started
        count = next((n for m, n in self.modules if m == name), 0)
        self.indent = "    "
        self.emit("KTAP version 1")
        self.emit(f"# Subtest: {name}")
        self.emit(f"1..{count}")

    def end_module(self):
        count = next((n for m, n in self.modules if m == self.module), 0)
        if self.modules and self.number == count:
            self.indent = ""
            self.emit(f"# {self.module}: {time.monotonic() - self.module_started:.0f} s")
            self.emit(f"{'not ok' if self.module_failed else 'ok'} {self.module_number} {self.module}")

    def pytest_collectreport(self, report):
        # A module that does not import is no test at all: say why, and
        # let the plan (of what did import) stand.
        if report.failed:
            for line in str(report.longrepr).splitlines():
                self.emit(f"# {line}")

    def pytest_runtest_logreport(self, report):
        outcome = self.outcomes.setdefault(report.nodeid, {"failed": [], "skip": None})
        if report.failed:
            outcome["failed"].append(report)
        elif report.skipped and outcome["skip"] is None:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            outcome["skip"] = reason.removeprefix("Skipped: ")

    def pytest_runtest_logfinish(self, nodeid, location):
        self.number += 1
        outcome = self.outcomes.pop(nodeid, {"failed": [], "skip": None})
        item = self.items.get(nodeid)
        name = _name(item) if item else nodeid.rsplit("::", 1)[-1]
        took = time.monotonic() - self.test_started
        if took > SLOW:
            self.emit(f"# {name}: {took:.0f} s")
        if outcome["failed"]:
            for report in outcome["failed"]:
                for line in str(report.longrepr).splitlines():
                    self.emit(f"# {line}")
                for title, text in report.sections:
                    self.emit(f"# ---- {title}")
                    for line in text.splitlines():
                        self.emit(f"# {line}")
            self.emit(f"not ok {self.number} {name}")
            self.module_failed = True
        elif outcome["skip"] is not None:
            self.emit(f"ok {self.number} {name} # SKIP {outcome['skip']}")
        else:
            self.emit(f"ok {self.number} {name}")
        self.end_module()


def pytest_configure(config):
    config.pluginmanager.register(KtapReporter(), "ktap-reporter")
