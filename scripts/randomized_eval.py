#!/usr/bin/env python3
"""Does a randomized-positions model lose BLEU to its evaluation positions? One trained model, evaluated with
its positions chosen by several rules; everything else (weights, beam, data) the same.

    python scripts/randomized_eval.py DATA_DIR CHECKPOINT --json OUT [--src en --tgt de] [--rules ...]

Training gives a sequence of n tokens a sorted uniform random n-subset of {0..L−1}: on Multi30k's ~14-token
captions and L = 2,048, neighbours ~140 apart across the whole range. The module's first evaluation rule (``prefix``,
``randomized_positions.py``) gave token t the t-th entry of one fixed sorted draw of N = max-positions from L,
so that decoding step by step needs no final length: ~2 apart, from 0. The rules compared:

- ``prefix``: the module's rule before ``--randomized-eval-positions`` (the recorded test BLEU of runs trained
  before it; this script's decoding must reproduce their hypotheses);
- ``spread``: the mean of training's distribution: token r of n takes round((r + 1)(L + 1)/(n + 1)) − 1, the
  expected r-th smallest of a uniform n-subset; the decoder's n is the reference's length (teacher forcing only);
- ``spread_hat``: the same, the decoder's n estimated as n̂ = round(ρ·S) (S the source's length, ρ the training
  set's target/source token ratio), which a decoder writing step by step can use; past n̂ the spacing goes on,
  clipped at L − 1 (the module's ``spread`` rule with ``--randomized-length-ratio`` ρ);
- ``draw``: what training does, a seeded sorted random n-subset per sentence (teacher forcing only; the
  authors' code draws at test time too, on encoder-only models).

For each rule: the test references' teacher-forced loss (nats per target token, no label smoothing) and, for
``prefix`` and ``spread_hat``, beam search (BEAM, LENPEN as the study's recipe: 5 and 1; one sentence at a time)
scored as the study does (tok-lc BLEU and sacreBLEU).
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import sacrebleu
import sentencepiece as spm
import torch
from fairseq import checkpoint_utils, utils

from source_dependence import reference_loss
from tooling.atomic import write_json, write_text
from tooling.bleu import tokenized_bleu
from tooling.paths import portable

utils.import_user_module(argparse.Namespace(user_dir=str(Path(__file__).resolve().parents[1] / "fairseq_plugins")))
from fairseq_plugins.modules.randomized_positions import RandomizedPositionalEmbedding  # noqa: E402

RULES = ("prefix", "spread", "spread_hat", "draw")
DECODED = ("prefix", "spread_hat")
DRAW_SEED = 1


def drawn(n_per_row, length, max_position, generator):
    """One sorted random n-subset of 0..L−1 per row, as training draws (ranks past n: L − 1, never read)."""
    rows = []
    for n in n_per_row.tolist():
        subset = torch.randperm(max_position, generator=generator)[:n].sort().values
        rows.append(torch.cat([subset, subset.new_full((length - n,), max_position - 1)]))
    return torch.stack(rows)


class Rule:
    """Sets the evaluation positions of a model's two randomized embeddings to one rule: prefix, spread and
    spread_hat are the module's own rules (spread: the decoder's n its own length; spread_hat: round(ρ·S), which
    the decoder reads from its source), draw is training's draw, here."""

    def __init__(self, model, ratio):
        self.encoder, self.decoder = model.encoder.embed_positions, model.decoder.embed_positions
        for emb in (self.encoder, self.decoder):
            if not isinstance(emb, RandomizedPositionalEmbedding):
                sys.exit(f"randomized_eval.py: the checkpoint's {type(emb).__name__} is not randomized positions "
                         "(expected a randomized_transformer_* model)")
        self.ratio, self.generator = ratio, torch.Generator()
        self.name = None
        self.set("prefix")

    def set(self, name):
        self.name = name
        for emb in (self.encoder, self.decoder):
            hat = name == "spread_hat" and emb is self.decoder
            emb.eval_rule = "prefix" if name == "prefix" else "spread"
            emb.length_ratio, emb.reads_source = (self.ratio if hat else None), hat
            if name == "draw":
                emb.forward = self._draw(emb)
            else:
                emb.__dict__.pop("forward", None)  # the module's own forward again

    def _draw(self, emb):
        def forward(input, incremental_state=None, timestep=None, positions=None):
            if incremental_state is not None:
                raise RuntimeError("draw: teacher forcing only")
            real = input.ne(emb.padding_idx)
            rank = (torch.cumsum(real, dim=1) - 1).clamp(min=0)
            chosen = drawn(real.sum(dim=1), input.size(1), emb.max_position, self.generator).gather(1, rank)
            index = torch.where(real, chosen + emb.padding_idx + 1, emb.padding_idx)
            return emb.table().index_select(0, index.view(-1)).view(*input.shape, -1).detach()
        return forward


def token_ratio(dataset):
    """The training data's target tokens over its source tokens (EOS included)."""
    return float(dataset.tgt_sizes.sum()) / float(dataset.src_sizes.sum())


@torch.no_grad()
def decode(task, model, dataset, beam, lenpen, sp):
    generator = task.build_generator([model], argparse.Namespace(beam=beam, lenpen=lenpen))
    hyps = []
    for i in range(len(dataset)):
        sample = dataset.collater([dataset[i]])
        best = task.inference_step(generator, [model], sample)[0][0]["tokens"]
        hyps.append(sp.decode_pieces(task.tgt_dict.string(best).split()))
    return hyps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", help="a prepare_bitext.sh output: bin/, spm.model, raw/test.TGT")
    ap.add_argument("checkpoint", help="a randomized_transformer_* checkpoint")
    ap.add_argument("--json", required=True, help="write the numbers here (atomically)")
    ap.add_argument("--src", default="en")
    ap.add_argument("--tgt", default="de")
    ap.add_argument("--rules", default=",".join(RULES), help=f"comma-separated, of {', '.join(RULES)}")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--lenpen", type=float, default=1.0)
    ap.add_argument("--teacher-forced-only", action="store_true", help="the losses alone, no beam search")
    ap.add_argument("--sentences", type=int, help="only the first N test sentences (a quick check; default: all)")
    ap.add_argument("--recorded-hyp", help="the run's recorded test hypotheses: prefix's decoding must equal them")
    args = ap.parse_args()
    rules = args.rules.split(",")
    for name in rules:
        if name not in RULES:
            sys.exit(f"randomized_eval.py: --rules: {name!r} is not one of {', '.join(RULES)}")
    for path, flag in ((args.checkpoint, "CHECKPOINT"), (f"{args.data}/spm.model", "DATA"),
                       (f"{args.data}/raw/test.{args.tgt}", "DATA")):
        if not os.path.isfile(path):
            sys.exit(f"randomized_eval.py: {flag}: {path}: no such file")
    torch.set_num_threads(1)
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [args.checkpoint], arg_overrides={"data": f"{args.data}/bin"})
    model = models[0].eval()
    task.load_dataset("train")
    task.load_dataset("test")
    ratio = token_ratio(task.dataset("train"))
    dataset = task.dataset("test")
    refs = Path(f"{args.data}/raw/test.{args.tgt}").read_text(encoding="utf-8").splitlines()
    if args.sentences:
        if args.sentences < 2:
            sys.exit(f"randomized_eval.py: --sentences {args.sentences}: expected at least 2")
        dataset = torch.utils.data.Subset(dataset, range(min(args.sentences, len(dataset))))
        dataset.collater, dataset.tgt_dict = dataset.dataset.collater, dataset.dataset.tgt_dict
        refs = refs[:len(dataset)]
    rule = Rule(model, ratio)
    sp = spm.SentencePieceProcessor(model_file=f"{args.data}/spm.model")
    result = {"checkpoint": portable(args.checkpoint), "sentences": len(dataset),
              "max_position": rule.encoder.max_position,
              "ratio": round(ratio, 4), "beam": args.beam, "lenpen": args.lenpen, "rules": {}}
    for name in rules:
        rule.set(name)
        rule.generator.manual_seed(DRAW_SEED)
        start = time.time()
        total, tokens = reference_loss(model, dataset, list(range(len(dataset))))
        row = {"loss": round(total / tokens, 4)}
        if name in DECODED and not args.teacher_forced_only:
            hyps = decode(task, model, dataset, args.beam, args.lenpen, sp)
            row["bleu_tok_lc"] = round(tokenized_bleu(hyps, refs, lowercase=True, compounds=False).score, 2)
            row["sacrebleu"] = round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
            row["length_ratio"] = round(sum(len(h.split()) for h in hyps) / sum(len(r.split()) for r in refs), 4)
            if name == "prefix" and args.recorded_hyp:
                recorded = Path(args.recorded_hyp).read_text(encoding="utf-8").splitlines()
                row["identical_to_recorded"] = sum(a == b for a, b in zip(hyps, recorded))
            write_text(Path(args.json).with_suffix(f".{name}.hyp"), "\n".join(hyps) + "\n")
        row["seconds"] = round(time.time() - start, 1)
        result["rules"][name] = row
        print(name, json.dumps(row), flush=True)
    write_json(args.json, result, indent=1)


if __name__ == "__main__":
    main()
