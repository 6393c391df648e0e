"""The position record of ``position_transformer``'s models, around fairseq's TransformerModel.

Each model records its architecture and position schemes in its state dict (``position_record``), so that
a checkpoint refuses, in one line naming both, to load into a model of another scheme: schemes without
parameters of their own (RoPE, ALiBi, NoPE, sinusoidal) have identical state dicts, which nothing else tells
apart."""
import logging
import sys

import torch
from fairseq.models.transformer import TransformerModel
from fairseq.modules import SinusoidalPositionalEmbedding

logger = logging.getLogger(__name__)

RECORD = "position_record"
RECORD_BYTES = 128  # fixed: a shape that differed with the text would read as an architecture mismatch
# int64, not uint8: fairseq's own scripts/average_checkpoints.py sums integer tensors in their dtype and then
# floor-divides, which overflows bytes and is exact for int64; fp16 and bf16 casts leave integer buffers alone
RECORD_DTYPE = torch.int64


def encode_record(text):
    data = text.encode()[:RECORD_BYTES]
    return torch.tensor(list(data) + [0] * (RECORD_BYTES - len(data)), dtype=RECORD_DTYPE)


def decode_record(tensor):
    """'arch encoder_scheme decoder_scheme' from a record tensor (any dtype: averaging may have made it float)."""
    return bytes(int(b) for b in tensor.round().to(torch.uint8).tolist() if b).decode(errors="replace")


class SchemeMismatch(ValueError):
    one_line = True  # fairseq_plugins' excepthook prints the message alone


def _stack_limit(stack):
    table = getattr(stack, "embed_positions", None)
    return None if table is None or isinstance(table, SinusoidalPositionalEmbedding) else stack.max_positions()


class PluginTransformerModel(TransformerModel):
    """What ``position_transformer`` adds to fairseq's TransformerModel that is not about building it: the
    ``--allow-scheme-change`` flag, the stacks' length limits and the checked load of a checkpoint (the model's
    record is registered by the subclass, ``RECORD``)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--allow-scheme-change", action="store_true",
                            help="load a checkpoint of another position scheme into this model (--restore-file, "
                                 "--finetune-from-model; refused without it, since a model does not carry over "
                                 "between schemes; scripts/transformer_to_floater.py is the supported warm start)")

    def max_positions(self):
        """(source, target) lengths the model can take: None for a stack with no length limit, so that the
        task's --max-source-positions/--max-target-positions (at training and at decoding alike) decide alone.
        fairseq's own encoder reports its stored max_source_positions, a training setting that a decode-time flag
        cannot raise; only a learned table has rows to run out of (sinusoidal tables, SHAPE's included, grow on
        demand; relative, score-bias, rotary and ODE positions have no table)."""
        return _stack_limit(self.encoder), _stack_limit(self.decoder)

    def max_decoder_positions(self):
        limit = _stack_limit(self.decoder)
        return sys.maxsize if limit is None else limit

    def prepare_for_inference_(self, cfg):
        """fairseq-generate and -interactive call this once the model is loaded (and halved for --fp16). Their
        release (and fairseq's main) accepts --bf16 and then decodes in float32 without a word; the patched
        fairseq casts first. Here the cast is done wherever the fairseq did not, so --bf16 decodes in bfloat16."""
        common = getattr(cfg, "common", None)
        if common is not None and getattr(common, "bf16", False) and not getattr(common, "fp16", False):
            self.to(dtype=torch.bfloat16)  # floating tensors only: the integer position record stays as it is
        super().prepare_for_inference_(cfg)

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """fairseq's strict loads (fairseq-train --restore-file/--finetune-from-model, fairseq-generate --path,
        the hub) refuse a checkpoint whose record names other position schemes, in one line naming both, unless
        --allow-scheme-change. A checkpoint without a record (written before records were kept, or by one of
        fairseq's own models) loads as it did (its scheme is only what its tensors show, checked by the strict
        load); from then on it carries this model's record. A
        non-strict load (the warm-start converter's) is a partial load by intent and is not checked."""
        mine = decode_record(getattr(self, RECORD))
        theirs = state_dict.get(RECORD)
        if theirs is None and strict:  # the converter's partial load of a fairseq Transformer has none, as it should
            logger.info(f"the checkpoint has no position-scheme record (fairseq's own models write none, nor did "
                        f"this project's before records were kept): loaded as {mine}")
        elif theirs is not None and strict:
            t_arch, *t_schemes = decode_record(theirs).split()
            m_arch, *m_schemes = mine.split()
            if t_schemes != m_schemes and not getattr(self.args, "allow_scheme_change", False):
                raise SchemeMismatch(
                    f"the checkpoint holds a {t_arch} model (position schemes: encoder {t_schemes[0]}, decoder "
                    f"{t_schemes[-1]}) and this model is {m_arch} (encoder {m_schemes[0]}, decoder "
                    f"{m_schemes[-1]}): a model does not carry over between position schemes; use the same "
                    "--arch, or pass --allow-scheme-change to load it anyway")
        # this model's record replaces the checkpoint's (or its absence), in place as fairseq's upgrades are made,
        # so that fairseq's report of other differences does not name the record
        state_dict[RECORD] = getattr(self, RECORD).clone()
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)
