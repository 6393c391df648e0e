"""Randomized positional encodings (Ruoss, Delétang, Genewein, Grau-Moya, Csordás, Bennani, Legg, Veness, ACL 2023,
arXiv 2305.16843, §3): a sequence of length T takes, instead of the positions 0..T−1, an ordered random subset of
a range L larger than any test length, encoded by the sinusoid (their default base encoding)::

    x_t = E[w_t] · sqrt(d) + PE(p_t),   p_0 < p_1 < … < p_{T−1} = sort(a uniform random T-subset of {0, …, L − 1})

so that training on short sequences already visits every position a long test sequence will have.
``--randomized-max-position`` is L (default 2048, the paper's; it must be at least the stack's
--max-source/target-positions, the longest sequence the model can get).

Training: one subset per sequence (the authors' code draws one per batch, whose sequences all have the same
length; here sequences of a batch differ in length), drawn as the first T of a random permutation of {0..L−1}
(``torch.rand(B, L).argsort``) then sorted, from torch's generator on the input's device, which fairseq seeds
per update: a resumed run draws the same.

Evaluation: the authors' code randomizes at test time too (``range_evaluation.py`` applies the model with a
fresh key per batch). Here evaluation draws too, but once and reproducibly, so that validation, beam search and
incremental decoding are deterministic: one sorted random subset s_0 < … < s_{N−1} of {0..L−1}, N = the stack's
max positions, drawn from a generator seeded with ``EVAL_SEED``, and token t takes s_t. A prefix of s is the
positions of the prefix, so decoding step t (which cannot know the final length) takes s_t and incremental
decoding equals the full forward; with L = N, s is 0..N−1 and evaluation is the plain sinusoid.

Mapping to code: ``Randomized`` is the scheme (its flag; ``embed`` gives the stack its embedding);
``RandomizedPositionalEmbedding`` is fairseq's ``SinusoidalPositionalEmbedding`` (the project's sinusoid:
position p at fairseq's padding_idx + 1 + p, frequencies 10000^(−j/(d/2 − 1)), all sines then all cosines, where
the authors' take max_timescale^(−2j/d)), a table of L rows in float32 indexed by p_t. t is the rank among the
sequence's real tokens: pads get nothing (fairseq's zero row), left padding shifts nothing.
"""

import torch
from fairseq.modules import SinusoidalPositionalEmbedding

from ..flags import Flag, FlagError, positive
from .position_scheme import PositionScheme

EVAL_SEED = 0  # the one draw of evaluation's positions


def eval_positions(max_position, count):
    """s_0 < … < s_{count−1}: evaluation's positions, a sorted random count-subset of {0..max_position−1}."""
    generator = torch.Generator().manual_seed(EVAL_SEED)
    return torch.randperm(max_position, generator=generator)[:count].sort().values


class RandomizedPositionalEmbedding(SinusoidalPositionalEmbedding):
    def __init__(self, embedding_dim, padding_idx, max_position, num_positions):
        super().__init__(embedding_dim, padding_idx, padding_idx + 1 + max_position)
        self.max_position, self.num_positions = max_position, num_positions
        self._eval = None  # eval_positions(), built at the first evaluation forward

    def _table(self):
        self.weights = self.weights.to(self._float_tensor)  # float32 table (float64 for a float64 model)
        return self.weights

    def forward(self, input, incremental_state=None, timestep=None, positions=None):
        bsz, seq_len = input.shape
        weights = self._table()
        if self.training and incremental_state is None:
            if seq_len > self.max_position:
                raise ValueError(f"a sequence of {seq_len} tokens is longer than --randomized-max-position "
                                 f"{self.max_position}")
            first = torch.rand(bsz, self.max_position, device=input.device).argsort(dim=1)[:, :seq_len]
            real = input.ne(self.padding_idx)
            count = real.sum(dim=1, keepdim=True)  # (B, 1): the first count of the permutation are the subset
            taken = torch.arange(seq_len, device=input.device) < count
            chosen = first.masked_fill(~taken, self.max_position).sort(dim=1).values  # (B, seq_len) ascending
        else:
            if self._eval is None or self._eval.device != input.device:
                self._eval = eval_positions(self.max_position, self.num_positions).to(input.device)
            if incremental_state is not None:  # one decoder step, as fairseq's: the step's rank
                # index_select, not weights[tensor]: indexing by a 0-d device tensor reads it on the host
                step = timestep.view(-1)[:1].long() if timestep is not None else \
                    torch.full((1,), seq_len - 1, dtype=torch.long, device=input.device)
                row = self._eval.index_select(0, step) + (self.padding_idx + 1)
                return weights.index_select(0, row).expand(bsz, 1, -1)
            if seq_len > self.num_positions:
                raise ValueError(f"a sequence of {seq_len} tokens is longer than the {self.num_positions} positions "
                                 "of randomized positions at evaluation (--max-source/target-positions)")
            real = input.ne(self.padding_idx)
            chosen = self._eval[:seq_len].expand(bsz, -1)
        rank = (torch.cumsum(real, dim=1) - 1).clamp(min=0)
        index = torch.where(real, chosen.gather(1, rank) + self.padding_idx + 1, self.padding_idx)
        return weights.index_select(0, index.view(-1)).view(bsz, seq_len, -1).detach()


class Randomized(PositionScheme):
    embedding = "randomized"
    flags = (
        Flag("--randomized-max-position", positive(int), "L",
             "randomized positions: each training sequence's positions are a sorted random subset of 0..L-1 "
             "(default 2048, the paper's; at least --max-source/target-positions)", 2048),
    )

    @classmethod
    def embed(cls, cfg, stack, embed_dim, max_positions):
        max_position = cfg.randomized_max_position
        if max_position < max_positions:
            raise FlagError(f"--randomized-max-position must be at least the longest sequence the model takes "
                            f"({max_positions}, --max-source/target-positions), got {max_position}")
        return RandomizedPositionalEmbedding(embed_dim, stack.padding_idx, max_position, max_positions)
