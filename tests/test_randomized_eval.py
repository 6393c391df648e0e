"""scripts/randomized_eval.py: its rules are what its docstring says, and its decoding sees the positions its
teacher-forced loss sees."""
import itertools

import torch

from helpers.tiny_models import build, fixed_batch, one_thread  # noqa: F401 (autouse fixture)
from randomized_eval import Rule
from fairseq_plugins.modules.randomized_positions import spread_positions


def test_spread_is_the_expected_order_statistic_of_a_uniform_subset():
    length = 10
    for n in (1, 3, 4, 6):
        subsets = torch.tensor(list(itertools.combinations(range(length), n)), dtype=torch.float64)
        rank = torch.arange(n)
        mean = subsets.mean(0)  # E[r-th smallest], by enumeration of every n-subset of 0..L-1
        assert torch.allclose(mean, (rank + 1).double() * (length + 1) / (n + 1) - 1)
        assert (spread_positions(rank, torch.tensor(n), length) - mean).abs().max() <= 0.5


def test_its_rules_are_the_modules_and_spread_hat_decodes_as_it_scores():
    """prefix and spread_hat set on a default model give what a model built with that rule (and ratio) computes;
    step by step equals the full forward."""
    src, lengths, prev = fixed_batch()
    with torch.no_grad():
        own = {rule: build("randomized_transformer_tiny", randomized_eval_positions=rule,
                           randomized_length_ratio=1.3).eval()(src, lengths, prev)[0] for rule in ("prefix", "spread")}
        model = build("randomized_transformer_tiny").eval()
        rule = Rule(model, ratio=1.3)
        assert torch.equal(model(src, lengths, prev)[0], own["prefix"])
        rule.set("spread_hat")
        full = model(src, lengths, prev)[0]
        torch.testing.assert_close(full, own["spread"], rtol=0, atol=1e-6)
        assert not torch.allclose(full, own["prefix"], atol=1e-3)
        encoder_out = model.encoder(src, src_lengths=lengths)
        state = {}
        steps = [model.decoder(prev[:, :t + 1], encoder_out=encoder_out, incremental_state=state)[0]
                 for t in range(prev.size(1))]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
