"""What the plugin model families share, around fairseq's TransformerModel: their flags after fairseq's, their
defaults and checks before fairseq builds, their encoder and decoder classes, and a one-line refusal of
torch.jit.script (fairseq's ``__prepare_scriptable__`` hook) instead of TorchScript's compile error deep inside."""
from fairseq.models.transformer import TransformerConfig, TransformerModel

from ._config import as_namespace


class PluginTransformerModel(TransformerModel):
    encoder_class = decoder_class = None  # TransformerEncoderBase / TransformerDecoderBase subclasses
    not_scriptable = ""  # why torch.jit.script cannot export the family, for its one-line error

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        cls.add_family_args(parser)

    @classmethod
    def add_family_args(cls, parser):
        """The family's own flags (no defaults: the architectures set them, fairseq's legacy convention)."""

    @classmethod
    def build_model(cls, args, task):
        args = as_namespace(args)  # fairseq-hydra-train passes a DictConfig
        cls.prepare_args(args)
        return super().build_model(args, task)

    @classmethod
    def prepare_args(cls, args):
        """Fill the family's defaults and check its flags (ValueError with one line) before fairseq builds."""

    @classmethod
    def stack_args(cls, args, decoder):
        """Extra keyword arguments of the encoder (decoder=False) or decoder class."""
        return {}

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return cls.encoder_class(TransformerConfig.from_namespace(args), src_dict, embed_tokens,
                                 **cls.stack_args(args, decoder=False))

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return cls.decoder_class(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention,
                                 **cls.stack_args(args, decoder=True))

    def family_name(self):
        return self.__class__.family

    def __prepare_scriptable__(self):
        # torch.jit.script calls this first: one line instead of TorchScript's compile error deep inside
        raise RuntimeError(f"{self.family_name()} cannot be exported with torch.jit.script: {self.not_scriptable}; "
                           "use the model unscripted")
