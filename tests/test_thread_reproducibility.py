"""Every scheme's training step is bitwise reproducible on a multi-threaded CPU: the same parameters, batch and
seed give the same gradients at 2 intra-op threads, run after run (`make demo` trains with the machine's threads;
a scheme whose backward accumulates in a thread-scheduled order would give another model every run)."""
import pytest
import torch

from fairseq_plugins.schemes import SCHEMES
from helpers import tiny_models
from helpers.tiny_models import one_thread  # noqa: F401  (autouse fixture: 1 thread outside the test)

MODELS = sorted(SCHEMES)


def build(name):
    scheme = SCHEMES[name]
    flags = {f.lstrip("-").replace("-", "_"): True for f in scheme.flags}  # learned: --encoder-learned-pos ...
    return tiny_models.build(scheme.arch("tiny"), seed=0, dropout=0.1, **flags).train()


@pytest.mark.parametrize("name", MODELS)
def test_training_gradients_repeat_at_two_threads(name):
    model = build(name)
    src, lengths, prev = tiny_models.batch(bsz=48, src_len=30, tgt_len=28, seed=1)  # big enough for parallel kernels
    weights = torch.linspace(-1, 1, len(tiny_models.TASK.target_dictionary))

    def gradients():
        model.zero_grad()
        torch.manual_seed(5)  # dropout and SHAPE's random shift draw the same numbers each time
        torch.set_num_threads(2)
        try:
            out = model(src, lengths, prev)[0]
            (out.float().log_softmax(-1) * weights).sum().backward()
        finally:
            torch.set_num_threads(1)
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    first = gradients()
    assert first, "no parameter received a gradient"
    for _ in range(3):
        again = gradients()
        changed = [n for n in first if not torch.equal(first[n], again[n])]
        assert not changed, f"{name}: gradients differ between identical runs at 2 threads: {changed[:5]}"
