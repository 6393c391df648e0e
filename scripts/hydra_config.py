#!/usr/bin/env python3
"""Compose a Hydra config exactly as `fairseq-hydra-train --config-dir configs --config-name NAME` does, and
read values from it or build its model (no data, no training).

    scripts/hydra_config.py get NAME KEY [KEY ...] [--override k=v ...]
        one line per KEY (dotted path); lists print comma-separated, None prints as "null"
    scripts/hydra_config.py params NAME --dict-dir DIR [--override k=v ...]
        builds task + model (on torch's meta device: no memory, no init) and prints the parameter count
    scripts/hydra_config.py check [NAME ...]
        composes every given config (default: the toy configs and every WMT14 cell) and prints "NAME ok" or
        the error
    scripts/hydra_config.py name NAME
        what fairseq-hydra-train is given for NAME: "CONFIG [OVERRIDE ...]" on one line (scripts/train.sh)

NAME is a config file's name (configs/NAME.yaml: toy_recipe) or a WMT14 cell's experiment name,
wmt14_<pair>_<size>_<scheme>, which stands for `--config-name wmt14 pair=<pair> size=<size> scheme=<scheme>`
(configs/wmt14/README.md); a name that is neither, or a scheme the papers do not run at that pair and size,
is refused in one line.

How fairseq-hydra-train composes: it stores fairseq's FairseqConfig dataclass in Hydra's ConfigStore under the
*primary config's name*, so Hydra merges the primary file onto that schema (every field at its dataclass
default), then merges the defaults list in order, then the command-line overrides; then fairseq's add_defaults
fills task/criterion/optimizer/... sections from their registered dataclasses. The model section of a legacy
(argparse) model stays free-form: the architecture function named by `model._name` runs when the model is built.
Because the schema comes with the primary file, a primary config whose `_self_` came last would reset every
value its defaults list set; so configs/wmt14.yaml lists `_self_` first and keeps all values in the parts it
includes (configs/wmt14/README.md). The scheme configs name their architecture through
${hydra:runtime.choices...}, which fairseq-hydra-train resolves inside its run: compose sets Hydra's config
the same way before resolving.
"""
import argparse
import copy
import os
import sys
import warnings
from pathlib import Path

from tooling import cells

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "configs"
_STORE_READY = False


def _import_fairseq():
    from fairseq import models, tasks, utils  # noqa: F401  (fills the registries add_defaults reads)

    utils.import_user_module(argparse.Namespace(user_dir=str(REPO / "fairseq_plugins")))


class ConfigError(ValueError):
    """A config name or a pair/size/scheme that does not exist: its message is one line."""


def resolve_name(name, config_dir=CONFIG_DIR):
    """(config name, overrides) for NAME: a config file's name (toy_recipe), or a WMT14 cell's experiment name
    (wmt14_en_de_big_rope -> wmt14 with pair=en_de size=big scheme=rope). ConfigError in one line otherwise."""
    if (Path(config_dir) / f"{name}.yaml").exists():
        return name, []
    cell = cells.CELL.fullmatch(name)
    if not cell:
        raise ConfigError(f"{name}: no config {Path(config_dir) / name}.yaml and not a WMT14 cell name "
                          "(wmt14_<pair>_<size>_<scheme>)")
    options = cells.choices(config_dir)
    for group, opts in options.items():
        if cell.group(group) not in opts:
            raise ConfigError(f"{name}: no {group} {cell.group(group)!r} in {Path(config_dir) / group}/ "
                              f"(expected one of {', '.join(opts)})")
    refused = cells.restriction(cell.group("scheme"), cell.group("pair"), cell.group("size"), config_dir)
    if refused:
        raise ConfigError(f"{name}: scheme={cell.group('scheme')} exists for {cells.allowed(refused, config_dir)} "
                          f"only, not pair={cell.group('pair')} size={cell.group('size')} (configs/{refused}/)")
    return cells.PRIMARY, cells.overrides(name, config_dir)


def compose(name, overrides=(), config_dir=CONFIG_DIR):
    """The resolved, struct-mode config fairseq-hydra-train would train `name` with (a config name, or a
    WMT14 cell's experiment name: resolve_name)."""
    from fairseq.dataclass.initialize import add_defaults, hydra_init
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    global _STORE_READY
    name, cell_overrides = resolve_name(name, config_dir)
    _import_fairseq()
    if _STORE_READY:  # the per-field entries hydra_init also stores are there already: only the schema
        from fairseq.dataclass.configs import FairseqConfig

        ConfigStore.instance().store(name=name, node=FairseqConfig)
    else:
        hydra_init(name)
        _STORE_READY = True
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="(?s).*validated against ConfigStore schema")
            # version base 1.1, as fairseq-hydra-train (which names none): the base is process-wide, and under
            # >= 1.2 fairseq's own convert_namespace_to_omegaconf (hydra.experimental) refuses to run afterwards
            with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base="1.1"):
                cfg = hydra_compose(name, overrides=[*cell_overrides, *overrides], return_hydra_config=True)
    finally:
        # hydra_init stored the schema under this name; Hydra deep-copies the whole store on every
        # compose, so composing many configs in one process would slow down with each name kept
        ConfigStore.instance().repo.pop(f"{name}.yaml", None)
    # The scheme configs name their architecture through ${hydra:runtime.choices...}, which reads Hydra's own
    # config: set it as fairseq-hydra-train's run does, and resolve before it is gone.
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    add_defaults(cfg)
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    OmegaConf.set_struct(cfg, True)
    return cfg


def override_refusal(name, overrides, config_dir=CONFIG_DIR):
    """None when `overrides` compose with NAME; else one line, "OVERRIDE: NAME: what Hydra said", naming the first
    override that fails on its own (a mistyped key, a value of the wrong type). scripts/submit_paper.py checks
    every cell so, before it queues anything."""
    err = _composition_error(name, overrides, config_dir)
    if err is None:
        return None
    culprit = next((o for o in overrides if _composition_error(name, [o], config_dir)), " ".join(overrides))
    detail = str(err).strip().splitlines()[0].rstrip(".") if str(err).strip() else type(err).__name__
    if err.__cause__ is not None and str(err.__cause__).strip():
        detail += f" ({str(err.__cause__).strip().splitlines()[0]})"
    return f"{culprit}: {name}: {detail}"


def _composition_error(name, overrides, config_dir):
    """The exception composing NAME with `overrides` raises, or None."""
    try:
        compose(name, overrides, config_dir)
    except Exception as err:  # Hydra's and OmegaConf's composition errors have no common base
        return err
    return None


def select(cfg, key):
    from omegaconf import OmegaConf

    sentinel = object()
    value = OmegaConf.select(cfg, key, default=sentinel)
    if value is sentinel:
        raise KeyError(f"{key}: no such key in the composed config")
    return value


def format_value(value):
    from omegaconf import OmegaConf

    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return ",".join(format_value(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def count_parameters(model):
    """Unique parameters (shared embeddings counted once), as fairseq's 'num. shared model params'."""
    return sum(p.numel() for p in model.parameters())


def build_model(cfg, dict_dir, meta=True):
    """fairseq-train's set-up: setup_task(cfg.task) + task.build_model(cfg.model), with task.data = dict_dir
    (a directory holding dict.SRC.txt / dict.TGT.txt is enough: no dataset is loaded)."""
    import torch
    from fairseq import tasks
    from fairseq.dataclass.initialize import add_defaults

    cfg = copy.deepcopy(cfg)  # the caller's config stays as composed
    add_defaults(cfg)  # as fairseq_cli/train.py's main does again; it also lifts struct mode
    cfg.task.data = str(dict_dir)
    task = tasks.setup_task(cfg.task)
    if meta:
        with torch.device("meta"):
            return task.build_model(cfg.model)
    return task.build_model(cfg.model)


def cli_build_model(argv, meta=True):
    """The same through fairseq-train's command line: argv as given to fairseq-train (DATA --arch ... )."""
    import torch
    from fairseq import options, tasks

    _import_fairseq()
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["--user-dir", str(REPO / "fairseq_plugins"), *argv])
    task = tasks.setup_task(args)
    if meta:
        with torch.device("meta"):
            return task.build_model(args)
    return task.build_model(args)


def config_names(config_dir=CONFIG_DIR):
    """Every config that composes on its own (the toy ones) and every WMT14 cell by its experiment name."""
    files = [p.stem for p in Path(config_dir).glob("*.yaml") if p.stem != cells.PRIMARY]
    return sorted(files + cells.wmt14_cells(config_dir))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    get = sub.add_parser("get")
    get.add_argument("name")
    get.add_argument("keys", nargs="+")
    params = sub.add_parser("params")
    params.add_argument("name")
    params.add_argument("--dict-dir", required=True)
    check = sub.add_parser("check")
    check.add_argument("names", nargs="*")
    name = sub.add_parser("name")
    name.add_argument("name")
    for p in (get, params, check, name):
        p.add_argument("--config-dir", default=str(CONFIG_DIR))
        p.add_argument("--override", nargs="*", default=[], help="Hydra overrides, as on the command line")
    args = ap.parse_args()

    import logging

    logging.disable(logging.WARNING)  # fairseq/hydra chatter would mix into the printed values
    import warnings

    warnings.filterwarnings("ignore")  # Hydra's automatic-schema-matching deprecation notice

    if args.cmd == "name":
        try:
            config, overrides = resolve_name(args.name, args.config_dir)
        except ConfigError as err:
            sys.exit(f"hydra_config.py: {err}")
        print(" ".join([config, *overrides]))
    elif args.cmd == "get":
        try:
            cfg = compose(args.name, args.override, args.config_dir)
            for key in args.keys:
                print(format_value(select(cfg, key)))
        except ConfigError as err:
            sys.exit(f"hydra_config.py: {err}")
        except KeyError as err:
            sys.exit(f"hydra_config.py: {args.name}: {err.args[0]}")
    elif args.cmd == "params":
        try:
            cfg = compose(args.name, args.override, args.config_dir)
        except ConfigError as err:
            sys.exit(f"hydra_config.py: {err}")
        print(count_parameters(build_model(cfg, args.dict_dir)))
    else:
        failed = 0
        for name in args.names or config_names(args.config_dir):
            try:
                compose(name, args.override, args.config_dir)
                print(f"{name} ok")
            except Exception as err:  # report every config, then fail
                failed += 1
                cause = err.__cause__ or err
                print(f"{name} FAILED: {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}")
        sys.exit(1 if failed else 0)


if __name__ == "__main__":
    os.environ.setdefault("PWD", os.getcwd())
    main()
