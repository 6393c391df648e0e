"""pytest-xdist hands out test files in collection order (make test's --dist loadfile), so that the order
tests/conftest.py gives them (COSTLIEST_FIRST) is the order they run in. By default pytest-xdist 3.8 sorts the
files by their number of tests first (--loadscope-reorder), which put the one-test files that run a recipe for a
minute or more last, and two files that need the same toy model side by side, one waiting on the other's lock."""


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist is installed (-p no:xdist: nothing to do)
        config.option.loadscopereorder = False
