"""SHAPE, shifted absolute position embedding (Kiyono, Kobayashi, Suzuki, Inui, EMNLP 2021, arXiv 2109.05644).

The sinusoidal embedding of each token's position, with the positions of a whole sequence shifted by one
random offset in training and by the fixed offset K at validation and test::

    x_i = E[w_i] · sqrt(d) + PE(i + k),    k ~ U{0, …, K − 1} per sequence in training;   k = K otherwise

so that the model cannot rely on absolute positions and learns shift-invariant (relative) ones, at the plain
Transformer's cost. This is the authors' code (github.com/butsugiri/shape, OpenNMT-py,
``onmt/modules/embeddings.py``: ``torch.randint(0, K)`` per sequence when training, ``pe[step + K:]`` in eval
mode, K = ``--pe_noise_size``); encoder and decoder draw their offsets independently (one module each), the
decoder's teacher-forced training forward is shifted too, and K = 0 is the plain Transformer.
``--shape-max-shift`` is K (default 100), ``--shape-eval-offset`` the offset in eval mode (default K).

Mapping to code: ``SHAPE`` is the scheme (its flags; its ``embed`` hook gives the stack its embedding);
``ShapePositionalEmbedding`` is fairseq's ``SinusoidalPositionalEmbedding`` (the project's
sinusoidal Transformer's: positions from padding_idx + 1 = 2 where OpenNMT-py counts from 0, frequencies
10000^(−j/(d/2 − 1)) laid out as all sines then all cosines where OpenNMT-py interleaves 10000^(−2j/d); the
shift is the same) whose positions get the offset: pads keep padding_idx, left padding shifts nothing;
incremental decoding adds the eval offset to fairseq's step position. The offsets come from torch's generator,
which fairseq seeds per update: a resumed run draws the same ones.

Checkpoints trained before ``--shape-eval-offset`` existed drew k ~ U{0, …, K} and used k = 0 in eval mode;
their state dict has no ``version`` entry, and ``upgrade_state_dict_named`` keeps that behaviour for them.
"""

import torch
from fairseq import utils
from fairseq.modules import SinusoidalPositionalEmbedding

from ..flags import Flag, at_least
from .position_scheme import PositionScheme
from .sinusoid_table import SinusoidTable

VERSION = 2  # 1 (or no entry): k ~ U{0..K} in training, 0 in eval mode; 2: the authors' U{0..K-1}, then K


class ShapePositionalEmbedding(SinusoidTable):
    def __init__(self, embedding_dim: int, padding_idx: int, init_size: int, max_shift: int, eval_offset: int):
        super().__init__(embedding_dim, padding_idx, init_size + max(max_shift, eval_offset))
        self.max_shift, self.eval_offset = max_shift, eval_offset
        self.num_shifts = max_shift  # training: k in 0..num_shifts-1
        self.register_buffer("version", torch.tensor([float(VERSION)]))

    def upgrade_state_dict_named(self, state_dict, name):
        key = f"{name}.version"
        if key not in state_dict or state_dict[key].item() < VERSION:  # trained by the code before version 2
            self.num_shifts, self.eval_offset = self.max_shift + 1, 0
            state_dict[key] = torch.tensor([1.0])  # saved again (resumed, fine-tuned), it stays version 1

    def forward(self, input, incremental_state=None, timestep=None, positions=None):
        shifted = self.training and self.num_shifts > 0 and incremental_state is None
        if not shifted and self.eval_offset == 0:
            return super().forward(input, incremental_state, timestep, positions)
        bsz, seq_len = input.shape
        need = self.padding_idx + 1 + seq_len + max(self.num_shifts, self.eval_offset)
        if self.weights is None or need > self.weights.size(0):
            self.weights = SinusoidalPositionalEmbedding.get_embedding(need, self.embedding_dim, self.padding_idx)
        self.weights = self.weights.to(self.model_float)
        if incremental_state is not None:  # one decoder step, as fairseq's: position padding_idx + step + 1
            step = timestep.view(-1)[0] + 1 if timestep is not None else seq_len
            return self.weights[self.padding_idx + step + self.eval_offset, :].expand(bsz, 1, -1)
        positions = utils.make_positions(input, self.padding_idx, onnx_trace=self.onnx_trace)
        if shifted:
            shift = torch.randint(0, self.num_shifts, (bsz, 1), device=input.device)  # (B, 1): one k per sequence
        else:
            shift = self.eval_offset
        positions = torch.where(input.ne(self.padding_idx), positions + shift, positions)
        return self.weights.index_select(0, positions.view(-1)).view(bsz, seq_len, -1).detach()


class SHAPE(PositionScheme):
    embedding = "shape"
    flags = (
        Flag("--shape-max-shift", at_least(int, 0), "K",
             "SHAPE: training offsets drawn uniformly from 0..K-1, one per sequence, as the authors' code (default "
             "100; 0: no shift)", 100),
        # the default is K (filled in below); 100, K's default, is what another scheme's model may hold unrefused
        Flag("--shape-eval-offset", at_least(int, 0), "E",
             "SHAPE: the offset of every sequence at validation and test (default K, as the authors' code)", 100),
    )

    @classmethod
    def defaults(cls, args):
        if getattr(args, "shape_eval_offset", None) is None:
            max_shift = getattr(args, "shape_max_shift", None)
            args.shape_eval_offset = cls.flags[0].default if max_shift is None else max_shift
        super().defaults(args)

    @classmethod
    def embed(cls, cfg, stack, embed_dim, max_positions):
        return ShapePositionalEmbedding(embed_dim, stack.padding_idx, max_positions + stack.padding_idx + 1,
                                        cfg.shape_max_shift, cfg.shape_eval_offset)
