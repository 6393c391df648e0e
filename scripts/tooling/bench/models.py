"""The benchmark's models and batches, built through fairseq's own APIs (tooling.bench.phases, tooling.bench.regime,
tooling.bench.ops and the GPU check's section floater_graph import them).

    ARCHS[dims][model]     (architecture, flags) of every scheme of the table, at equal dims per size
    model_specs(dims, N)   name -> (arch, flags, kind) of every model the benchmark compares (FLOATER exact and cached;
                           the baseline twice: fairseq's attention and the plugins')
    building(kind)         the context a model of that kind is built in
    Bundle.build(...)      task, model, criterion and fairseq's Adam, as fairseq-train builds them; .train_update
    random_batch(...)      B random sentences of T tokens on both sides, laid out as fairseq's collater does
"""
import argparse
import logging
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Optional

import torch

# fairseq 0.12.2's Hydra 1.0-era config calls and its torch.cuda.amp.autocast call warn on every model build/update
warnings.filterwarnings("ignore", category=UserWarning, message=r"(?s).*(hydra|[Cc]onfig[Ss]tore|version_base|strict flag|package header)")
warnings.filterwarnings("ignore", category=FutureWarning, message=r".*torch\.cuda\.amp\.autocast")
logging.getLogger("fairseq.utils").setLevel(logging.WARNING)  # "--user-dir ... has already been imported"

from fairseq_plugins.schemes import MODELS as SCHEME_TABLE  # noqa: E402  (the table of schemes)
from tooling.paths import REPO  # noqa: E402

PLUGINS = REPO / "fairseq_plugins"
COMMON_FLAGS = [
    "--task", "translation", "--share-all-embeddings",
    "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
]
PRELOAD = ["fairseq_plugins", "fairseq.options", "fairseq.optim", "fairseq.tasks.translation",
           "fairseq.sequence_generator", "torch._dynamo"]  # torch.optim imports torch._dynamo on first use

# The compared models, from the table of schemes (fairseq_plugins/schemes.py): (architecture, extra
# flags) per size. The base relative arch pins Shaw et al.'s FFN of 1024, so every model gets
# --encoder/decoder-ffn-embed-dim 1024: every model has the same dims and differs only in its position scheme.
BASE_FFN = ["--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024"]
ARCHS = {dims: {name: (scheme.arch(dims), list(scheme.flags) + (BASE_FFN if dims == "base" else []))
                for name, scheme in SCHEME_TABLE.items()}
         for dims in ("base", "big", "tiny")}
SCHEME_NAMES = tuple(n for n in SCHEME_TABLE if n not in ("transformer", "relative", "floater"))
BASELINE = "transformer"
GRAPH = "floater_graph"  # the exact FLOATER with --floater-cuda-graph
# The baseline again with its self-attention through the plugins' (PositionalSelfAttention: torch's fused
# scaled_dot_product_attention with the scheme's float mask), as every score-bias scheme's: the same model (same
# parameters, names and maths), so a scheme's ratio to it is its scheme's cost alone, and a scheme cannot look fast
# because fairseq's attention is slow (its ratio to BASELINE says that one)
PLUGIN_BASELINE = "transformer_plugin_attention"
PLUGIN_ATTENTION = "plugin_attention"  # its kind
# what fairseq's architecture functions set per size and position_transformer's must be given to match them
DIMS = ("encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_layers", "encoder_attention_heads",
        "decoder_embed_dim", "decoder_ffn_embed_dim", "decoder_layers", "decoder_attention_heads",
        "dropout", "attention_dropout", "activation_dropout")
SHARED = "floater_shared"  # the exact FLOATER with --floater-shared-solve (one solve per --update-freq update)
# the update without per-tensor bookkeeping or reads of device values (the speed check's and exactness's "fused")
FUSED_UPDATE = ("--fused-update", "--adam-impl", "torch")


def model_specs(dims, floater_every, archs=None):
    """name -> (arch, flags, kind) for every model bench can compare (FLOATER twice: exact and cached); `archs`:
    ARCHS[dims] unless given."""
    archs = archs or ARCHS[dims]
    return {
        "transformer": (*archs["transformer"], "transformer"),
        "relative": (*archs["relative"], "relative"),
        "floater": (archs["floater"][0], archs["floater"][1] + ["--floater-update-every", "1"], "floater"),
        f"floater_every{floater_every}": (
            archs["floater"][0], archs["floater"][1] + ["--floater-update-every", str(floater_every)], "floater"),
        GRAPH: (archs["floater"][0], archs["floater"][1] + ["--floater-update-every", "1", "--floater-cuda-graph"],
                "floater"),
        SHARED: (archs["floater"][0], archs["floater"][1] + ["--floater-update-every", "1", "--floater-shared-solve"],
                 "floater"),
        **{name: (*archs[name], name) for name in SCHEME_NAMES},
        PLUGIN_BASELINE: ("position_transformer", ["--position-scheme", "sinusoidal", *size_flags(dims),
                                                   *archs["transformer"][1]], PLUGIN_ATTENTION),
    }


def size_flags(dims):
    """The flags that give position_transformer (fairseq's base dims) the dims of the table's size `dims`."""
    from fairseq_plugins.models.position_transformer import SIZE_DIMS

    args = argparse.Namespace()
    SIZE_DIMS[dims](args)
    return [x for name in DIMS for x in (f"--{name.replace('_', '-')}", str(getattr(args, name)))]


@contextmanager
def _null_scheme_attention():
    """Sinusoidal stacks whose self-attention is the plugins' with a scheme that adds nothing (the contract's
    defaults: no projection bias, no rotation, no logit bias): fairseq's Transformer through PositionalSelfAttention."""
    from fairseq_plugins.modules.position_scheme import PositionScheme, Sinusoidal

    own = "build" in Sinusoidal.__dict__  # else PositionScheme's, inherited
    saved = Sinusoidal.__dict__.get("build")
    Sinusoidal.build = classmethod(lambda cls, cfg, heads, head_dim, causal: PositionScheme())
    try:
        yield
    finally:
        if own:
            Sinusoidal.build = saved
        else:
            del Sinusoidal.build


def building(kind):
    """The context a model of `kind` (model_specs' third field) is built in."""
    return _null_scheme_attention() if kind == PLUGIN_ATTENTION else nullcontext()


def synthetic_dictionary(size):
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(size - len(d)):
        d.add_symbol(f"w{i}")
    return d


@dataclass
class Bundle:
    """One model as fairseq-train holds it: task, model, criterion, fairseq's Adam, and the update counter."""

    task: Any
    model: torch.nn.Module
    criterion: Any
    optimizer: Any
    updates: int = 1
    kind: Optional[str] = None

    @classmethod
    def build(cls, arch, flags, dictionary, device, seed, kind=None):
        """Parse `--arch arch flags` with fairseq's training parser and build as fairseq-train does, seeded."""
        from fairseq import optim, options
        from fairseq.tasks.translation import TranslationTask

        argv = ["unused-data-dir", "--user-dir", str(PLUGINS), "--arch", arch, *COMMON_FLAGS, *flags]
        args = options.parse_args_and_arch(options.get_training_parser(),
                                           argv + (["--cpu"] if device == "cpu" else []))
        task = TranslationTask(args, dictionary, dictionary)
        torch.manual_seed(seed)
        with building(kind):
            model = task.build_model(args).to(device)
        criterion = task.build_criterion(args).to(device)
        optimizer = optim.build_optimizer(args, [p for p in model.parameters() if p.requires_grad])
        return cls(task, model, criterion, optimizer, kind=kind)

    def train_update(self, sample):
        """One training update as fairseq's Trainer does it: zero grads, train_step (forward, criterion,
        backward), gradients divided by the sample size, gradient norm (no clipping), Adam step, update counter."""
        self.optimizer.zero_grad()
        _, sample_size, _ = self.task.train_step(sample, self.model, self.criterion, self.optimizer, self.updates)
        self.optimizer.multiply_grads(1.0 / (sample_size or 1.0))
        self.optimizer.clip_grad_norm(0.0)
        self.optimizer.step()
        self.updates += 1
        self.model.set_num_updates(self.updates)


def random_batch(dictionary, bsz, length, device, seed):
    """B sentences of `length` random tokens (last one EOS) on both sides, as fairseq's collater lays them out."""
    g = torch.Generator().manual_seed(seed)
    eos = dictionary.eos()

    def sentences():
        x = torch.randint(dictionary.nspecial, len(dictionary), (bsz, length), generator=g)
        x[:, -1] = eos
        return x

    src, tgt = sentences(), sentences()
    prev = torch.cat([torch.full((bsz, 1), eos), tgt[:, :-1]], dim=1)
    sample = {
        "id": torch.arange(bsz), "nsentences": bsz, "ntokens": bsz * length, "target": tgt,
        "net_input": {"src_tokens": src, "src_lengths": torch.full((bsz,), length), "prev_output_tokens": prev},
    }
    from fairseq import utils

    return utils.move_to_cuda(sample) if device == "cuda" else sample


