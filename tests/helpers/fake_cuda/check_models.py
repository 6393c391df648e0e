"""Child process of tests/test_fake_cuda.py: every arch's training step and incremental decoding on fake cuda.

    cd tests && python -m helpers.fake_cuda.check_models LIBRARY OUT.json [SCENARIO ...]

Preloads the guard library (before torch: see ``__init__.py``), then runs each scenario in its own ``FakeCuda``
and writes, per scenario: ``ok``, ``error`` (the exception and the innermost frame outside torch), ``findings``
(``mode.Finding`` as dicts), ``captures``/``replays`` (CUDA graphs) and ``guard_syncs``.
"""
import json
import os
import sys
import traceback
from pathlib import Path

from helpers import fake_cuda  # noqa: E402  (no torch import)

LIB = fake_cuda.preload(sys.argv[1]) if __name__ == "__main__" else None

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from helpers.fake_cuda.mode import FakeCuda, to_cuda  # noqa: E402
from helpers.floater_helpers import batch, build  # noqa: E402
from helpers.tiny_models import PAD  # noqa: E402
from fairseq_plugins.schemes import SCHEMES  # noqa: E402

ARCHS = tuple(s.arch("tiny") for s in SCHEMES.values() if s.arch_prefix)  # every scheme with architectures


def cuda_batch():
    return [t.to("cuda") for t in batch()]


def build_cuda(arch, **kw):
    """The tiny model built as fairseq builds it (real cpu tensors, outside the fake mode; so this runs
    before the FakeCuda opens), for ``to_cuda`` inside it (as the trainer's ``model.cuda()``)."""
    return build(arch, **kw)


def floater_kw(graph):
    """FLOATER's solve replayed as CUDA graphs or step by step (--floater-cuda-graph in newer code,
    --floater-no-cuda-graph in older: both given, the model reads the one it knows)."""
    return dict(floater_cuda_graph=graph, floater_no_cuda_graph=not graph)


def train(model, updates=2):
    """fairseq's update in miniature: forward, label-smoothing-free cross entropy, backward, Adam step."""
    src, lengths, prev = cuda_batch()
    target = torch.roll(prev, -1, dims=1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for k in range(updates):
        opt.zero_grad(set_to_none=True)
        logits = model(src, lengths, prev)[0]
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), target.reshape(-1), ignore_index=PAD)
        loss.backward()
        opt.step()
        model.set_num_updates(k + 1)
    assert all(p.device.type == "cuda" for p in model.parameters())


@torch.no_grad()
def decode(model, steps=4):
    """Incremental decoding as fairseq's generator drives it: encoder once, the decoder one token per step
    with its incremental state, a beam reorder (index on cuda) half way."""
    src, lengths, prev = cuda_batch()
    model.eval()
    enc = model.encoder(src, src_lengths=lengths)
    state = {}
    tokens = prev[:, :1]
    for t in range(steps):
        logits = model.decoder(tokens, enc, incremental_state=state)[0]
        assert logits.device.type == "cuda" and logits.shape[1] == 1
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        if t == 1:
            order = torch.arange(tokens.size(0), device="cuda").flip(0)
            model.decoder.reorder_incremental_state_scripting(state, order)
            enc = model.encoder.reorder_encoder_out(enc, order)
            tokens = tokens.index_select(0, order)


def scenarios():
    out = {}
    for arch in ARCHS:
        kw = floater_kw(False) if arch.startswith("floater") else {}
        out[f"{arch}/train"] = (arch, kw, train)
        out[f"{arch}/decode"] = (arch, kw, decode)
    out["floater_transformer_tiny/train_cuda_graph"] = ("floater_transformer_tiny", floater_kw(True), train_graphed)
    out["controls"] = (None, {}, controls)
    return out


def controls(_):
    """What the checks must catch, each once (tests/test_fake_cuda.py expects these findings, at these lines)."""
    x = torch.randn(3, 4, device="cuda")
    try:
        x + torch.arange(4.0).expand(3, 4)  # device mismatch: arange without device=
    except RuntimeError:  # torch's own check, after the record
        pass
    bool(x.sum() > 0)  # host sync: a value read on the host
    x.cpu()  # host sync: a copy from cuda to cpu
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2
        torch.zeros(3)  # cpu tensor in capture
        y.sum().item()  # host sync in capture
    graph.replay()


def train_graphed(model):
    assert model.encoder.position_scheme.flow.settings.cuda_graph
    train(model, updates=3)  # the first update captures, the next ones replay


def run(name, arch, kw, fn):
    model = build_cuda(arch, **kw) if arch else None
    with FakeCuda(LIB) as fc:
        try:
            fn(to_cuda(model) if model is not None else None)
            ok, error = True, ""
        except Exception as err:  # noqa: BLE001  (reported, with where it happened)
            if os.environ.get("FAKE_CUDA_TRACEBACK"):
                traceback.print_exc()
            frames = [f for f in traceback.extract_tb(err.__traceback__) if "/torch/" not in f.filename]
            at = f"{frames[-1].filename}:{frames[-1].lineno} ({frames[-1].name})" if frames else "?"
            ok, error = False, f"{type(err).__name__}: {str(err)[:500]} [at {at}]"
    return dict(ok=ok, error=error, findings=[f.as_dict() for f in fc.findings], captures=fc.captures,
                replays=fc.replays, guard_syncs=fc.guard_syncs(), ops=fc.checks.ops)


def main(argv):
    torch.set_num_threads(1)
    wanted = argv[3:]
    results = {name: run(name, *what) for name, what in scenarios().items() if not wanted or name in wanted}
    Path(argv[2]).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv)
