"""docs/position_schemes.md's "Adding a scheme" is what a new scheme needs: every file its steps name exists (a
``<name>`` in a path: for each scheme of the table that has one), every home from which the tests read a scheme
(its reference, its flags' values, its embedding's evaluation positions, its figures' title and equation, its
WMT14 config) is named in the steps and exists where they say, and the docs' table has a row for every row of
``SCHEMES``."""
import dataclasses
import re

import pytest

from conftest import REPO
from helpers import scheme_references
from fairseq_plugins.modules.position_scheme import PositionScheme
from fairseq_plugins.schemes import FAMILY_SCHEMES, NEW_SCHEMES, SCHEMES

DOC = REPO / "docs" / "position_schemes.md"
TESTS = REPO / "tests" / "test_position_schemes.py"


def steps():
    """The numbered steps of "Adding a scheme": one paragraph."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index("**Adding a scheme**")
    return text[start:text.index("\n\n", start)]


def named(text):
    """What the text names in backquotes."""
    return set(re.findall(r"`([^`]+)`", text))


def test_every_file_the_steps_name_exists():
    paths = [n for n in named(steps()) if re.fullmatch(r"[\w./<>-]+\.(py|yaml|md)|[\w/]+/", n)]
    assert "tests/helpers/scheme_references.py" in paths and "configs/scheme/<name>.yaml" in paths, paths
    for path in paths:
        names = NEW_SCHEMES if "<name>" in path else ("",)
        for name in names:
            concrete = path.replace("<name>", name)
            where = [REPO / concrete, REPO / "fairseq_plugins" / concrete]  # modules/...: the package's
            assert any(p.exists() for p in where), f"docs/position_schemes.md, Adding a scheme, names {concrete}"


def test_the_steps_name_every_home_the_tests_read_a_scheme_from():
    tests = TESTS.read_text(encoding="utf-8")
    homes = {  # what a step must name: whether it is where the docs say
        scheme_references.HOME: (REPO / scheme_references.HOME).is_file(),
        "REFERENCES": isinstance(scheme_references.REFERENCES, dict),
        "OTHER_VALUES": "\nOTHER_VALUES = {" in tests,
        "first_block_input_naive": "\ndef first_block_input_naive(" in tests,
        "tests/test_position_schemes.py": TESTS.is_file(),
        "SCHEMES": all(row.name == name for name, row in SCHEMES.items()),  # the table: its rows by name
        "fairseq_plugins/schemes.py": (REPO / "fairseq_plugins" / "schemes.py").is_file(),
        "title": isinstance(PositionScheme.title, str),
        "equation": isinstance(PositionScheme.equation, str),
        "configs/scheme/<name>.yaml": all((REPO / "configs" / "scheme" / f"{n}.yaml").is_file() for n in NEW_SCHEMES),
        "tests/test_configs.py": (REPO / "tests" / "test_configs.py").is_file(),
        "tests/data/golden_architectures.json": (REPO / "tests" / "data" / "golden_architectures.json").is_file(),
    }
    text = steps()
    missing = sorted(home for home in homes if home not in named(text))
    assert not missing, f"docs/position_schemes.md, Adding a scheme, does not name {', '.join(missing)}"
    assert all(homes.values()), [home for home, there in homes.items() if not there]
    # the failure the steps quote is the one the tests give
    quoted = re.search(r'"(no reference for) NAME"', text)
    assert quoted, "the steps quote the missing reference's failure"
    with pytest.raises(LookupError, match=f"^{quoted.group(1)} throwaway: add one to {scheme_references.HOME}"):
        scheme_references.reference("throwaway")


def test_the_docs_table_has_every_scheme():
    rows = [line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith("| `")]
    in_docs = [re.match(r"\| `(\w+)`", line).group(1) for line in rows]
    assert in_docs == list(SCHEMES), "docs/position_schemes.md's table: one row per row of SCHEMES, in its order"


def test_a_row_without_its_model_class_fails_naming_the_class_the_steps_show(monkeypatch):
    """Step 2's model class: the plugins' import checks that every row of position_transformer's family has its
    class, in the table's order; a row without one fails naming the class to write, which is the steps' form."""
    from fairseq_plugins.models import position_transformer as pt

    pt.check_family_models()  # today's table and classes
    monkeypatch.setitem(SCHEMES, "throwaway", dataclasses.replace(SCHEMES["alibi"], name="throwaway",
                                                                  arch_prefix="throwaway_transformer"))
    decorator, = (n for n in named(steps()) if n.startswith("@register_model("))
    cls, = (n for n in named(steps()) if n.startswith("class <Name>"))
    form = f"{decorator} {cls}".replace("<name>", "throwaway").replace("<Name>", "Throwaway")
    last = FAMILY_SCHEMES[-1]
    with pytest.raises(ImportError, match=f"scheme throwaway needs its model class, after the class of {last} "
                                          rf"\(the table's order\): {re.escape(form)}$"):
        pt.check_family_models((*FAMILY_SCHEMES, "throwaway"))
    # a class missing, or out of the table's order, is named the same way
    without = {n: m for n, m in pt.FAMILY_MODELS.items() if n != "rope"}
    with pytest.raises(ImportError, match=r"scheme rope needs its model class, after the class of fire .*"
                                          r"class RopeTransformerModel\(PositionTransformerModel, family=\"rope\"\)"):
        pt.check_family_models(models=without)
