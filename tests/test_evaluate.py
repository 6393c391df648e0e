"""Scoring and checkpoint averaging: scripts/score.py against the sacrebleu command line on real newstest2014
references, the papers' compound splitting, and scripts/average_checkpoints.py against the element-wise mean."""
import sys

import pytest
import sentencepiece as spm
import torch

from conftest import BIN, SHARED_DATA, run

import average_checkpoints
from tooling.bleu import prepare, split_compounds

NEWSTEST = SHARED_DATA / "wmt14" / "newstest2014.ende.de"
needs_newstest = pytest.mark.skipif(not NEWSTEST.is_file(), reason="real newstest2014 not available (../shared/data/wmt14)")


@pytest.mark.parametrize("text, expected", [
    ("a well-known fact", "a well ##AT##-##AT## known fact"),
    ("Nord-Süd-Verbindung", "Nord ##AT##-##AT## Süd ##AT##-##AT## Verbindung"),
    ("a-b-c", "a ##AT##-##AT## b-c"),  # Perl's s///g does not overlap matches: the recipe's quirk, kept
    ("x - y", "x - y"),  # a free-standing dash is not a compound
    ("-5 and 5-", "-5 and 5-"),  # nothing on one side
    ("", ""),
])
def test_split_compounds(text, expected):
    assert split_compounds(text) == expected


def test_tokenized_form():
    """13a tokenization first (punctuation split off, digits keep their own dash rule), then the splitting."""
    assert prepare("Die E-Mail-Adresse, bitte.") == "Die E ##AT##-##AT## Mail ##AT##-##AT## Adresse , bitte ."
    assert prepare("the 5-year plan") == "the 5 - year plan"


@pytest.fixture(scope="module")
def scoring_setup(tmp_path_factory):
    """newstest2014 references (De), a sentencepiece model that decodes them back exactly (identity
    normalisation), and a function writing a fairseq-generate log for given hypotheses."""
    tmp = tmp_path_factory.mktemp("scoring")
    refs = NEWSTEST.read_text(encoding="utf-8").split("\n")[:-1]
    spm.SentencePieceTrainer.train(input=str(NEWSTEST), model_prefix=str(tmp / "spm"), vocab_size=2000,
                                   model_type="bpe", character_coverage=1.0, normalization_rule_name="identity",
                                   bos_id=-1, eos_id=-1, unk_id=0, hard_vocab_limit=False, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(tmp / "spm.model"))

    def generate_log(hyps, name):
        path = tmp / f"{name}.gen"
        order = list(range(len(hyps)))[::-1]  # fairseq prints in batch order, not sentence order
        path.write_text("".join(f"S-{i}\tsrc\nH-{i}\t-0.5\t{' '.join(sp.encode(hyps[i], out_type=str))}\n" for i in order),
                        encoding="utf-8")
        return path

    return tmp, refs, generate_log


def score(setup, hyps, name):
    tmp, _, generate_log = setup
    out = tmp / f"{name}.json"
    run([sys.executable, "scripts/score.py", "--generate-log", str(generate_log(hyps, name)), "--spm",
         str(tmp / "spm.model"), "--ref", str(NEWSTEST), "--out", str(out), "--hyp-out", str(tmp / f"{name}.hyp"),
         "--tokenized-bleu"])
    import json

    return json.loads(out.read_text())


def sacrebleu_cli(ref, hyp, *extra):
    out = run([str(BIN / "sacrebleu"), str(ref), "-i", str(hyp), "-b", "-w", "2", *extra]).stdout
    return float(out.strip().splitlines()[-1])  # (warnings about tokenized input come first)


@needs_newstest
def test_references_score_100(scoring_setup):
    _, refs, _ = scoring_setup
    result = score(scoring_setup, refs, "identity")
    assert result["sentences"] == 3003
    assert result["bleu"] == 100.0 and result["bleu_tokenized"] == 100.0
    assert result["sacrebleu_signature"] == "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"


@needs_newstest
def test_perturbed_hypotheses_score_as_the_sacrebleu_cli(scoring_setup):
    tmp, refs, _ = scoring_setup
    hyps = []
    for i, ref in enumerate(refs):
        words = ref.split()
        if i % 3 == 0:
            words = words[:-1]  # a dropped word
        if i % 5 == 0 and len(words) > 2:
            words[0], words[1] = words[1], words[0]  # a swap
        if i % 7 == 0:
            words = [w.lower() for w in words]
        if i % 11 == 0:
            words = [w.replace("-", " ") for w in words]  # a compound written apart
        hyps.append(" ".join(" ".join(words).split()))
    result = score(scoring_setup, hyps, "perturbed")
    hyp_file = tmp / "perturbed.hyp"
    assert hyp_file.read_text(encoding="utf-8").split("\n")[:-1] == hyps
    expected = sacrebleu_cli(NEWSTEST, hyp_file)
    assert 30 < expected < 100 and result["bleu"] == expected

    # the papers' BLEU: the same CLI, untokenized, on the tokenized compound-split text
    (tmp / "ref.atat").write_text("".join(prepare(r) + "\n" for r in refs), encoding="utf-8")
    (tmp / "hyp.atat").write_text("".join(prepare(h) + "\n" for h in hyps), encoding="utf-8")
    assert result["bleu_tokenized"] == sacrebleu_cli(tmp / "ref.atat", tmp / "hyp.atat", "-tok", "none")
    assert result["bleu_tokenized"] != result["bleu"]


def fake_checkpoint(path, seed, step, dtype=torch.float32, extra_key=None, shape=(3, 4)):
    g = torch.Generator().manual_seed(seed)
    model = {"encoder.w": torch.randn(*shape, generator=g).to(dtype), "decoder.b": torch.randn(5, generator=g).to(dtype),
             "flow.num_updates": torch.tensor(step)}
    if extra_key:
        model[extra_key] = torch.zeros(1)
    torch.save({"cfg": {"model": {"_name": "tiny"}, "step": step}, "model": model, "extra_state": {"epoch": step},
                "optimizer_history": [{"num_updates": step}], "last_optimizer_state": {"state": {}}}, path)
    return model


def test_average_is_the_elementwise_mean(tmp_path):
    models = [fake_checkpoint(tmp_path / f"checkpoint_1_{u}.pt", seed=u, step=u) for u in (10, 20, 30)]
    fake_checkpoint(tmp_path / "checkpoint_1_5.pt", seed=5, step=5)  # older: not among the last three
    out = tmp_path / "avg.pt"
    run([sys.executable, "scripts/average_checkpoints.py", "--inputs", str(tmp_path), "--num-update-checkpoints", "3",
         "--output", str(out)])
    avg = torch.load(out, weights_only=False)
    for key in ("encoder.w", "decoder.b"):
        stacked = torch.stack([m[key] for m in models])
        assert torch.equal(avg["model"][key], stacked.double().mean(0).float())
        assert torch.allclose(avg["model"][key], stacked.mean(0), atol=1e-7)
    assert avg["model"]["flow.num_updates"].item() == 30  # integer buffers: the last checkpoint's
    assert avg["cfg"]["step"] == 30 and "last_optimizer_state" not in avg  # the last one's cfg, no optimizer
    assert [p.split("/")[-1] for p in avg["extra_state"]["averaged_checkpoints"]] == \
        ["checkpoint_1_10.pt", "checkpoint_1_20.pt", "checkpoint_1_30.pt"]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("checkpoint_")) == ["avg.pt"]


def test_average_epoch_checkpoints_and_half_precision(tmp_path):
    models = [fake_checkpoint(tmp_path / f"checkpoint{e}.pt", seed=e, step=e, dtype=torch.float16) for e in (1, 2, 3)]
    state = average_checkpoints.average(average_checkpoints.select_checkpoints(tmp_path, 2, "epoch"))
    expected = (models[1]["encoder.w"].double() + models[2]["encoder.w"].double()) / 2
    assert state["model"]["encoder.w"].dtype == torch.float16
    assert torch.equal(state["model"]["encoder.w"], expected.half())



def test_average_on_a_fairseq_without_the_patchs_loader(tmp_path, monkeypatch):
    """The release and fairseq's main have no checkpoint_utils.torch_load_checkpoint (the patch adds it): the
    script loads the same way there (it died on an ImportError) and averages the same."""
    import fairseq.checkpoint_utils

    for e in (1, 2):
        fake_checkpoint(tmp_path / f"checkpoint{e}.pt", seed=e, step=e)
    with_patch = average_checkpoints.average(average_checkpoints.select_checkpoints(tmp_path, 2, "epoch"))
    monkeypatch.delattr(fairseq.checkpoint_utils, "torch_load_checkpoint")
    without = average_checkpoints.average(average_checkpoints.select_checkpoints(tmp_path, 2, "epoch"))
    assert with_patch["model"].keys() == without["model"].keys()
    assert all(torch.equal(with_patch["model"][k], without["model"][k]) for k in with_patch["model"])

@pytest.mark.parametrize("case, message", [
    ("keys", "parameter names differ: it has ['decoder.extra']"),
    ("shape", "parameter encoder.w has shape (4, 4), but (3, 4) in"),
    ("few", "2 update checkpoints, 5 needed"),
])
def test_average_refuses_mismatches(tmp_path, case, message):
    fake_checkpoint(tmp_path / "checkpoint_1_1.pt", seed=1, step=1)
    fake_checkpoint(tmp_path / "checkpoint_1_2.pt", seed=2, step=2, extra_key="decoder.extra" if case == "keys" else None,
                    shape=(4, 4) if case == "shape" else (3, 4))
    args = ["--inputs", str(tmp_path), "--num-update-checkpoints", "5" if case == "few" else "2"]
    with pytest.raises(SystemExit) as stop:  # the command line's one-line error (exit status 1)
        average_checkpoints.main([*args, "--output", str(tmp_path / "avg.pt")])
    assert str(stop.value.code).startswith("average_checkpoints.py: ") and message in str(stop.value.code)
    assert "\n" not in str(stop.value.code)
    assert not (tmp_path / "avg.pt").exists()
