"""The fast tier's clock: with TIER_MAX_SECONDS set (`make test-fast` sets it), a test not marked slow whose set-up,
call and tear-down together took longer than that fails the run, and the run lists each such test with its time.

A test's own time includes the fixtures it is the first to ask for (a module's shared model, the small corpus):
what it would cost run alone. Only enforced where the variable is set, with a bound well above the few seconds a
fast test takes on an idle machine, so that a loaded machine does not fail the suite; `pytest` alone only records.
Under pytest-xdist the controller sees every worker's reports and does the check (the workers' own copies of this
plugin leave it to it)."""
import os

import pytest

VARIABLE = "TIER_MAX_SECONDS"


class TierClock:
    def __init__(self, bound):
        self.bound, self.seconds, self.slow = bound, {}, set()

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        if "slow" in report.keywords:
            self.slow.add(report.nodeid)

    def offenders(self):
        return sorted(((s, n) for n, s in self.seconds.items() if n not in self.slow and s > self.bound),
                      reverse=True)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        if self.offenders() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        offenders = self.offenders()
        if offenders:
            terminalreporter.section(f"tests not marked slow over {VARIABLE}={self.bound:g} s", red=True)
            for seconds, nodeid in offenders:
                terminalreporter.write_line(f"{seconds:7.1f} s  {nodeid}")
            terminalreporter.write_line("mark each @pytest.mark.slow, or make it faster")


def pytest_configure(config):
    raw = os.environ.get(VARIABLE)
    if not raw or hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller checks
        return
    try:
        bound = float(raw)
    except ValueError:
        raise pytest.UsageError(f"{VARIABLE}={raw}: expected a number of seconds")
    config.pluginmanager.register(TierClock(bound), "tier_clock")
