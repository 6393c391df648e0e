"""Decoding past 1,024 tokens with fairseq's ordinary flags: a stack whose positions have no table to run out of
(RoPE, T5, ALiBi, NoPE, Shaw, FLOATER, sinusoidal and SHAPE) reports no length limit of its own, so the task's
--max-source-positions/--max-target-positions decide, at decoding as at training; a learned table keeps its
limit."""
import pytest

from conftest import BIN
from fairseq_plugins.schemes import SCHEMES
from helpers.small_task import run_split, small_data, tiny_checkpoint
from helpers.tiny_models import build_with_args, one_thread  # noqa: F401  (autouse fixture)

TABLE_ARCHS = [s.arch("tiny") for s in SCHEMES.values() if s.arch_prefix and s.family != "transformer"]


@pytest.mark.parametrize("arch", TABLE_ARCHS)
def test_stacks_without_a_table_have_no_limit(arch):
    model, _ = build_with_args(arch)
    assert model.max_positions() == (None, None)


def test_a_learned_table_keeps_its_limit():
    model, _ = build_with_args("position_transformer", position_scheme="learned", max_source_positions=64,
                               max_target_positions=32, encoder_layers=1, decoder_layers=1, encoder_embed_dim=16,
                               decoder_embed_dim=16, encoder_ffn_embed_dim=16, decoder_ffn_embed_dim=16,
                               encoder_attention_heads=2, decoder_attention_heads=2)
    assert model.max_positions() == (64, 32)


@pytest.fixture(scope="module")
def rope(tmp_path_factory):
    return small_data(tmp_path_factory), tiny_checkpoint(tmp_path_factory, "rope_transformer_tiny")


def interactive(data, ckpt, source, *flags):
    return run_split([str(BIN / "fairseq-interactive"), str(data / "bin"), "--user-dir", "fairseq_plugins",
                      "--path", str(ckpt), "--cpu", "--beam", "1", "--max-len-b", "3", "--input", str(source),
                      *flags])


def test_interactive_decodes_a_1100_token_source_with_the_ordinary_flags(rope, tmp_path):
    data, ckpt = rope
    words = [line.split()[0] for line in (data / "bin" / "dict.src.txt").read_text().splitlines()[:50]]
    source = tmp_path / "long.txt"
    source.write_text(" ".join(words[i % len(words)] for i in range(1100)) + "\n")
    proc = interactive(data, ckpt, source, "--max-source-positions", "2048", "--max-target-positions", "2048")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [line for line in proc.stdout.splitlines() if line.startswith("H-0")]
    # and without them the task's default (1,024) is the limit, in fairseq's own size error
    proc = interactive(data, ckpt, source)
    assert proc.returncode != 0 and "since max_positions=(1024, 1024)" in proc.stderr
