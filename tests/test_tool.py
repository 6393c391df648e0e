"""scripts/tooling/tool.py: bad input is one line naming the tool, with its exit status; an unreadable file is that
line too, naming the flag it came from (length_eval.py printed a traceback for a missing --hyp file)."""
import subprocess
import sys

import pytest

from conftest import env
from tooling.tool import Tool


def test_fail_is_one_line_with_the_tools_status(capsys):
    with pytest.raises(SystemExit) as stop:
        Tool("x.py").fail("--n must be > 0")
    assert stop.value.code == "x.py: --n must be > 0"  # the interpreter prints it and exits with 1
    with pytest.raises(SystemExit) as stop:
        Tool("y.py", status=2).fail("bad")
    assert stop.value.code == 2 and capsys.readouterr().err == "y.py: bad\n"


def test_read_lines(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\n", encoding="utf-8")
    assert Tool("x.py").read_lines(tmp_path / "a.txt") == ["one", "two"]
    with pytest.raises(SystemExit) as stop:
        Tool("x.py").read_lines(tmp_path / "missing.txt", "--hyp")
    assert stop.value.code == f"x.py: --hyp {tmp_path / 'missing.txt'}: No such file or directory"


def test_a_missing_file_given_to_length_eval_is_one_line(tmp_path):
    (tmp_path / "s").write_text("a b\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "scripts/length_eval.py", "score", "--name", "t", "--edges", "1,10",
                           "--src", str(tmp_path / "s"), "--ref", str(tmp_path / "s"), "--hyp", str(tmp_path / "no"),
                           "--out", str(tmp_path / "out.json")], capture_output=True, text=True, env=env())
    assert proc.returncode == 1 and proc.stderr == f"length_eval.py: --hyp {tmp_path / 'no'}: No such file or directory\n"
