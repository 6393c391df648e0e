"""The GPU check's plan and small shared pieces (scripts/gpu/gpu_check.py; docs/benchmarks.md): its sections with
their titles and caps, the dry run's caps, the bounds the verdicts judge by, and the helpers every part uses
(a section's rows file, one-line errors, paths for the report).

    SECTIONS       name -> (title, cap in seconds), in priority order; FIRST_CALL: the default call's sections
    *_BOUND        what the verdict table (tooling.gpu.verdicts) holds each check to
    Rows(path)     a section's rows, rewritten atomically after each one (the parent reads them at its end)
    CheckError     a bad input: one line for the user
"""
import contextlib
import sys
from pathlib import Path

from tooling.atomic import write_json

REPO = Path(__file__).resolve().parents[3]
PLUGINS = REPO / "fairseq_plugins"
SCRIPT = REPO / "scripts" / "gpu" / "gpu_check.py"  # each section runs in a process of its own: this script --section NAME
MODES = {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"], "amp": ["--amp"]}
DECODE_SHARDS = 5  # section precision decodes shard 0 of 5: on an H100, 16 jobs at a time took 70-80 s each with all 500
TRAINER_MODES = {"fp32": [], "amp": ["--amp"], "fp16": ["--fp16", "--fp16-init-scale", "16"], "bf16": ["--bf16"]}

# The sections in priority order: title and cap (seconds of wall time from the start of its process, imports
# included). Sized from the third H100 run (results/gpu_check/gpu_check_notes.md), where they took more than one command:
# floater_graph needs over 70 s in a call's first CUDA process (61 s when run again); precision is 60 jobs (15 archs
# × 4 modes), 62-98 s each with 16 side by side, about 300 s in all; bench's memory probes are a fresh process each.
# So the default call is machine, floater_graph, precision (480 s: with the set-up, 78 s there, and the toy data,
# under 10 minutes a command) and bench a second call. On the H200 (fourth run) the first three took 6, 72 and 302 s,
# but bench did not finish in 90 s (nor in 60 s on the H100): its cap is 180 s. A section "fused" (fused attention:
# --attention-backend flex against today's path) was removed with that backend, which never won on time
# (results/gpu_check/gpu_check_notes.md). The history files (results/gpu_check/gpu_check_*.md) letter the sections
# in this order: a machine, b floater_graph, c precision, d bench, e fused, f invariance, g users_path.
SECTIONS = {
    "machine": ("Machine", 20),
    "floater_graph": ("FLOATER's CUDA-graph solve against the loop", 100),
    "precision": ("Every arch × precision on the toy task", 360),
    "bench": ("Benchmark: the users' regime; FLOATER with and without CUDA graphs", 180),
    "invariance": ("Batch invariance and replay: every scheme alone vs batched; one seed twice", 240),
    "users_path": ("The users' path: train.sh, evaluate.sh, make_tables.py on a stand-in WMT14 En-De", 240),
}
FIRST_CALL = ("machine", "floater_graph", "precision")  # the default; the speed section bench: a second call
# The dry run's caps: a small CPU machine shared with other work takes many times an H100's seconds (the dry run
# itself is ~30 CPU-seconds, ~100 s of wall time on 2 cores under a load of 10)
DRY_CAPS = {"machine": 60, "floater_graph": 240, "precision": 300, "bench": 240, "invariance": 300,
            "users_path": 300}
# d.'s users' regime (bench.py --regime, bf16 and amp, 16,384 tokens, base dims), beside fairseq's Transformer
REGIME_MODELS = ("relative", "t5", "alibi", "floater", "rope")
# d.'s peak-memory probes at a time, each a fresh process with its own CUDA context (third run: 4 at a time left
# section fused, since removed, without its timings at 160 s)
MEMORY_WORKERS = 8
DATA_CAP = 30  # preparing data/toy when it is missing (make_toy_data.py + prepare_bitext.sh; ~10 s)
# g.: the WMT14 En-De base cells trained (2 epochs of the stand-in corpus each, one after the other) and evaluated;
# FLOATER last, so that a cut run keeps the others' rows. The corpus: 4,000 training pairs make 2 epochs of about 5
# updates each at the cells' 8 × 4,096 tokens (one GPU: train.sh's update_freq 8), the recipe's 32,768 words; the
# test set is small because an untrained model's beam search runs to its longest hypotheses. The dry run: one
# scheme, whose evaluation averages epochs (most cells'), at the smallest sizes (each of its 9 Python processes
# costs seconds of start-up on CPU: ~60 s in all).
USERS_SCHEMES = ("transformer", "relative", "floater_all")
USERS_CORPUS = {"sentences": {"train": 4000, "valid": 200, "test": 200}, "vocab": 32768}
USERS_DRY_SCHEMES = ("transformer",)
USERS_DRY_CORPUS = {"sentences": {"train": 120, "valid": 16, "test": 16}, "vocab": 300}
# hooks for the tests only: a section that raises, or hangs (with its own process and a child)
FAIL_ENV, HANG_ENV = "GPU_CHECK_FAIL_SECTION", "GPU_CHECK_HANG_SECTION"

# Bounds: the graph replays the loop's kernels on the same inputs, so values and gradients agree to the rounding
# of a differently ordered reduction at most; half precision's loss after 100 updates stays near float32's.
SOLVE_BOUND = 1e-5
TRAINER_BOUND = {"fp32": 1e-5, "amp": 1e-3, "fp16": 1e-3, "bf16": 1e-2}
LOSS_BOUND = 0.15  # |loss − fp32 loss| / fp32 loss after the precision runs
# What CUDA graphs add to the allocator's reservation, torch.cuda.memory_reserved() with graphs minus without after
# training steps at every length up to the longest (graph pools included), is at most GRAPH_MEMORY_MARGIN × the
# stage tape of the longest bucket (cuda_graph.tape_bytes) plus each captured bucket's own buffers (its output
# and its inputs' gradients, bucket_buffer_bytes): one solve's tape and workspace for the run, not one per bucket
# (fairseq_plugins/modules/floater/cuda_graph.py). On CPU (dry run) held_bytes() stands in for the reservation.
GRAPH_MEMORY_MARGIN = 1.5
# f.: a sentence alone vs in a left-padded batch beside a 1,000-token batch-mate (scripts/tooling/invariance.py): the
# largest |alone − batched| decoder logit within the CPU's bounds (tests/test_batch_invariance.py), or within twice
# fairseq's own Transformer's on the same GPU (its kernels' rounding for other batch shapes, the reference)
INVARIANCE_BOUND = {"fp32": 1e-5, "bf16": 0.0625}
INVARIANCE_DTYPES = ("fp32", "bf16")
REPLAY_ARCHS = ("transformer_tiny", "transformer_wmt_en_de")  # one seed trained twice, with and without
REPLAY_UPDATES = 30  # torch.use_deterministic_algorithms


class CheckError(Exception):
    """A bad input to the check: one line for the user."""


def relative(path) -> str:
    """A path for the report: relative to the repository when inside it (no machine's absolute path)."""
    path = Path(path).resolve()
    for root, prefix in ((REPO, ""), (REPO.parent, "../")):  # the repository, or beside it (../shared)
        with contextlib.suppress(ValueError):
            return prefix + str(path.relative_to(root))
    return path.name


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def last_line(text, default="?"):
    lines = [x.strip() for x in str(text).strip().splitlines() if x.strip()]
    return (lines[-1] if lines else default)[:300]


class Rows:
    """A section's rows so far, rewritten atomically to its file after each one: the parent reads the file when
    the section's process ends, also when it was killed at its cap."""

    def __init__(self, path):
        self.path, self.rows = Path(path), []

    def add(self, kind, **fields):
        self.rows.append({"kind": kind, **fields})
        write_json(self.path, self.rows)


def model_names(given):
    """--models as a list of the table's schemes (space- or comma-separated); [] when not given."""
    from fairseq_plugins.schemes import MODELS as SCHEME_MODELS

    models = (given or "").replace(",", " ").split()
    for m in models:
        if m not in SCHEME_MODELS:
            raise CheckError(f"--models {given}: unknown model '{m}' (expected some of {' '.join(SCHEME_MODELS)})")
    return models

