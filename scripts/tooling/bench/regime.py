"""The users' regime of the benchmark (scripts/bench/bench.py --regime; tooling.bench.report.regime_markdown writes it).

What users train with, measured per model as tokens per second and as a ratio to fairseq's Transformer in the
same run, for every (dims, precision, --max-tokens):

1. Batches: sentence pairs drawn (seeded) from the committed newstest2014 en→de length histogram
   (tooling.bench.length_mix), batched as fairseq-train batches them (shuffled, sorted by length, grouped by
   batch_by_size under --max-tokens, padding included, sentences a multiple of 8; the batches in a seeded order).
   Every model gets the same batches in the same order.
2. Training: fairseq's Trainer, built as fairseq-train builds it, with the WMT14 recipe of configs/wmt14
   (Adam (0.9, 0.98), inverse_sqrt with 4,000 warm-up updates, label smoothing 0.1, --clip-norm 0.0: the norm is
   computed, nothing clipped) and the precision's own flags: --fp16 or --bf16 (fairseq's FP16Optimizer: fp32
   master weights, dynamic loss scaling for fp16) or --amp (its AMPOptimizer: autocast and a GradScaler).
   Trainer.train_step is the whole update: moving the batch to the device, forward, criterion, backward, the
   gradients' reduction and norm, the scaler, Adam and the learning-rate schedule. --warmup untimed and then
   --updates timed updates of each model, round-robin (one update of each per batch, the order rotated); with
   --update-freq N an update is N consecutive batches (micro-batches, as fairseq-train's --update-freq).
   tokens/s = target tokens (fairseq's wps: non-padding target tokens) of the timed updates / their time.
3. Decoding: beam 4 through fairseq's SequenceGenerator, incremental, on --decode-batches batches of sources
   drawn from the same mix and batched under --decode-max-tokens (scripts/evaluate.sh's --max-tokens 8000); an
   untrained model's hypotheses have no natural end, so every sentence of a batch is made to produce the batch's
   mean target length (rounded) + EOS: tokens/s = those tokens / time. The model decodes in its training dtype
   (bf16 and fp16 models are bf16 and fp16; amp and fp32 models fp32).
4. FLOPs: transformer_flops, the Transformer's analytic count for each padded batch (every model's row states
   the Transformer's count for its batches: the position schemes' own FLOPs are not counted), and the rate the
   device reaches: those FLOPs / the update's time, as a fraction of the device's bf16 matmul rate measured in
   the same run (matmul_rate: one large bf16 product, timed).
5. --profile-update: one more update of each model on the first group's last batches, under torch.profiler (its
   top operators by self time on the device; CPU: by CPU self time), in the report.
"""
import gc
import sys
import time

import torch

from tooling.bench import length_mix
from tooling.bench.models import BASELINE, COMMON_FLAGS, GRAPH, PLUGIN_BASELINE, PLUGINS, SHARED, SCHEME_TABLE, \
    building, model_specs, synthetic_dictionary
from tooling.bench.timing import CLOCKS, load_average, machine, profile_call, rotated, source_state, timed

PRECISIONS = {"fp32": [], "amp": ["--amp"], "bf16": ["--bf16"], "fp16": ["--fp16"]}
# configs/wmt14/common.yaml and recipe/liu2020_base_en_de.yaml: what fairseq-train is given for WMT14
RECIPE = ["--lr", "7e-4", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000", "--warmup-init-lr", "1e-07",
          "--clip-norm", "0.0", "--weight-decay", "0.0"]
# fairseq's own dims at every size: transformer_wmt_en_de's FFN of 2,048 at base (Shaw's base arch pins 1,024:
# overridden, so that every model has the Transformer's dims and differs only in its position scheme)
FAIRSEQ_FFN = {"base": ["--encoder-ffn-embed-dim", "2048", "--decoder-ffn-embed-dim", "2048"]}


def regime_archs(dims):
    """(arch, flags) of every scheme at fairseq's dims for `dims`."""
    return {name: (scheme.arch(dims), list(scheme.flags) + FAIRSEQ_FFN.get(dims, []))
            for name, scheme in SCHEME_TABLE.items()}


def build_trainer(arch, flags, precision, dictionary, device, seed, kind=None):
    """fairseq's Trainer for `arch` in `precision`, built as fairseq-train builds it (no data directory: the
    task gets the synthetic dictionary). On CPU, fp16 adds --fp16-no-flatten-grads (fairseq's flat fp32 copy of
    the parameters is made on a CUDA device)."""
    from fairseq import options, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.tasks.translation import TranslationTask
    from fairseq.trainer import Trainer

    argv = ["unused-data-dir", "--user-dir", str(PLUGINS), "--arch", arch, *COMMON_FLAGS, *RECIPE,
            *PRECISIONS[precision], *flags, "--seed", str(seed)] + (["--cpu"] if device == "cpu" else [])
    if device == "cpu" and precision == "fp16":  # FP16Optimizer's flat fp32 copy lives on a CUDA device
        argv.append("--fp16-no-flatten-grads")
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    task = TranslationTask(cfg.task, dictionary, dictionary)
    utils.set_torch_seed(seed)
    with building(kind):  # model_specs' kind
        model = task.build_model(cfg.model)
    return Trainer(cfg, task, model, task.build_criterion(cfg.criterion))


def transformer_flops(model_cfg, vocab, src_shape, tgt_shape):
    """Floating-point operations of one training update of fairseq's Transformer on a padded batch of (B, S)
    sources and (B, T) targets: 3 × the forward (the backward is twice the forward), the forward being 2 per
    multiply-add of every product:
      encoder, per layer:  2·B·S·(4·d² + 2·d·F)            projections q, k, v, out and the FFN
                           + 4·B·S²·d                       scores q·kᵀ and the weighted sum of v
      decoder, per layer:  2·B·T·(4·d² + 2·d² + 2·d·F)     self-attention's 4, cross-attention's q and out, FFN
                           + 2·B·S·2·d²                     cross-attention's k and v over the source
                           + 4·B·T²·d + 4·B·T·S·d           self- (the full square, masked) and cross-attention
      output projection:   2·B·T·d·V                        (the tied embedding)
    i.e. 6 × parameters × tokens plus attention's 12·L·T²·d terms (embedding look-ups, layer norms, softmax and
    the loss are not counted)."""
    (B, S), (_, T) = src_shape, tgt_shape
    d = model_cfg.encoder_embed_dim
    fe, fd = model_cfg.encoder_ffn_embed_dim, model_cfg.decoder_ffn_embed_dim
    enc = model_cfg.encoder_layers * (2 * B * S * (4 * d * d + 2 * d * fe) + 4 * B * S * S * d)
    dec = model_cfg.decoder_layers * (2 * B * T * (6 * d * d + 2 * d * fd) + 4 * B * S * d * d
                                      + 4 * B * T * T * d + 4 * B * T * S * d)
    return 3 * (enc + dec + 2 * B * T * d * vocab)


def matmul_rate(device, n=None, reps=None):
    """FLOP/s of an n × n × n bf16 matrix product on the device (2·n³ per product; the best of `reps` timed after
    three untimed): the rate the update's FLOPs are set against."""
    n = n or (8192 if device == "cuda" else 256)
    reps = reps or (20 if device == "cuda" else 3)
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(device, torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    best = min(timed(lambda: a @ b, device)[0] for _ in range(reps))
    return {"n": n, "reps": reps, "flops_per_s": 2 * n ** 3 / best}


def decode_batches(pairs, dictionary, args, seed):
    batches, _, _ = length_mix.corpus(pairs, dictionary, args.decode_max_tokens, args.decode_batches, seed)
    return batches


def decode(trainer, dictionary, batch, device):
    """Beam 4 on one batch, every sentence made to produce the batch's mean target length: output tokens."""
    from fairseq import utils
    from fairseq.sequence_generator import SequenceGenerator

    model = trainer.model
    lengths = batch["target"].ne(dictionary.pad()).sum(1).float()
    L = max(1, round(lengths.mean().item()) - 1)  # + EOS = the mean target length (which counts its EOS)
    src = {"net_input": {k: batch["net_input"][k] for k in ("src_tokens", "src_lengths")}}
    src = utils.move_to_cuda(src) if device == "cuda" else src
    generator = SequenceGenerator([model], dictionary, beam_size=4, max_len_a=0, max_len_b=L, min_len=L)
    hypos = generator.generate([model], src)
    assert {len(h[0]["tokens"]) for h in hypos} == {L + 1}, "every sentence of the batch ends at its forced length"
    return len(hypos) * (L + 1)


def run_regime(args, progress=None):
    """Every (dims, precision, max_tokens) group of rows; the report. `progress` gets it after every group."""
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    if args.threads:
        torch.set_num_threads(args.threads)
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if not args.silent else (lambda *a: None)
    started, loads = time.time(), [load_average()]
    dictionary = synthetic_dictionary(args.vocab)
    pairs = length_mix.load_pairs()
    rate = matmul_rate(device)
    log(f"regime: bf16 matmul {rate['flops_per_s'] / 1e12:.2f} TFLOP/s (n = {rate['n']})")
    res = {"kind": "regime", "command": args.command,
           "machine": machine(device),
           "source": source_state(), "settings": settings(args), "matmul_bf16": rate,
           "length_mix": {"file": length_mix.LENGTHS_FILE.name, "pairs": len(pairs),
                          "mean_source": sum(s for s, _ in pairs) / len(pairs),
                          "mean_target": sum(t for _, t in pairs) / len(pairs)},
           "batches": [], "rows": []}
    decode_sets = None if args.no_decode else decode_batches(pairs, dictionary, args, args.seed + 11)
    groups = [(d, p, int(m)) for d in args.dims.split(",") for p in args.precision.split(",")
              for m in str(args.max_tokens).split(",")]
    for dims in args.dims.split(","):
        specs = model_specs(dims, args.floater_every, archs=regime_archs(dims))
        names = [n for n in specs if n == BASELINE or n in args.models.split(",")]
        for precision in args.precision.split(","):
            trainers = {n: build_trainer(specs[n][0], specs[n][1] + list(getattr(args, "update_flags", [])), precision,
                                         dictionary, device, args.seed, kind=specs[n][2])
                        for n in names}
            params = {n: sum(p.numel() for p in t.model.parameters()) for n, t in trainers.items()}
            for max_tokens in (int(x) for x in str(args.max_tokens).split(",")):
                rows = measure(args, trainers, names, dictionary, pairs, dims, precision, max_tokens, params,
                               decode_sets, rate, res, log)
                res["rows"] += rows
                loads.append(load_average())
                done = groups.index((dims, precision, max_tokens)) + 1
                if progress is not None and done < len(groups):  # a run cut short keeps the groups it measured
                    progress({**res, "partial": ", ".join(f"{d} {p} {m}" for d, p, m in groups[done:])
                              + " still to run", "wall_s": time.time() - started})
            trainers.clear()
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
    res["load_average"] = {"samples": [x for x in loads if x], "start": loads[0], "end": load_average()}
    res["wall_s"] = time.time() - started
    return res


def measure(args, trainers, names, dictionary, pairs, dims, precision, max_tokens, params, decode_sets, rate,
            res, log):
    """The rows of one (dims, precision, max_tokens): every model trained on the same batches, then decoded."""
    device, clock = args.device, CLOCKS.index(args.clock)
    freq = args.update_freq
    total = args.warmup + args.updates
    batches, drawn, left_out = length_mix.corpus(pairs, dictionary, max_tokens, total * freq, args.seed + max_tokens)
    timed_batches = batches[args.warmup * freq:]
    shapes = [(b["net_input"]["src_tokens"].shape, b["target"].shape) for b in timed_batches]
    model_cfg = next(iter(trainers.values())).cfg.model
    flops = sum(transformer_flops(model_cfg, len(dictionary), s, t) for s, t in shapes)
    tokens = sum(b["ntokens"] for b in timed_batches)
    src_tokens = sum(int(b["net_input"]["src_lengths"].sum()) for b in timed_batches)
    padded = sum(s.numel() + t.numel() for s, t in shapes)
    res["batches"].append({"dims": dims, "precision": precision, "max_tokens": max_tokens, "drawn": drawn,
                           "left_out": left_out, "timed": len(timed_batches),
                           "sentences": [b["nsentences"] for b in timed_batches],
                           "padded_tokens": [list(map(list, s)) for s in shapes],
                           "padding_share": 1 - (tokens + src_tokens) / padded})
    times = {n: [] for n in names}
    for i in range(total):
        update = batches[i * freq:(i + 1) * freq]  # one update's micro-batches (--update-freq)
        for n in rotated(names, i):
            t = timed(lambda: trainers[n].train_step(update), device)
            if i >= args.warmup:
                times[n].append(t)
    if getattr(args, "profile_update", False) and "profiles" not in res:  # the first group: where an update's time goes
        update = batches[-freq:]
        res["profiles"] = {"group": f"{dims} {precision} {max_tokens}", "models": {
            n: profile_call(lambda: trainers[n].train_step(update), device, args.profile_top) for n in names}}
    rows = []
    for n in names:
        seconds = {c: sum(t[k] for t in times[n]) for k, c in enumerate(CLOCKS)}
        s = max(seconds[args.clock], 1e-12)
        row = {"model": n, "dims": dims, "precision": precision, "max_tokens": max_tokens,
               "arch": trainers[n].cfg.model.arch, "parameters": params[n], "updates": len(times[n]),
               "target_tokens": tokens, "source_tokens": src_tokens, "train_s": seconds,
               "tokens_per_s": tokens / s, "flops": flops, "flops_per_s": flops / s,
               "matmul_fraction": flops / s / rate["flops_per_s"]}
        rows.append(row)
    if decode_sets is not None:
        for n in [n for n in names if n not in (GRAPH, SHARED)]:  # at inference both are floater
            trainers[n].model.eval()
            decode(trainers[n], dictionary, decode_sets[0], device)  # warm-up
            out, elapsed = 0, [0.0, 0.0]
            for batch in decode_sets:
                box = []
                t = timed(lambda: box.append(decode(trainers[n], dictionary, batch, device)), device)
                out, elapsed = out + box[0], [elapsed[k] + t[k] for k in range(2)]
            trainers[n].model.train()
            row = next(r for r in rows if r["model"] == n)
            row.update(decode_tokens=out, decode_sentences=sum(b["nsentences"] for b in decode_sets),
                       decode_s=dict(zip(CLOCKS, elapsed)), decode_tokens_per_s=out / max(elapsed[clock], 1e-12))
    base = next(r for r in rows if r["model"] == BASELINE)
    plugin = next((r for r in rows if r["model"] == PLUGIN_BASELINE), None)
    for r in rows:  # time ratios: the Transformer's tokens/s over the model's (1.10× = 10% slower)
        r["train_ratio"] = base["tokens_per_s"] / r["tokens_per_s"]
        if plugin is not None:  # and to the same model through the plugins' attention
            r["plugin_train_ratio"] = plugin["tokens_per_s"] / r["tokens_per_s"]
        if "decode_tokens_per_s" in r:
            r["decode_ratio"] = base["decode_tokens_per_s"] / r["decode_tokens_per_s"]
    log(f"regime {dims} {precision} {max_tokens}: " + "  ".join(
        f"{r['model']} {r['tokens_per_s']:,.0f} tok/s ({r['train_ratio']:.2f}x)" for r in rows))
    return rows


def settings(args):
    keys = ("device", "dims", "precision", "max_tokens", "models", "warmup", "updates", "update_freq", "vocab", "seed",
            "clock", "profile_update", "train_flags",
            "threads", "decode_max_tokens", "decode_batches", "no_decode", "quick")
    return {k: getattr(args, k) for k in keys if hasattr(args, k)}


def check_args(args):
    """One line for what the regime cannot run, before anything runs."""
    for p in args.precision.split(","):
        if p not in PRECISIONS:
            raise SystemExit(f"--precision {args.precision}: '{p}' is not one of {', '.join(PRECISIONS)}")
    for d in args.dims.split(","):
        if d not in ("base", "big", "tiny"):
            raise SystemExit(f"--dims {args.dims}: '{d}' is not one of base, big, tiny")
    if not (isinstance(args.update_freq, int) and args.update_freq >= 1):
        raise SystemExit(f"--update-freq {args.update_freq}: an integer >= 1")
    if any(not x.isdigit() or int(x) < 16 for x in str(args.max_tokens).split(",")):
        raise SystemExit(f"--max-tokens {args.max_tokens}: comma-separated integers >= 16")
    unknown = [m for m in args.models.split(",") if m not in model_specs("tiny", args.floater_every)
               and m != "floater_cached"]
    if unknown:
        raise SystemExit(f"--models {args.models}: unknown {', '.join(unknown)}")
    if "floater_cached" in args.models.split(","):
        raise SystemExit("--regime: floater_cached is not measured here (its cost is amortised over N updates; "
                         "use --floater-update-every in the fixed-length benchmark)")
    if GRAPH in args.models.split(",") and args.device != "cuda":
        from tooling.bench.phases import graphs_emulated

        if not graphs_emulated():
            raise SystemExit(f"--models {GRAPH}: FLOATER's CUDA-graph solve needs --device cuda")
    if args.updates < 1 or args.warmup < 0 or args.decode_batches < 1:
        raise SystemExit("--updates and --decode-batches must be >= 1, --warmup >= 0")
