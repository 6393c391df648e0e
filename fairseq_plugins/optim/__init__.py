"""Importing this package registers every optimizer file in it with fairseq."""

import importlib
import pathlib

for _file in sorted(pathlib.Path(__file__).parent.glob("*.py")):
    if not _file.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_file.stem}")
