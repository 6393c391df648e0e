"""Randomized positional encodings (Ruoss, Delétang, Genewein, Grau-Moya, Csordás, Bennani, Legg, Veness, ACL 2023,
arXiv 2305.16843, §3): a sequence of length T takes, instead of the positions 0..T−1, an ordered random subset of
a range L larger than any test length, encoded by the sinusoid (their default base encoding)::

    x_t = E[w_t] · sqrt(d) + PE(p_t),   p_0 < p_1 < … < p_{T−1} = sort(a uniform random T-subset of {0, …, L − 1})

so that training on short sequences already visits every position a long test sequence will have.
``--randomized-max-position`` is L (default 2048, the paper's; it must be at least the stack's
--max-source/target-positions, the longest sequence the model can get).

Training: one subset per sequence (the authors' code: one per batch of equal lengths), the first T of a random
permutation of {0..L−1}, sorted, from torch's generator on the input's device (seeded by fairseq per update).

Evaluation (``--randomized-eval-positions``) is deterministic here (the authors' code draws at test time too), so
that validation, beam search and incremental decoding repeat exactly:

- ``spread`` (default): the mean of training's draw, p_r = round((r + 1)(L + 1)/(n + 1)) − 1, the expected r-th
  smallest of a uniform n-subset of {0..L−1} (neighbours ~L/n apart, as in training). The encoder's n is its
  sentence's length. A decoder writing step by step cannot know its length: it takes n̂ = round(ρ·S) from its
  source's length S (ρ = ``--randomized-length-ratio``, the expected target/source length ratio, default 1), in
  teacher-forced evaluation as well, so that incremental decoding equals the full forward; past n̂ the spacing
  goes on, clipped at L − 1.
- ``prefix``: token t takes s_t of one sorted random N-subset of {0..L−1} seeded with ``EVAL_SEED`` (N = the
  stack's max positions): tokens ~L/N apart from 0, 9.0 BLEU below ``spread`` in the Multi30k study
  (results/multi30k_study/randomized_eval/).

Mapping to code: ``Randomized`` is the scheme (its flags; ``embed`` gives the stack its embedding; the decoder's
reads its source's lengths, ``reads_source``, which the decoder sets around each forward); ``spread_positions`` is
p_r; ``RandomizedPositionalEmbedding`` is fairseq's ``SinusoidalPositionalEmbedding`` (the project's sinusoid:
position p at fairseq's padding_idx + 1 + p, frequencies 10000^(−j/(d/2 − 1)), all sines then all cosines, where
the authors' take max_timescale^(−2j/d)), a table of L rows in float32 indexed by p_t. t is the rank among the
sequence's real tokens: pads get nothing (fairseq's zero row), left padding shifts nothing.
"""

import torch
from fairseq.models import FairseqDecoder

from ..flags import Flag, FlagError, one_of, positive
from .position_scheme import PositionScheme
from .sinusoid_table import SinusoidTable

EVAL_SEED = 0  # the one draw of evaluation's positions (prefix)
EVAL_RULES = ("spread", "prefix")


def spread_positions(rank, n, max_position):
    """round((r + 1)(L + 1)/(n + 1)) − 1 for rank r of n (broadcast): the expected r-th smallest of a uniform
    n-subset of {0..L−1}, clipped to 0..L−1 (ranks past n keep the spacing)."""
    n = n.clamp(min=1).to(torch.float64)
    position = torch.round((rank.to(torch.float64) + 1) * (max_position + 1) / (n + 1)) - 1
    return position.clamp(0, max_position - 1).long()


def eval_positions(max_position, count):
    """s_0 < … < s_{count−1}: evaluation's positions, a sorted random count-subset of {0..max_position−1}."""
    generator = torch.Generator().manual_seed(EVAL_SEED)
    return torch.randperm(max_position, generator=generator)[:count].sort().values


class RandomizedPositionalEmbedding(SinusoidTable):
    def __init__(self, embedding_dim, padding_idx, max_position, num_positions, eval_rule="prefix",
                 length_ratio=None):
        super().__init__(embedding_dim, padding_idx, padding_idx + 1 + max_position)
        self.max_position, self.num_positions = max_position, num_positions
        self.eval_rule, self.length_ratio = eval_rule, length_ratio  # length_ratio: a decoder's ρ (n̂ = ρ·S)
        self.reads_source = eval_rule == "spread" and length_ratio is not None
        self.source_lengths = None  # (B,): set by the decoder around each of its forwards when reads_source
        self._eval = None  # eval_positions(), built at the first evaluation forward

    def table(self):
        """The sinusoid table, in the model's float dtype (scripts/randomized_eval.py indexes it too)."""
        self.weights = self.weights.to(self.model_float)  # float32 table (float64 for a float64 model)
        return self.weights

    def forward(self, input, incremental_state=None, timestep=None, positions=None):
        bsz, seq_len = input.shape
        real, rank = self._ranks(input, incremental_state, timestep)
        if self.training and incremental_state is None:
            if seq_len > self.max_position:
                raise ValueError(f"a sequence of {seq_len} tokens is longer than --randomized-max-position "
                                 f"{self.max_position}")
            first = torch.rand(bsz, self.max_position, device=input.device).argsort(dim=1)[:, :seq_len]
            count = real.sum(dim=1, keepdim=True)  # (B, 1): the first count of the permutation are the subset
            taken = torch.arange(seq_len, device=input.device) < count
            chosen = first.masked_fill(~taken, self.max_position).sort(dim=1).values  # (B, seq_len) ascending
            position = chosen.gather(1, rank)
        elif self.eval_rule == "spread":
            position = spread_positions(rank, self._spread_length(real), self.max_position)
        else:
            if incremental_state is None and seq_len > self.num_positions:
                raise ValueError(f"a sequence of {seq_len} tokens is longer than the {self.num_positions} positions "
                                 "of randomized positions at evaluation (--max-source/target-positions)")
            if self._eval is None or self._eval.device != input.device:
                self._eval = eval_positions(self.max_position, self.num_positions).to(input.device)
            position = self._eval.index_select(0, rank.reshape(-1)).view_as(rank)
        index = torch.where(real, position + self.padding_idx + 1, self.padding_idx)
        return self.table().index_select(0, index.view(-1)).view(bsz, index.size(1), -1).detach()

    def _ranks(self, input, incremental_state, timestep):
        """(real, rank), (B, T): which tokens get a position, and each one's rank among its sequence's real
        tokens; one decoder step (fairseq's incremental decoding) is (B, 1), every row at the step's rank."""
        if incremental_state is None:
            real = input.ne(self.padding_idx)
            return real, (torch.cumsum(real, dim=1) - 1).clamp(min=0)
        # a (1,) device tensor, never a Python int read from it: that would sync with the host at every step
        step = timestep.view(-1)[:1].long() if timestep is not None else \
            torch.full((1,), input.size(1) - 1, dtype=torch.long, device=input.device)
        bsz = input.size(0)
        return torch.ones(bsz, 1, dtype=torch.bool, device=input.device), step.view(1, 1).expand(bsz, 1)

    def _spread_length(self, real):
        """n of spread_positions, (B, 1): the encoder's sentence length; a decoder's round(ρ·S) from its source."""
        if not self.reads_source:
            return real.sum(dim=1, keepdim=True)
        if self.source_lengths is None:
            raise ValueError("randomized positions in a decoder (--randomized-eval-positions spread) need its "
                             "source's lengths")
        return torch.round(self.source_lengths.view(-1, 1).to(torch.float64) * self.length_ratio)


class Randomized(PositionScheme):
    embedding = "randomized"
    flags = (
        Flag("--randomized-max-position", positive(int), "L",
             "randomized positions: each training sequence's positions are a sorted random subset of 0..L-1 "
             "(default 2048, the paper's; at least --max-source/target-positions)", 2048),
        Flag("--randomized-eval-positions", one_of(EVAL_RULES), "RULE",
             "randomized positions at evaluation: spread (default: the mean of training's draw for the sentence's "
             "length; a decoder's length estimated from its source's, --randomized-length-ratio) or prefix (a "
             "prefix of one fixed draw: no length needed, but far denser than training's)", "spread"),
        Flag("--randomized-length-ratio", positive(float), "R",
             "randomized positions, spread: the decoder's expected target/source length ratio (default 1.0)", 1.0),
    )

    @classmethod
    def embed(cls, cfg, stack, embed_dim, max_positions):
        max_position = cfg.randomized_max_position
        if max_position < max_positions:
            raise FlagError(f"--randomized-max-position must be at least the longest sequence the model takes "
                            f"({max_positions}, --max-source/target-positions), got {max_position}")
        decoder = isinstance(stack, FairseqDecoder)
        return RandomizedPositionalEmbedding(embed_dim, stack.padding_idx, max_position, max_positions,
                                             cfg.randomized_eval_positions,
                                             cfg.randomized_length_ratio if decoder else None)
