"""The fast tier's clock: with TIER_MAX_SECONDS set (`make test-fast` sets it), a test not marked slow whose set-up,
call and tear-down together used more CPU seconds than that fails the run, and the run lists each such test with its
CPU and wall seconds.

CPU seconds, not wall seconds: what the test's process and every process it started and waited for used (user +
system), which a loaded machine does not inflate as it inflates the wall clock (conftest has OpenMP threads sleep,
not spin, while they wait); on an idle machine a test that runs one thread at a time (make test's workers do) takes
about as many wall seconds. A test's own time includes the fixtures it is the first to ask for (a module's shared
model, the small corpus): what it would cost run alone. `pytest` without the variable only records. Either way the
summary gives each tier's CPU seconds and the tests and the files that used the most (CPU_LIST of each): what to
make cheaper first. Under pytest-xdist each worker measures its tests and the controller, which sees every worker's reports, does
the check."""
import os
import resource
from pathlib import Path

import pytest

VARIABLE = "TIER_MAX_SECONDS"
KEY = "cpu_seconds"
START = pytest.StashKey[float]()
CPU_LIST = 15


def cpu_seconds():
    """User + system seconds of this process and of its children that have been waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + preloaded_seconds()


def preloaded_seconds():
    """What the processes forked by this worker's preload servers (tests/preload/) used: they are their children,
    not this process's, and each server adds each one's seconds to its file ("cpu": the worker's own beside
    PRELOAD_CPU_FILE, one a test module starts in a folder below it) before the process's caller hears it ended."""
    if "PRELOAD_CPU_FILE" not in os.environ:
        return 0.0
    total = 0.0
    for path in Path(os.environ["PRELOAD_CPU_FILE"]).parent.rglob("cpu"):
        try:
            total += float(path.read_text())
        except (OSError, ValueError):  # a server that has not yet reaped a child writes none
            pass
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    item.stash[START] = cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield
    # user_properties travel with the teardown report (also from an xdist worker to the controller)
    item.user_properties.append((KEY, cpu_seconds() - item.stash[START]))



class TierClock:
    def __init__(self, bound):
        self.bound, self.wall, self.cpu, self.slow = bound, {}, {}, set()

    def pytest_runtest_logreport(self, report):
        self.wall[report.nodeid] = self.wall.get(report.nodeid, 0.0) + report.duration
        if report.when == "teardown":
            self.cpu[report.nodeid] = dict(report.user_properties).get(KEY, 0.0)
        if "slow" in report.keywords:
            self.slow.add(report.nodeid)

    def offenders(self):
        if self.bound is None:
            return []
        return sorted(((s, n) for n, s in self.cpu.items() if n not in self.slow and s > self.bound), reverse=True)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        if self.offenders() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        # the tiers' CPU seconds: on an idle machine, make test's two one-thread workers take about half of each
        fast = [s for n, s in self.cpu.items() if n not in self.slow]
        slow = [s for n, s in self.cpu.items() if n in self.slow]
        terminalreporter.write_line(f"CPU seconds: {sum(fast):.0f} in {len(fast)} tests not marked slow, "
                                    f"{sum(slow):.0f} in {len(slow)} slow ones")
        if self.cpu:
            terminalreporter.section(f"the {min(CPU_LIST, len(self.cpu))} tests that used the most CPU seconds")
            for nodeid, seconds in sorted(self.cpu.items(), key=lambda item: -item[1])[:CPU_LIST]:
                tier = "slow" if nodeid in self.slow else "fast"
                terminalreporter.write_line(f"{seconds:7.1f} CPU s {self.wall[nodeid]:7.1f} s  {tier}  {nodeid}")
            files = {}
            for nodeid, seconds in self.cpu.items():  # per file: where a whole fixture's cost shows
                cpu, wall, n = files.get(nodeid.split("::")[0], (0.0, 0.0, 0))
                files[nodeid.split("::")[0]] = (cpu + seconds, wall + self.wall[nodeid], n + 1)
            terminalreporter.section(f"the {min(CPU_LIST, len(files))} files that used the most CPU seconds")
            for path, (cpu, wall, n) in sorted(files.items(), key=lambda item: -item[1][0])[:CPU_LIST]:
                terminalreporter.write_line(f"{cpu:7.1f} CPU s {wall:7.1f} s  {n:4d} tests  {path}")
        offenders = self.offenders()
        if offenders:
            terminalreporter.section(f"tests not marked slow over {VARIABLE}={self.bound:g} CPU s", red=True)
            for seconds, nodeid in offenders:
                terminalreporter.write_line(f"{seconds:7.1f} CPU s {self.wall[nodeid]:7.1f} s  {nodeid}")
            terminalreporter.write_line("mark each @pytest.mark.slow, or make it faster")


def pytest_configure(config):
    raw = os.environ.get(VARIABLE)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller checks
        return
    try:
        bound = float(raw) if raw else None  # None: record and list, fail nothing
    except ValueError:
        raise pytest.UsageError(f"{VARIABLE}={raw}: expected a number of seconds")
    config.pluginmanager.register(TierClock(bound), "tier_clock")
