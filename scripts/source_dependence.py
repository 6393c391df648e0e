#!/usr/bin/env python3
"""How much a translation model conditions on its source: the references' teacher-forced loss with the true
sources, and again with every source replaced by another sentence's of the same split.

    python scripts/source_dependence.py DATA_BIN CHECKPOINT [--subset test] [--seed 1] [--json OUT]

Prints the two losses and their gap, in nats per target token (end of sentence included, padding not), with
the model in evaluation mode (no dropout) and no label smoothing. A model that translates pays several nats per
token for the wrong source; one that has learnt a fluent language model of the target side and little else pays
little, although both can have a similar validation loss. The replacement is a derangement (no sentence keeps
its own source) drawn from --seed, so a rerun gives the same numbers.
"""
import argparse
import os
import sys
from pathlib import Path

import torch
from fairseq import checkpoint_utils, utils

from tooling.atomic import write_json
from tooling.paths import portable

utils.import_user_module(argparse.Namespace(user_dir=str(Path(__file__).resolve().parents[1] / "fairseq_plugins")))

BATCH = 64  # sentences per forward pass: memory stays small, the sum does not depend on it


def derangement(n, seed):
    """A random permutation of range(n) without fixed points."""
    if n < 2:
        raise ValueError(f"{n} sentence(s): a derangement needs at least 2")
    g = torch.Generator().manual_seed(seed)
    while True:
        perm = torch.randperm(n, generator=g)
        if not bool((perm == torch.arange(n)).any()):
            return perm.tolist()


@torch.no_grad()
def reference_loss(model, dataset, source_of):
    """Sum of -log p(reference token) over the split with sentence i's source taken from sentence source_of[i],
    and the number of target tokens."""
    pad = dataset.tgt_dict.pad()
    total, tokens = 0.0, 0
    for start in range(0, len(dataset), BATCH):
        ids = range(start, min(start + BATCH, len(dataset)))
        batch = dataset.collater([dict(dataset[i], source=dataset[source_of[i]]["source"]) for i in ids])
        lprobs = model.get_normalized_probs(model(**batch["net_input"]), log_probs=True).float()
        target = batch["target"]
        nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        mask = target.ne(pad)
        total += nll[mask].double().sum().item()
        tokens += int(mask.sum())
    return total, tokens


def measure(data, checkpoint, subset="test", seed=1):
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data})
    model = models[0].eval()
    task.load_dataset(subset)
    dataset = task.dataset(subset)
    true, tokens = reference_loss(model, dataset, list(range(len(dataset))))
    shuffled, tokens_shuffled = reference_loss(model, dataset, derangement(len(dataset), seed))
    assert tokens == tokens_shuffled  # the targets are the same sentences
    return {"checkpoint": portable(checkpoint), "subset": subset, "sentences": len(dataset), "target_tokens": tokens,
            "seed": seed, "true_loss": round(true / tokens, 4), "shuffled_loss": round(shuffled / tokens, 4),
            "gap": round((shuffled - true) / tokens, 4), "unit": "nats per target token"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", help="binarized data directory (fairseq-preprocess output)")
    ap.add_argument("checkpoint", help="fairseq checkpoint of a translation model")
    ap.add_argument("--subset", default="test", help="split to score (default: test)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the source derangement (default: 1)")
    ap.add_argument("--json", help="also write the numbers here (atomically)")
    args = ap.parse_args()
    if not os.path.isfile(args.checkpoint):
        sys.exit(f"source_dependence.py: checkpoint {args.checkpoint}: no such file")
    if not any(Path(args.data).glob(f"{args.subset}.*.idx")):  # fairseq-preprocess: SUBSET.SRC-TGT.LANG.idx
        sys.exit(f"source_dependence.py: --subset {args.subset}: no binarized split of that name in {args.data}")
    result = measure(args.data, args.checkpoint, args.subset, args.seed)
    print(f"true {result['true_loss']:.4f}  shuffled {result['shuffled_loss']:.4f}  gap {result['gap']:.4f} "
          f"nats/token ({result['sentences']} sentences, {result['target_tokens']} target tokens)")
    if args.json:
        write_json(args.json, result, indent=1)


if __name__ == "__main__":
    main()
