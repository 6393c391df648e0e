"""Bad input, as every tool meets it: one line ``TOOL: what is wrong`` on stderr and a non-zero exit status, no
traceback (``Tool.fail``); a text file's lines read under the same rule (``Tool.read_lines``).

    TOOL = Tool("length_probe.py")      # the name users type
    TOOL.fail("--edges must be positive")
    lines = TOOL.read_lines(path, "--data")
"""
import sys
from typing import List, NoReturn


class Tool:
    def __init__(self, name: str, status: int = 1):
        self.name, self.status = name, status  # status 2 where a tool's bad input is argparse's (usage) status

    def fail(self, message: str) -> NoReturn:
        if self.status == 1:  # the interpreter prints the message on stderr and exits with 1
            raise SystemExit(f"{self.name}: {message}")
        print(f"{self.name}: {message}", file=sys.stderr)
        raise SystemExit(self.status)

    def read_lines(self, path, what: str = "cannot read") -> List[str]:
        """The file's lines without their newlines; where it cannot be read, one line: WHAT PATH: the reason
        (``what``: the flag or input the path came from)."""
        try:
            with open(path, encoding="utf-8") as f:
                return [line.rstrip("\n") for line in f]
        except OSError as err:
            self.fail(f"{what} {path}: {err.strerror}")
