"""SHAPE, shifted absolute position embedding (Kiyono, Kobayashi, Suzuki, Inui, EMNLP 2021, arXiv 2109.05644).

The sinusoidal embedding of each token's position, with the positions of a whole sequence shifted by one
random offset during training and none at test::

    x_i = E[w_i] · sqrt(d) + PE(i + k),    k ~ U{0, …, K} per sequence in training;  k = 0 at test

so that the model cannot rely on absolute positions and learns shift-invariant (relative) ones, while keeping
the plain Transformer's cost. Encoder and decoder draw their offsets independently. K = 100 by default
(``--shape-max-shift``).

Mapping to code: ``ShapePositionalEmbedding`` is fairseq's ``SinusoidalPositionalEmbedding`` whose positions
(fairseq's numbering: pads keep padding_idx, left padding does not shift them) get the offset in training mode;
incremental decoding (eval) is fairseq's own path. The offsets come from torch's generator, which fairseq seeds
per update: a resumed run draws the same ones.
"""

import torch
from fairseq import utils
from fairseq.modules import SinusoidalPositionalEmbedding


class ShapePositionalEmbedding(SinusoidalPositionalEmbedding):
    def __init__(self, embedding_dim: int, padding_idx: int, init_size: int, max_shift: int):
        super().__init__(embedding_dim, padding_idx, init_size + max_shift)
        self.max_shift = max_shift

    def forward(self, input, incremental_state=None, timestep=None, positions=None):
        if not self.training or self.max_shift == 0 or incremental_state is not None:
            return super().forward(input, incremental_state, timestep, positions)
        bsz, seq_len = input.shape
        need = self.padding_idx + 1 + seq_len + self.max_shift
        if self.weights is None or need > self.weights.size(0):
            self.weights = SinusoidalPositionalEmbedding.get_embedding(need, self.embedding_dim, self.padding_idx)
        self.weights = self.weights.to(self._float_tensor)
        positions = utils.make_positions(input, self.padding_idx, onnx_trace=self.onnx_trace)
        shift = torch.randint(0, self.max_shift + 1, (bsz, 1), device=input.device)
        positions = torch.where(input.ne(self.padding_idx), positions + shift, positions)
        return self.weights.index_select(0, positions.view(-1)).view(bsz, seq_len, -1).detach()
