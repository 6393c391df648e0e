#!/usr/bin/env python3
"""Pictures of what each position scheme of a checkpoint learned.

    python scripts/plot_positions.py CHECKPOINT [CHECKPOINT ...] --out DIR [--label NAME ...]
        [--positions 128] [--train-max-len SRC[,TGT]] [--compare]

Takes any fairseq checkpoint of this project's models (fairseq's ``transformer`` with sinusoidal or learned
positions, ``relative_transformer``, ``floater_transformer``, and ``position_transformer``'s schemes:
``transformer_every_layer_pos``, T5, ALiBi, RoPE, SHAPE, NoPE, ...; any of their architectures) and writes PNG
figures to DIR, named after the checkpoint's label (``--label``, one per checkpoint; default: the checkpoint's folder
and file name). The model is built from the checkpoint alone: the vocabulary
sizes come from its embedding tables, so no data directory is needed (the positions do not depend on the words).

What is drawn (positions are fairseq's: position i is the (i+1)-th token of a sentence, padding does not count):

- FLOATER (``LABEL_floater.png``, ``LABEL_floater_projections.png``, ``LABEL_floater_norms.png``): the biases the
  attention projections actually add at position i, b(t_i) = b(0) + Δb(t_i), computed by the model's own
  ``FloaterPositions`` (one solve of its three flows, as in evaluation), and their position–position cosine
  similarity cos(b(t_i), b(t_j)) for i, j < --positions. Per projection (``_projections``: one heatmap per block and
  projection: encoder q/k/v (source positions), decoder self-attention q/k/v and cross-attention q (target
  positions), cross-attention k/v (source positions)), and pooled per block (``_floater``: the mean of that block's
  per-projection similarities, one row per flow). Pooled by the mean of cosines, not the cosine of the concatenated
  biases: the projections' Δb grow at very different rates (in a trained model one projection's can be thousands of
  times larger than the others' at position 100), and a concatenation would show only that one. Beside them, the
  same similarity for fairseq's sinusoidal embedding of the same dimension (the model's own, which FLOATER keeps at
  the input), so one sees how each continues past the training lengths. Cosines see directions only: ``_norms``
  draws ||b(t_i)|| by position, one line per projection (log scale).
- Learned absolute positions (``LABEL_learned.png``): the cosine similarity of the rows of the learned table(s)
  (positions past the table's length do not exist and are left out), beside the sinusoid of the same dimension.
- Shaw et al.'s relative positions (``LABEL_relative.png``): the L2 norm of each vector of the a^K and a^V
  tables by clipped distance j − i = −k..k, one panel per layer and table, one line per head when the tables are
  per head; and (``LABEL_relative_similarity.png``) the cosine similarity between the vectors of two distances,
  averaged over heads. With --relative-add-absolute-positions the absolute embedding gets its figure too.
- Schemes inside self-attention, every row of the table (``fairseq_plugins/schemes.py``) of kind ``score bias`` or
  ``rotary`` (``LABEL_<scheme>.png``: t5, alibi, kerple, fire, rope, and any row added since): the term each adds
  to the logit of query i and key j, by distance j − i, one line per head, one panel per stack (the decoder's: the
  past only), from the module's own ``score_bias``, titled with its class's ``title`` and ``equation`` (T5's
  β_h[bucket(j − i)], ALiBi's −m_h·|j − i|, ...; a score bias with ``per_sentence`` positions, FIRE's, depends on the
  query's position too, drawn at i = --positions − 1);
  for RoPE, which adds no term but rotates q and k, the first layer's logit between a word's query and the same
  word's key at distance j − i, averaged over the vocabulary (its input is the word's scaled embedding alone),
  and beside it the rotation alone, the mean over frequencies of cos((j − i)·θ_p) (xPos: each times its pair's
  scale ζ_p^(−(j − i)/γ); its logit curves likewise from its own transforms, a query at 0 left unchanged).
  SHAPE (a shifted sinusoid, drawn as the sinusoid it is at evaluation) and NoPE's encoder (sinusoidal) get the
  sinusoid's figure; randomized positions get the sinusoid at the positions their evaluation gives a sentence of
  --positions tokens (the spread rule: about L/N apart; a decoder's as after a source as long).
- Sinusoidal positions (``LABEL_sinusoidal.png``): the sinusoid's position–position cosine similarity (a
  function of i − j only).

--train-max-len SRC[,TGT] marks the longest training sequence (in tokens, end of sentence included; source and
target; one number for both) with dashed lines: source-indexed panels get SRC, target-indexed ones TGT. The
checkpoint does not record it (--max-source-positions is the model's limit, not the data's).

--compare (implied by several checkpoints) also writes ``compare.png``: one column per checkpoint, its scheme's
headline picture on top, encoder side (FLOATER: the similarity of the biases averaged over every encoder block's
q, k, v; the learned table's; the sinusoid's; relative positions: the similarity between the a^K vectors of two
distances, averaged over heads and encoder layers; T5, ALiBi, RoPE: the encoder's curves, one per head) and below
it a profile: for absolute schemes how far each position turns from the last, the angle between p_i and p_{i+1}
in degrees (FLOATER's averaged over the encoder's projections, and FLOATER's and the learned table's beside the
sinusoid's), for relative positions the norms of a^K and a^V by distance averaged over heads and encoder layers,
for the schemes inside attention the mean of their curves over heads. Every panel is titled; panels that show the
same quantity share one y range (the angles from 0), the others keep their own; each heatmap has its colour bar.

Every figure's title names the checkpoint by its label (e.g. rope.ep20.seed1: scheme, budget and seed as the user
names them) and the budget the checkpoint records (its updates; a fine-tune's: of the fine-tuning run). Panels of
one quantity share their y axis: the stacks of a scheme inside attention (RoPE's rotation alone, a cosine, keeps
its own), every layer and table of Shaw's norms.

Bad input (a missing or unreadable checkpoint, another kind of model, a bad flag, FLOATER biases that overflow
within --positions) stops with one line on stderr naming the file or flag, exit status 2, before anything is
written. Figures are written to a temporary name
beside their target and renamed.

The tensors: tooling.position_arrays (loading a checkpoint, reading what its schemes learned); the figures:
tooling.position_figures; this file: the command line.
"""
import argparse
import os
import re
from pathlib import Path

from tooling.position_arrays import BadInput, floater_biases, is_floater, load_model, register_plugins
from tooling.position_figures import compare_figure, figures
from tooling.tool import Tool

PROG = "plot_positions.py"
MAX_POSITIONS = 4096  # heatmaps of more positions than this have more cells than pixels anyway


fail = Tool(PROG, status=2).fail


# -- command line ----------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not the usage and then the message
        fail(f"error: {message}")


def _train_max_len(text):
    parts = text.split(",")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(parts) not in (1, 2) or len(values) != len(parts) or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected SRC or SRC,TGT (integers >= 1), got {text!r}")
    return (values[0], values[-1])


def _positions(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 2 <= value <= MAX_POSITIONS:
        raise argparse.ArgumentTypeError(f"expected an integer from 2 to {MAX_POSITIONS}, got {text!r}")
    return value


def _default_label(path):
    p = Path(path)
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{p.parent.name}_{p.stem}" if p.parent.name else p.stem)


def parse_args(argv=None):
    ap = _Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help="fairseq checkpoint(s) (.pt)")
    ap.add_argument("--out", required=True, help="folder for the PNG figures (created if missing)")
    ap.add_argument("--label", action="append", metavar="NAME",
                    help="figure name prefix, once per checkpoint in order (default: folder_file of the checkpoint)")
    ap.add_argument("--positions", type=_positions, default=128, metavar="N",
                    help="positions 0..N−1 to draw (default 128)")
    ap.add_argument("--train-max-len", type=_train_max_len, metavar="SRC[,TGT]",
                    help="mark the longest training sequence, in tokens (end of sentence included), source and "
                         "target; default: no mark")
    ap.add_argument("--compare", action="store_true",
                    help="also write compare.png, one column per checkpoint (the default with several)")
    args = ap.parse_args(argv)
    if args.label is None:
        args.label = [_default_label(c) for c in args.checkpoints]
    if len(args.label) != len(args.checkpoints):
        fail(f"--label: given {len(args.label)} time(s) for {len(args.checkpoints)} checkpoint(s) "
             "(expected one per checkpoint, or none)")
    for label in args.label:
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", label):
            fail(f"--label {label!r}: expected letters, digits and _ . + - only (it names files)")
    if len(set(args.label)) != len(args.label):
        fail(f"--label: the labels must differ (they name the files), got {', '.join(args.label)}")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        fail(f"--out {args.out}: exists and is not a folder")
    args.compare = args.compare or len(args.checkpoints) > 1
    return args


def main(argv=None):
    args = parse_args(argv)
    register_plugins()  # this checkout's plugins, before anything imports fairseq_plugins
    import torch

    with torch.no_grad():  # not set_grad_enabled(False): main may run inside another program (the tests)
        _draw(args)


def _draw(args):
    from fairseq_plugins.modules.floater import FloaterSolverError

    try:
        models = [load_model(path) for path in args.checkpoints]  # everything checked before anything is written
    except BadInput as e:
        fail(str(e))
    for model, path in zip(models, args.checkpoints):  # FLOATER's solve first (then cached): before any figure
        if is_floater(model):
            try:
                floater_biases(model, args.positions)
            except FloaterSolverError:
                fail(f"--positions {args.positions}: the FLOATER biases of {path} overflow (non-finite) within that "
                     "many positions; draw fewer positions")
    written = []
    for model, label in zip(models, args.label):
        written += figures(model, label, args.positions, args.train_max_len, args.out)
    if args.compare:
        written += compare_figure(models, args.label, args.positions, args.train_max_len, args.out)
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
