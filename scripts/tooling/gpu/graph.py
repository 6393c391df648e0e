"""The GPU check's section floater_graph (scripts/gpu/gpu_check.py): FLOATER's CUDA-graph solve (--floater-cuda-graph) against its
step-by-step loop. The solve's values and gradients; fairseq's Trainer with --update-freq in fp32, --amp, --fp16
and --bf16 (the gradient the optimizer steps with, graph vs loop, and the buckets captured); training steps at
every length longest-first and shortest-first, and what the graphs add to torch.cuda.memory_reserved() against
GRAPH_MEMORY_MARGIN × the stage tape plus the buckets' own buffers, with what each memory pool then holds
(pool_accounting). build_trainer serves section invariance too.
"""
from tooling.gpu.common import GRAPH_MEMORY_MARGIN, PLUGINS, TRAINER_MODES, log


def random_flows(device, dtype=None, cuda_graph=False, seed=0, rows=(18, 24, 12), dim=16, hidden=16):
    """Three flows with a non-trivial h (random W2, c2, c1) and random b(0): FLOATER's solve at small dims."""
    import torch
    from fairseq_plugins.modules.floater import FloaterFlow, FloaterSettings

    dtype = dtype or torch.float32
    torch.manual_seed(seed)
    flows = [FloaterFlow(dim, hidden, FloaterSettings(cuda_graph=cuda_graph)).to(device, dtype) for _ in rows]
    with torch.no_grad():
        for flow in flows:
            flow.dynamics.fc2.weight.normal_(std=0.5 / hidden ** 0.5)
            flow.dynamics.fc2.bias.normal_(std=0.3)
            flow.dynamics.fc1.bias.normal_(std=0.3)
    initial = [torch.randn(k, dim, device=device, dtype=dtype, requires_grad=True) for k in rows]
    return flows, initial


def solve_and_grads(flows, initial, points):
    import torch
    from fairseq_plugins.modules.floater import solve_checked

    ys = solve_checked(flows, initial, points)
    g = torch.Generator().manual_seed(1)
    loss = sum((y * torch.randn(y.shape, generator=g).to(y)).sum() for y in ys)
    inputs = [p for f in flows for p in f.parameters()] + list(initial)
    return [y.detach() for y in ys], torch.autograd.grad(loss, inputs)


def rel_error(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def solve_check(device, lengths, rows):
    for points in lengths:
        results = []
        for graph in (True, False):
            flows, initial = random_flows(device, cuda_graph=graph)
            results.append(solve_and_grads(flows, initial, points))
        (gv, gg), (lv, lg) = results
        rows.add("solve", positions=points, values=max(rel_error(a, b) for a, b in zip(gv, lv)),
                 gradients=max(rel_error(a, b) for a, b in zip(gg, lg)))


def build_trainer(data, device, flags, seed=1, arch="floater_transformer_tiny"):
    """fairseq's Trainer for `arch` on the toy task, as fairseq_cli/train.py builds it."""
    import torch
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    argv = [str(data), "--user-dir", str(PLUGINS), "--arch", arch, "--share-all-embeddings",
            "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt",
            "--warmup-updates", "4", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--dropout", "0", "--max-tokens", "512", "--seed", str(seed), "--num-workers", "0", *flags]
    if device == "cpu":
        argv.append("--cpu")
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    utils.set_torch_seed(seed)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    model = task.build_model(cfg.model)
    with torch.no_grad():  # a non-trivial h (h ≡ 0 at initialisation leaves W1 and its bias without gradient)
        g = torch.Generator().manual_seed(seed)
        for m in model.modules():
            if type(m).__name__ == "FloaterDynamics":
                m.fc2.weight.copy_(torch.randn(m.fc2.weight.shape, generator=g) * 0.3 / m.fc2.weight.shape[1] ** 0.5)
                m.fc2.bias.copy_(torch.randn(m.fc2.bias.shape, generator=g) * 0.1)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    batches = task.get_batch_iterator(task.dataset("train"), max_tokens=512, seed=seed,
                                      required_batch_size_multiple=1).next_epoch_itr(shuffle=False)
    return trainer, batches


def stepped_gradients(trainer):
    """Records, at each optimizer step, the flat gradient the underlying torch optimizer steps with (after
    fairseq's unscaling and its float32 master copies)."""
    import torch

    opt = trainer.optimizer
    inner = getattr(opt, "fp32_optimizer", opt)
    torch_opt = inner.optimizer
    record = []
    step = torch_opt.step

    def recording_step(*a, **kw):
        params = [p for group in torch_opt.param_groups for p in group["params"]]
        record.append(torch.cat([p.grad.detach().float().flatten() for p in params if p.grad is not None]))
        return step(*a, **kw)

    torch_opt.step = recording_step
    return record


def trainer_check(data, device, modes, rows, updates=2, update_freq=3):
    from fairseq_plugins.modules.floater import CUDA_GRAPHS

    for mode in modes:
        grads, captured = {}, 0
        for graph in (True, False):
            CUDA_GRAPHS.reset()
            flags = TRAINER_MODES[mode] + ["--update-freq", str(update_freq)] + (
                ["--floater-cuda-graph"] if graph else [])
            trainer, batches = build_trainer(data, device, flags)
            record = stepped_gradients(trainer)  # trainer.optimizer builds the optimizer and its master copies
            for _ in range(updates):
                trainer.train_step([next(batches) for _ in range(update_freq)])
            grads[graph] = record
            if graph:  # the buckets captured: the graph path was taken
                captured = CUDA_GRAPHS.captured_buckets()
        errors = [rel_error(a, b) for a, b in zip(grads[True], grads[False])]
        rows.add("trainer", mode=mode, update_freq=update_freq, updates=len(errors), captured_buckets=captured,
                 gradient_error=max(errors) if errors else None)
        log(f"trainer {mode}: gradient error {rows.rows[-1]['gradient_error']}, {captured} buckets")
    CUDA_GRAPHS.reset()


def bucket_buffer_bytes(flows, rows, hidden, bucket, element=4):
    """What one captured bucket holds of its own (cuda_graph._Captured.static_tensors): its output (F, P, K, H)
    and its inputs' gradients: z0 (F, K, H), (W1 W2)ᵀ (F, H, H) and four (F, 1, H)."""
    return flows * (bucket * rows * hidden + rows * hidden + hidden * hidden + 4 * hidden) * element


def pool_accounting(segments):
    """What each memory pool holds, from torch.cuda.memory_snapshot()'s segments: per segment_pool_id ((0, 0): the
    default pools; any other: a CUDA graph's private pool) its segments, their bytes (what memory_reserved()
    counts), the bytes of their allocated blocks, and the segment with the most free bytes (size, allocated).
    After empty_cache, reserved − allocated is what the allocator could not return: the free blocks of segments
    that still hold an allocation (a graph's pool keeps all of its segments while a graph captured into it lives)."""
    mib, pools = 2**20, {}
    for segment in segments:
        allocated = sum(b["size"] for b in segment["blocks"] if b["state"] == "active_allocated")
        pool = pools.setdefault(tuple(segment["segment_pool_id"]),
                                {"segments": 0, "reserved": 0, "allocated": 0, "most_free": (0, 0)})
        pool["segments"] += 1
        pool["reserved"] += segment["total_size"]
        pool["allocated"] += allocated
        if segment["total_size"] - allocated > pool["most_free"][0] - pool["most_free"][1]:
            pool["most_free"] = (segment["total_size"], allocated)
    return [{"pool": "default" if pool_id == (0, 0) else "graph", "pool_id": list(pool_id),
             "segments": p["segments"], "reserved_mib": p["reserved"] / mib, "allocated_mib": p["allocated"] / mib,
             "most_free_segment_mib": [p["most_free"][0] / mib, p["most_free"][1] / mib]}
            for pool_id, p in sorted(pools.items())]


def order_check(device, dims, lengths, tokens, rows):
    """Training steps (forward and backward, no optimizer step: the parameters stay put, so graph and loop see
    the same model) at every length, longest-first and shortest-first, graph vs loop: the gradient, the buckets
    captured, and what the graphs add to memory_reserved() once every length (the longest included) has run."""
    import gc

    import torch
    from tooling.bench import models as bench
    from fairseq_plugins.modules.floater import CUDA_GRAPHS, graph_bucket, tape_bytes

    dictionary = bench.synthetic_dictionary(1000)
    arch, flags = bench.ARCHS[dims]["floater"]
    flags = flags + ["--dropout", "0"]  # graph and loop must see the same network
    cuda = device == "cuda"
    for order in ("longest-first", "shortest-first"):
        sequence = sorted(lengths, reverse=order == "longest-first")
        grads, losses, measured = {}, {}, {}
        for graph in (False, True):
            CUDA_GRAPHS.reset()
            gc.collect()
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            b = bench.Bundle.build(arch, flags + (["--floater-cuda-graph"] if graph else []), dictionary, device,
                                   seed=1)
            for T in sequence:
                sample = bench.random_batch(dictionary, max(1, tokens // T), T, device, seed=T)
                for rep in range(2):  # the graph path: the first step captures its bucket, the second replays
                    b.optimizer.zero_grad()
                    loss, _, _ = b.task.train_step(sample, b.model, b.criterion, b.optimizer, b.updates)
                    grads[graph, T, rep] = torch.cat([p.grad.detach().float().flatten().cpu()
                                                      for p in b.model.parameters() if p.grad is not None])
                    losses[graph, T, rep] = float(loss.detach())
            cached = None
            if cuda:  # what is held, not what the allocator keeps cached for reuse (a replaced tape, a dropped
                torch.cuda.synchronize()  # graph's pool, the loop's last activations): both paths alike
                cached = torch.cuda.memory_reserved()
                gc.collect()
                torch.cuda.empty_cache()
            members = b.model.encoder.position_scheme.positions.members
            shape = (len(members), max(len(projections) for _, projections in members),
                     members[0][0].dynamics.fc1.weight.shape[0])
            measured[graph] = {
                "reserved": torch.cuda.memory_reserved() if cuda else None, "cached": cached,
                "peak_allocated": torch.cuda.max_memory_allocated() if cuda else None,
                "held": CUDA_GRAPHS.held_bytes(), "buckets": CUDA_GRAPHS.captured_buckets(),
                "pools": pool_accounting(torch.cuda.memory_snapshot()) if cuda else None}
            del b, sample, loss
        CUDA_GRAPHS.reset()
        for T in sequence:
            rows.add("order_step", order=order, length=T, bucket=graph_bucket(T),
                     gradient_error=max(rel_error(grads[True, T, r], grads[False, T, r]) for r in range(2)),
                     loss_error=max(abs(losses[True, T, r] - losses[False, T, r]) / abs(losses[False, T, r])
                                    for r in range(2)))
        flows, k, hidden = shape
        longest = graph_bucket(max(lengths))
        tape = tape_bytes(flows, k, hidden, longest)
        buffers = sum(bucket_buffer_bytes(flows, k, hidden, bucket)
                      for bucket in sorted({graph_bucket(T) for T in lengths}))
        graph_memory = (measured[True]["reserved"] - measured[False]["reserved"] if cuda
                        else measured[True]["held"])
        mib = 2**20
        rows.add("order_memory", order=order, lengths=sequence, dims=dims, tokens=tokens,
                 captured_buckets=measured[True]["buckets"],
                 reserved_loop_mib=measured[False]["reserved"] / mib if cuda else None,
                 reserved_graph_mib=measured[True]["reserved"] / mib if cuda else None,
                 reserved_before_release_mib=(measured[False]["cached"] / mib, measured[True]["cached"] / mib)
                 if cuda else None,
                 peak_loop_mib=measured[False]["peak_allocated"] / mib if cuda else None,
                 peak_graph_mib=measured[True]["peak_allocated"] / mib if cuda else None,
                 held_by_graphs_mib=measured[True]["held"] / mib, graph_memory_mib=graph_memory / mib,
                 graph_memory_measure="memory_reserved() with − without graphs, after empty_cache()" if cuda else
                 "held_bytes() (dry run: no CUDA allocator)",
                 tape_mib=tape / mib, bucket_buffers_mib=buffers / mib,
                 bound_mib=(GRAPH_MEMORY_MARGIN * tape + buffers) / mib,
                 pools_loop=measured[False]["pools"], pools_graph=measured[True]["pools"])
        r = rows.rows[-1]
        log(f"{order}: buckets {r['captured_buckets']}, graph memory {r['graph_memory_mib']:.1f} MiB "
            f"(bound {r['bound_mib']:.1f} MiB)")


def section_floater_graph(ctx, rows):
    import logging

    logging.getLogger("fairseq").setLevel(logging.WARNING)
    dry = ctx.dry_run
    solve_check(ctx.device, [21] if dry else [21, 100, 200], rows)
    log("solve: done")
    if dry:
        trainer_check(ctx.data, ctx.device, ["fp32"], rows, updates=1, update_freq=2)
        order_check(ctx.device, "tiny", [16, 24], 128, rows)
    else:
        trainer_check(ctx.data, ctx.device, list(TRAINER_MODES), rows)
        order_check(ctx.device, "base", [32, 64, 128, 256], 4096, rows)
