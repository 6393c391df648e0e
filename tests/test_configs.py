"""The WMT14 Hydra configs: every cell (configs/wmt14.yaml with pair, size and scheme) composes as
fairseq-hydra-train composes it, into exactly the config its flat file of old did, pins the papers'
hyper-parameters and builds the same model as the command line does for its architecture.
(scripts/train.sh training a tiny config: tests/test_launchers.py.)

Models are built on torch's meta device (shapes only) over a 1,000-word fake dictionary, so the big ones
cost nothing."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import BIN, REPO, env, run

import hydra_config
from fairseq_plugins.schemes import SCHEMES
from tooling import cells

CELLS = cells.wmt14_cells()
FLAT = json.loads((REPO / "tests" / "data" / "wmt14_cells.json").read_text(encoding="utf-8"))
VOCAB = 1000  # 996 words + fairseq's 4 specials
COMMON = {"optimizer.adam_betas": "(0.9,0.98)", "lr_scheduler._name": "inverse_sqrt", "lr_scheduler.warmup_updates": 4000,
          "criterion._name": "label_smoothed_cross_entropy", "criterion.label_smoothing": 0.1, "generation.beam": 4,
          "generation.lenpen": 0.6, "model.share_all_embeddings": True, "optimization.clip_norm": 0.0}


def parse(name):
    """(pair, size, method) from wmt14_<en_xx>_<size>_<method>."""
    m = re.fullmatch(r"wmt14_(en_de|en_fr)_(base|big)_(.+)", name)
    return m.group(1), m.group(2), m.group(3)


@pytest.fixture(scope="module")
def dict_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("dicts")
    for lang in ("en", "de", "fr"):
        (d / f"dict.{lang}.txt").write_text("".join(f"w{i} 1\n" for i in range(VOCAB - 4)))
    return d


@pytest.fixture(scope="module")
def composed():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = hydra_config.compose(name)
        return cache[name]

    return get


def value(cfg, key):
    return hydra_config.select(cfg, key)


def scheme_parameters(scheme, dim, heads):
    """The parameters a scheme adds to a Transformer: its module in each stack's self-attention, as its class
    builds it with its flags' defaults (T5: one table of 32 buckets × heads; KERPLE: (r1, r2) per head; FIRE: its
    MLP 1-32-heads, c, λ; most: none)."""
    cls, args = SCHEMES[scheme].cls, argparse.Namespace()
    cls.defaults(args)
    modules = [cls.build(args, heads, dim // heads, causal) for causal in (False, True)]
    return sum(p.numel() for m in modules if m is not None for p in m.parameters())


def test_cells_cover_the_tables():
    methods = {"transformer", "transformer_learned", "every_layer_sinusoidal", "every_layer_learned", "relative",
               "floater_all", "floater_input", "floater_all_warm", "floater_input_warm", "shaw_absolute"}
    for pair in ("en_de", "en_fr"):
        for size in ("base", "big"):
            assert {f"wmt14_{pair}_{size}_{m}" for m in methods} <= set(CELLS)
    assert {f"wmt14_en_de_base_relative_k{k}" for k in (0, 1, 2, 4, 64, 256)} <= set(CELLS)
    from fairseq_plugins.schemes import NEW_SCHEMES

    assert {f"wmt14_{pair}_{size}_{s}" for pair in ("en_de", "en_fr") for size in ("base", "big")
            for s in NEW_SCHEMES} <= set(CELLS)


def flatten(section, prefix=""):
    out = {}
    for key, val in section.items():
        if isinstance(val, dict) and val:
            out.update(flatten(val, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = val
    return out


# the table's schemes added after the flat layout (a configs/scheme/<name>.yaml, no flat file to compare with):
# their cells are the transformer's recipe
LATER_SCHEMES = tuple(n for n in SCHEMES
                      if f"wmt14_en_de_base_{n}" in CELLS and f"wmt14_en_de_base_{n}" not in FLAT["cells"])
LATER_CELLS = sorted(f"wmt14_{p}_{s}_{scheme}" for scheme in LATER_SCHEMES for p in ("en_de", "en_fr")
                     for s in ("base", "big"))


# FLOATER as its authors' code trains it: the floater_all cell (warm-started or not) with their training flags
AUTHORS_SCHEMES = {"floater_all_authors": "floater_all", "floater_all_authors_warm": "floater_all_warm"}
AUTHORS_CELLS = sorted(f"wmt14_{p}_{s}_{scheme}" for scheme in AUTHORS_SCHEMES for p in ("en_de", "en_fr")
                       for s in ("base", "big"))
AUTHORS_FLAGS = {"model.floater_dt": 0.01, "model.floater_adjoint": True, "model.floater_cache_whole_bias": True,
                 "model.floater_flow_init": "xavier"}


def test_the_cells_are_the_flat_configs_they_replace():
    """The composed layout offers the 77 cells the flat configs/wmt14_*.yaml files of old were, and four cells of
    each scheme added since."""
    assert sorted(set(CELLS) - set(LATER_CELLS) - set(AUTHORS_CELLS)) == sorted(FLAT["cells"])
    assert set(LATER_CELLS) <= set(CELLS) and set(AUTHORS_CELLS) <= set(CELLS)


@pytest.mark.parametrize("name", AUTHORS_CELLS)
def test_an_authors_cell_is_the_floater_cell_with_their_training(name, composed):
    """The floater_all(_warm) cell plus Δ = 0.01, the adjoint, the whole bias cached, Xavier W2, and the re-solve
    every 400 forwards of the recipe's batch in updates: 400 / update_freq of the recipe's 8 GPUs."""
    from omegaconf import OmegaConf

    pair, size, method = parse(name)
    got, want = (flatten(OmegaConf.to_container(composed(n)))
                 for n in (name, f"wmt14_{pair}_{size}_{AUTHORS_SCHEMES[method]}"))
    differences = {k: got.get(k) for k in set(got) | set(want) if got.get(k) != want.get(k)}
    every = 400 // got["optimization.update_freq"][0]
    assert got["distributed_training.distributed_world_size"] == 8 and every == (400 if size == "base" else 25)
    assert differences == {**AUTHORS_FLAGS, "model.floater_update_every": every}


@pytest.mark.parametrize("name", LATER_CELLS)
def test_a_later_schemes_cell_is_the_transformer_cell_with_its_architecture(name, composed):
    """A table scheme's cell: the Transformer row's recipe and dims, only the architecture differs (as every table
    scheme's flat file was)."""
    from omegaconf import OmegaConf

    scheme = next(s for s in LATER_SCHEMES if name.endswith(f"_{s}"))
    transformer = name[: -len(scheme)] + "transformer"
    got, want = (flatten(OmegaConf.to_container(composed(n))) for n in (name, transformer))
    differences = {k: (got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k)}
    assert differences.pop("model._name") == (f"{scheme}_{want['model._name']}", want["model._name"])
    own = {f"model.{flag.dest}" for flag in SCHEMES[scheme].cls.flags}  # the scheme's own flags, if it sets any
    assert set(differences) <= own, differences


@pytest.mark.parametrize("name", sorted(FLAT["cells"]))
def test_composed_cell_is_exactly_its_flat_config(name, composed):
    """Every resolved value, defaults included, equals the committed resolution of the cell's flat file."""
    from omegaconf import OmegaConf

    pwd = os.environ["PWD"]  # what ${oc.env:PWD} gave: the fixture was resolved with PWD=/REPO
    got = {k: FLAT["pwd"] + v[len(pwd):] if isinstance(v, str) and v.startswith(pwd + "/") else v
           for k, v in flatten(OmegaConf.to_container(composed(name))).items()}
    want = {**FLAT["common"], **FLAT["cells"][name]}
    differences = {k: (got.get(k, "<absent>"), want.get(k, "<absent>")) for k in set(got) | set(want)
                   if got.get(k, "<absent>") != want.get(k, "<absent>")}
    assert not differences, f"{name}: (composed, flat) {differences}"


@pytest.mark.parametrize("name, message", [
    ("wmt14_en_fr_big_relative_k4", "wmt14_en_fr_big_relative_k4: scheme=relative_k4 exists for en_de base only, "
                                    "not pair=en_fr size=big (configs/wmt14/only_en_de_base/)"),
    ("wmt14_en_de_base_rotary", "wmt14_en_de_base_rotary: no scheme 'rotary' in "),
    ("wmt14_en_es_base_rope", "wmt14_en_es_base_rope: no pair 'en_es' in "),
    ("wmt15_en_de_base_rope", "wmt15_en_de_base_rope: no config "),
])
def test_a_cell_that_does_not_exist_is_refused_in_one_line(name, message):
    for cmd in (["name", name], ["get", name, "model._name"]):
        proc = run([sys.executable, "scripts/hydra_config.py", *cmd], check=False)  # stderr into stdout
        assert proc.returncode == 1
        assert proc.stdout.startswith(f"hydra_config.py: {message}") and proc.stdout.count("\n") == 1, proc.stdout


def test_fairseq_hydra_train_refuses_a_scheme_at_a_pair_and_size_it_lacks():
    """Hydra itself, without our scripts: its first line names the scheme, the group and the cell asked for."""
    proc = run([str(BIN / "fairseq-hydra-train"), "--config-dir", "configs", "--config-name", "wmt14", "pair=en_fr",
                "size=big", "scheme=relative_k4", "--cfg", "job"], check=False)
    assert proc.returncode == 1
    assert "In 'scheme/relative_k4': Could not find 'wmt14/only_en_de_base/en_fr_big'" in proc.stdout, proc.stdout


def test_fairseq_hydra_train_resolves_a_cell_as_compose_does(composed):
    """The architecture name comes through ${hydra:runtime.choices...}: fairseq-hydra-train's own resolution
    gives the big En-Fr RoPE cell the same model section as hydra_config.compose."""
    proc = subprocess.run([str(BIN / "fairseq-hydra-train"), "--config-dir", "configs", "--config-name", "wmt14",
                           "pair=en_fr", "size=big", "scheme=rope", "--cfg", "job", "--resolve"],
                          cwd=REPO, env=env(), text=True, capture_output=True, check=True)
    printed = yaml.safe_load(proc.stdout)
    assert printed["model"] == {"_name": "rope_transformer_vaswani_wmt_en_de_big", "dropout": 0.1,
                                "share_all_embeddings": True}
    assert printed["model"] == dict(composed("wmt14_en_fr_big_rope").model)


def test_a_new_scheme_is_one_file(tmp_path):
    """A scheme config added to configs/scheme/ gives its four cells, each with its size's architecture."""
    config_dir = tmp_path / "configs"
    shutil.copytree(REPO / "configs", config_dir)
    (config_dir / "scheme" / "alibi_again.yaml").write_text(
        "# @package _global_\nmodel:\n  _name: alibi_transformer_${hydra:runtime.choices.wmt14/arch_size}\n")
    added = sorted(set(cells.wmt14_cells(config_dir)) - set(CELLS))
    assert added == [f"wmt14_{p}_{s}_alibi_again" for p in ("en_de", "en_fr") for s in ("base", "big")]
    cfg = hydra_config.compose("wmt14_en_fr_big_alibi_again", config_dir=config_dir)
    assert (cfg.model._name, cfg.model.dropout, cfg.task.target_lang) == ("alibi_transformer_vaswani_wmt_en_de_big",
                                                                          0.1, "fr")


@pytest.mark.parametrize("name", CELLS)
def test_cell_composes_with_the_papers_settings(name, composed):
    cfg = composed(name)
    pair, size, method = parse(name)
    for key, expected in COMMON.items():
        assert value(cfg, key) == expected, key
    assert value(cfg, "task.target_lang") == pair[-2:]
    assert value(cfg, "task.data").endswith(f"data/wmt14_{pair}/bin")
    tokens = value(cfg, "distributed_training.distributed_world_size") * value(cfg, "dataset.max_tokens") \
        * value(cfg, "optimization.update_freq")[0]
    lr = value(cfg, "optimization.lr")[0]
    warm = method.endswith("_warm")
    if method.startswith("relative") or method == "shaw_absolute":  # Shaw §4.1
        assert tokens == 8 * 4096
        assert value(cfg, "optimizer.adam_eps") == 1e-9
        assert lr == pytest.approx((512 if size == "base" else 1024) ** -0.5 * 4000 ** -0.5, rel=1e-3)
        assert value(cfg, "optimization.max_update") == (100_000 if size == "base" else 300_000)
        assert value(cfg, "checkpoint.keep_interval_updates") == (1 if size == "base" else 20)
    else:  # FLOATER App. B on fairseq's recipe
        assert tokens == (8 * 4096 if size == "base" else 8 * 3584 * 16)
        base_lr = 7e-4 if size == "base" else 1e-3
        assert lr == pytest.approx(base_lr / 2 if warm else base_lr)
        epochs = value(cfg, "optimization.max_epoch")
        if warm:
            assert epochs == (10 if pair == "en_de" else 1)
            assert value(cfg, "checkpoint.finetune_from_model").endswith("/warm_start.pt")
        else:
            assert epochs == (30 if pair == "en_de" else 3)
        if pair == "en_de":
            assert value(cfg, "checkpoint.keep_last_epochs") == 5 and not value(cfg, "checkpoint.no_epoch_checkpoints")
        else:
            assert value(cfg, "checkpoint.keep_interval_updates") == 5 and value(cfg, "checkpoint.no_epoch_checkpoints")
    if method.startswith("floater"):
        assert value(cfg, "model.floater_layers") == ("all" if "_all" in method else "input")


def expected_transformer_parameters(d, ffn, layers, vocab):
    """fairseq's Transformer with shared embeddings, post-norm, sinusoidal positions (no parameters): the
    textbook count (the patch removes the unused parameter copies fairseq 0.12.2 kept for its BetterTransformer
    fast path, so nothing else is counted)."""
    attention = 4 * (d * d + d)
    feed_forward = d * ffn + ffn + ffn * d + d
    encoder_layer = attention + feed_forward + 2 * 2 * d
    decoder_layer = 2 * attention + feed_forward + 3 * 2 * d
    textbook = vocab * d + layers * (encoder_layer + decoder_layer)
    return textbook


def cli_argv(cfg, dict_dir):
    return [str(dict_dir), "--arch", value(cfg, "model._name"), "--share-all-embeddings",
            "--source-lang", "en", "--target-lang", value(cfg, "task.target_lang")]


# one config per distinct model section (warm-start and ablation cells share their models with others)
MODEL_CELLS = [n for n in CELLS if not n.endswith("_warm") and not re.search(r"_relative_\w+$", n)] + \
    ["wmt14_en_de_base_relative_k4", "wmt14_en_de_base_relative_values_only"]


@pytest.mark.parametrize("name", MODEL_CELLS)
def test_model_matches_the_command_line(name, composed, dict_dir):
    """The model fairseq-hydra-train builds (model._name runs the architecture function) has exactly the
    parameters of `fairseq-train --arch <same arch>` with the same flags; Transformers also match the formula."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    cfg = composed(name)
    arch = value(cfg, "model._name")
    assert arch in ARCH_MODEL_REGISTRY, f"{name}: architecture {arch} is not registered"
    model = hydra_config.build_model(cfg, dict_dir)
    hydra_count = hydra_config.count_parameters(model)

    from fairseq import options, tasks
    import torch

    hydra_config._import_fairseq()
    args = options.parse_args_and_arch(options.get_training_parser(),
                                       ["--user-dir", str(REPO / "fairseq_plugins"), *cli_argv(cfg, dict_dir)])
    for key, val in value(cfg, "model").items():  # the section's flags, as if given on the command line
        if key != "_name":
            setattr(args, key, val)
    with torch.device("meta"):
        cli_count = hydra_config.count_parameters(tasks.setup_task(args).build_model(args))
    assert hydra_count == cli_count

    if arch in ("transformer_wmt_en_de", "transformer_vaswani_wmt_en_de_big"):
        big = "big" in arch
        d, section = (1024 if big else 512), value(cfg, "model")
        ffn = section.get("encoder_ffn_embed_dim") or (4096 if big else 2048)
        textbook = expected_transformer_parameters(d, ffn, 6, VOCAB)
        if section.get("encoder_learned_pos"):  # two tables of 1024 positions (+ fairseq's padding offset of 2)
            textbook += 2 * (1024 + 2) * d
        assert hydra_count == textbook
        if name == "wmt14_en_de_base_transformer":  # the well-known figure: 44.1M + the embeddings
            assert textbook - VOCAB * 512 == 44_138_496
    scheme = re.match(r"(\w+?)_transformer_(wmt_en_de|vaswani_wmt_en_de_big)$", arch)
    from fairseq_plugins.schemes import NEW_SCHEMES

    if scheme and scheme.group(1) in NEW_SCHEMES:  # the table's schemes
        big = "big" in arch
        d, heads = (1024, 16) if big else (512, 8)
        textbook = expected_transformer_parameters(d, 4096 if big else 2048, 6, VOCAB)
        assert hydra_count == textbook + scheme_parameters(scheme.group(1), d, heads)


def test_big_en_fr_dropout(composed, dict_dir):
    """fairseq's *_wmt_en_fr_big archs differ from En-De's only in dropout (0.1 vs 0.3): so do the cells."""
    de = hydra_config.build_model(composed("wmt14_en_de_big_transformer"), dict_dir)
    fr = hydra_config.build_model(composed("wmt14_en_fr_big_transformer"), dict_dir)
    assert (de.args.dropout, fr.args.dropout) == (0.3, 0.1)


def test_get_cli_prints_values(composed):
    """What scripts/train.sh and scripts/evaluate.sh read from a config."""
    out = run([sys.executable, "scripts/hydra_config.py", "get", "wmt14_en_de_big_relative", "optimization.lr",
               "model.max_relative_positions", "dataset.max_tokens", "optimization.update_freq",
               "checkpoint.finetune_from_model"]).stdout.split()
    assert out == ["0.0004941", "8", "4096", "1", "null"]
    with pytest.raises(KeyError, match="no.such.key: no such key"):
        hydra_config.select(composed("toy_recipe"), "no.such.key")



def test_composing_a_config_leaves_fairseqs_own_config_conversion_working():
    """Hydra's version base is process-wide: a compose under base >= 1.2 made fairseq's
    convert_namespace_to_omegaconf (hydra.experimental) raise ImportError for the rest of the process."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    hydra_config.compose("toy_transformer")
    args = options.parse_args_and_arch(options.get_training_parser(), ["data-bin", "--arch", "transformer_tiny"])
    assert convert_namespace_to_omegaconf(args).model.arch == "transformer_tiny"
