"""The WMT14 cells: experiment names ``wmt14_<pair>_<size>_<scheme>`` and the composed config each one is.

A cell is ``configs/wmt14.yaml`` with three choices, ``pair=<pair> size=<size> scheme=<scheme>`` (one file
each in ``configs/{pair,size,scheme}/``). Every (pair, size, scheme) exists unless the scheme's defaults list
names a group by ``${pair}_${size}`` (as the Shaw ablations name ``wmt14/only_en_de_base``): then only the
pairs and sizes that group has an option for exist, and Hydra itself refuses the others.
"""
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "configs"
PRIMARY = "wmt14"
CELL = re.compile(r"wmt14_(?P<pair>[a-z]+_[a-z]+)_(?P<size>[a-z]+)_(?P<scheme>\w+)")
RESTRICTION = "${pair}_${size}"  # a defaults-list option naming one pair and size


def choices(config_dir=CONFIG_DIR):
    """{group: sorted options} for pair, size and scheme."""
    return {g: sorted(p.stem for p in (Path(config_dir) / g).glob("*.yaml")) for g in ("pair", "size", "scheme")}


def overrides(name, config_dir=CONFIG_DIR):
    """The Hydra overrides of a cell name (``wmt14_en_de_big_rope`` -> pair=en_de size=big scheme=rope), or
    None when NAME is not of that form or names a pair, size or scheme that has no config."""
    m = CELL.fullmatch(name)
    if not m:
        return None
    options = choices(config_dir)
    if any(m.group(g) not in options[g] for g in options):
        return None
    return [f"{g}={m.group(g)}" for g in ("pair", "size", "scheme")]


def restriction(scheme, pair, size, config_dir=CONFIG_DIR):
    """None if the scheme exists at this pair and size; else the group (``wmt14/only_en_de_base``) refusing it."""
    raw = yaml.safe_load((Path(config_dir) / "scheme" / f"{scheme}.yaml").read_text(encoding="utf-8")) or {}
    for entry in raw.get("defaults", []):
        if isinstance(entry, dict):
            for group, option in entry.items():
                if option == RESTRICTION and not group.startswith("optional "):
                    group = group.lstrip("/")
                    if not (Path(config_dir) / group / f"{pair}_{size}.yaml").exists():
                        return group
    return None


def parent_scheme(scheme, config_dir=CONFIG_DIR):
    """The scheme a scheme's config builds on (the first plain entry of its defaults list: ``floater_all`` for
    ``floater_all_authors``), or None."""
    raw = yaml.safe_load((Path(config_dir) / "scheme" / f"{scheme}.yaml").read_text(encoding="utf-8")) or {}
    return next((entry for entry in raw.get("defaults", []) if isinstance(entry, str) and entry != "_self_"), None)


def allowed(group, config_dir=CONFIG_DIR):
    """The pairs and sizes a restriction group allows, as "en_de base, ..."."""
    return ", ".join(" ".join(p.stem.rsplit("_", 1)) for p in sorted((Path(config_dir) / group).glob("*.yaml")))


def wmt14_cells(config_dir=CONFIG_DIR):
    """Every cell's name, sorted."""
    options = choices(config_dir)
    return sorted(f"wmt14_{pair}_{size}_{scheme}" for scheme in options["scheme"] for pair in options["pair"]
                  for size in options["size"] if restriction(scheme, pair, size, config_dir) is None)
