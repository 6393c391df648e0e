"""The fused update (``--fused-update --adam-impl torch``) against fairseq's default update on one device: the
comparisons tests/test_fused_update.py makes on CPU, made where the update runs (scripts/gpu/speed_check.py's step
"exactness"; on a GPU the foreach and fused kernels reduce in other orders than the per-tensor ones):

- each precision (fp32, amp, bf16, fp16): the two trainers from the same weights, on the same batches, UPDATES free
  updates each; after each, the optimizer's float32 master weights compared by ``difference`` (the largest over
  tensors of max |a − b| / max |a|). Bounds: fp32 FP32_BOUND (1e-6 after one update), the mixed modes the precision
  check's (tooling/gpu/common.py's TRAINER_BOUND);
- fp32, the study's tiny recipe: LOSS_UPDATES free-running updates, each update's loss (relative; LOSS_BOUND) and the
  weights after them;
- the floor: fairseq's default update run twice the same way (a GPU's atomic additions may make two runs differ;
  any difference of the fused path below it is noise).

The learning rate is LR at the first update (then LR/√n): the recipe's warm-up starts at 1e-7, where an update moves
the weights by too little to show a difference. --clip-norm and weight decay are on, so their fused forms count.
"""
import torch

from tooling.bench.length_mix import corpus, load_pairs
from tooling.bench.models import BASELINE, FUSED_UPDATE, synthetic_dictionary
from tooling.bench.regime import build_trainer, regime_archs
from tooling.gpu.common import TRAINER_BOUND

FUSED = list(FUSED_UPDATE)
LR = 1e-3
# inverse_sqrt with one warm-up update: LR at the first update, then LR/sqrt(n)
COMPARED = ["--lr", str(LR), "--warmup-updates", "1", "--warmup-init-lr", str(LR), "--clip-norm", "0.5",
            "--weight-decay", "0.01"]
UPDATES = 3
LOSS_UPDATES = 50
FP32_BOUND = 1e-6
LOSS_BOUND = 1e-4
BOUNDS = {"fp32": FP32_BOUND, **{p: b for p, b in TRAINER_BOUND.items() if p != "fp32"}}


def master_params(trainer):
    """id(model parameter) → the float32 values the optimizer keeps for it (a copy): fairseq's flat --fp16/--bf16
    buffer sliced in fp16_params order, the per-tensor fp32 copies, or the parameters themselves."""
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    opt = trainer.optimizer
    if isinstance(opt, FP16Optimizer):
        if opt.has_flat_params:
            (flat,) = opt.fp32_params.values()
            out, offset = {}, 0
            for p in opt.fp16_params:
                out[id(p)] = flat.data[offset: offset + p.numel()].view(p.shape).clone()
                offset += p.numel()
            return out
        return {id(p): p32.data.clone() for p, p32 in zip(opt.fp16_params, opt.fp32_params)}
    return {id(p): p.detach().float().clone() for p in trainer.model.parameters()}


def named_master_params(trainer):
    """Parameter name → the float32 values the optimizer keeps for it (master_params by name)."""
    values = master_params(trainer)
    return {name: values[id(p)] for name, p in trainer.model.named_parameters()}


def difference(a, b) -> float:
    """The largest over tensors of max |a - b| / max |a| (a and b: the same keys → tensor)."""
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max() / a[k].double().abs().max().clamp_min(1e-30))
               for k in a)


def _trainers(arch, flags, precision, dictionary, device, seed, variants):
    return [build_trainer(arch, [*flags, *COMPARED, *extra], precision, dictionary, device, seed)
            for extra in variants]


def _loss(trainer, batch):
    """One update; its loss as fairseq-train logs it, unrounded (the logged value keeps 3 decimals; the fused update
    returns no values, its metrics are read here)."""
    from fairseq.logging import metrics

    number = trainer.get_num_updates()
    with metrics.aggregate(new_root=True) as agg:
        trainer.train_step([batch])
    if trainer.get_num_updates() != number + 1:
        raise RuntimeError(f"update {number + 1} was skipped")
    return float(agg["loss"].avg)


def one_precision(arch, flags, precision, batches, dictionary, device, seed):
    """default, default again and fused from the same weights, UPDATES updates on the same batches: the
    differences to the default after each."""
    default, again, fused = _trainers(arch, flags, precision, dictionary, device, seed, ([], [], FUSED))
    start = named_master_params(default)
    if difference(start, named_master_params(fused)) or difference(start, named_master_params(again)):
        raise RuntimeError(f"{precision}: the trainers start from different weights")
    fused_off, floor = [], []
    for batch in batches[:UPDATES]:
        for tr in (default, again, fused):
            _loss(tr, batch)
        want = named_master_params(default)
        fused_off.append(difference(want, named_master_params(fused)))
        floor.append(difference(want, named_master_params(again)))
    return {"precision": precision, "bound": BOUNDS[precision], "fused": fused_off, "default_twice": floor,
            "ok": fused_off[0] <= BOUNDS[precision]}


def free_running(arch, flags, batches, dictionary, device, seed, updates=LOSS_UPDATES):
    """fp32: `updates` updates of each (default, default again, fused); losses and the weights after."""
    runs = []
    for tr in _trainers(arch, flags, "fp32", dictionary, device, seed, ([], [], FUSED)):
        losses = [_loss(tr, batches[i % len(batches)]) for i in range(updates)]
        runs.append((losses, named_master_params(tr)))
    (want, w_want), (again, w_again), (got, w_got) = runs

    def worst(other):
        return max(abs(a - b) / abs(a) for a, b in zip(want, other))

    return {"updates": updates, "bound": LOSS_BOUND, "losses_default": want, "losses_fused": got,
            "fused_loss": worst(got), "default_twice_loss": worst(again), "fused_weights": difference(w_want, w_got),
            "default_twice_weights": difference(w_want, w_again), "ok": worst(got) <= LOSS_BOUND,
            "learned": want[-1] < want[0]}


def _guarded(what, part):
    """A part's result, or the one line of why it failed (an overflow that skips an update, a kernel the device
    lacks): the other parts still run."""
    try:
        return part()
    except Exception as err:  # noqa: BLE001  (reported in the result, judged not ok)
        return {**what, "ok": False, "error": f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"
                if str(err).strip() else type(err).__name__}


def run(device, dims, tokens, precisions, tiny_flags, tiny_tokens, loss_updates=LOSS_UPDATES, seed=1,
        progress=lambda result: None):
    """The step's result: each precision at `dims` (fairseq's Transformer, `tokens` per batch) and the tiny
    recipe's free run (transformer_tiny with `tiny_flags`, `tiny_tokens` per batch); `progress` gets it after each
    part."""
    dictionary = synthetic_dictionary(10000 if device == "cuda" else 1000)
    pairs = load_pairs()
    arch, flags = regime_archs(dims)[BASELINE]
    batches, _, _ = corpus(pairs, dictionary, tokens, UPDATES, seed)
    result = {"device": device, "dims": dims, "tokens": tokens, "model": BASELINE, "flags": " ".join(COMPARED),
              "fused": " ".join(FUSED), "precisions": [], "free_running": None}
    for precision in precisions:
        result["precisions"].append(_guarded({"precision": precision, "bound": BOUNDS[precision]}, lambda: one_precision(
            arch, flags, precision, batches, dictionary, device, seed)))
        if device == "cuda":
            torch.cuda.empty_cache()
        progress(result)
    tiny_batches, _, _ = corpus(pairs, dictionary, tiny_tokens, 16, seed)
    result["free_running"] = {"model": "transformer_tiny " + " ".join(tiny_flags), "tokens": tiny_tokens,
                              **_guarded({"updates": loss_updates, "bound": LOSS_BOUND}, lambda: free_running(
                                  "transformer_tiny", tiny_flags, tiny_batches, dictionary, device, seed,
                                  loss_updates))}
    result["ok"] = all(p["ok"] for p in result["precisions"]) and result["free_running"]["ok"]
    progress(result)
    return result
