"""tests/suite_times.py: the per-file table from pytest's JUnit XML, and the process census it can add."""
import json
import subprocess
import sys

from conftest import REPO

XML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.test_a" name="test_one" time="4.0"><properties>
<property name="cpu_seconds" value="3.5"/></properties></testcase>
<testcase classname="tests.test_a" name="test_two[x]" time="1.0"><properties>
<property name="cpu_seconds" value="0.5"/></properties></testcase>
<testcase classname="tests.test_b" name="test_three" time="10.0"><properties>
<property name="cpu_seconds" value="9.0"/></properties></testcase>
</testsuite></testsuites>"""


def test_per_file_table_and_census(tmp_path):
    (tmp_path / "run.xml").write_text(XML)
    census = tmp_path / "census.jsonl"
    env = {"PYTHONPATH": str(REPO / "tests" / "census"), "PROCESS_CENSUS": str(census), "PATH": "/usr/bin:/bin"}
    for code in ("import json", "pass"):
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
    records = [json.loads(line) for line in census.read_text().splitlines()]
    assert [r["argv"] for r in records] == [["-c"], ["-c"]] and all(r["cpu"] >= 0 for r in records)
    out = subprocess.run([sys.executable, "tests/suite_times.py", str(tmp_path / "run.xml"), "--census", str(census)],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.startswith("3 tests, 0.2 CPU minutes")
    lines = out.splitlines()
    assert lines.index("| `tests/test_b.py` | 1 | 9 | 10 |") < lines.index("| `tests/test_a.py` | 2 | 4 | 5 |")
    assert "| `tests/test_a.py::test_two[x]` | 0 | 1 |" in lines
    assert "2 Python processes, 0 of them importing fairseq (and torch)" in out and "| `-c` | 2 | 0 |" in out
