"""What tests/test_old_checkpoints.py compares, computed the same way by the code that wrote a checkpoint
(tests/data/old_checkpoints/make_schemes.sh records it) and by today's code (the test): a checkpoint loaded as
fairseq-generate loads it, its eval-mode log-probabilities on one fixed batch, and fairseq's incremental greedy and
beam decoding of that batch's sentences. Imports only fairseq and torch: the plugins are whichever are imported
first (the recording runs with an old commit's ``fairseq_plugins`` first on the path)."""
import torch
from fairseq import checkpoint_utils
from fairseq.sequence_generator import SequenceGenerator

# One fixed batch of the old_checkpoints dictionary (4..15: w0..w11; 1: pad, 2: eos), left-padded as fairseq
# batches sources, and its teacher-forced decoder input (eos first, right-padded).
SRC = torch.tensor([[4, 5, 6, 7, 8, 9, 10, 2], [1, 1, 11, 12, 13, 5, 6, 2]])
PREV = torch.tensor([[2, 10, 9, 8, 7, 6, 5, 4], [2, 6, 5, 13, 12, 11, 1, 1]])
BEAMS = (1, 3)  # greedy and a small beam
MAX_LEN_B = 12  # hypotheses of up to 12 tokens (a 3-update model rarely stops by itself)


def load(path, data):
    """(model in eval mode, task): as fairseq-generate loads a checkpoint (its stored arch and arguments)."""
    (model,), _, task = checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides={"data": str(data)})
    model.eval()
    return model, task


@torch.no_grad()
def outputs(model, task):
    """{"eval": (2, 8, V) log-probabilities, "beam<N>": per sentence, the best hypothesis' tokens and its
    positional scores}."""
    got = {"eval": model.get_normalized_probs(model(SRC, SRC.ne(1).sum(1), PREV), log_probs=True)}
    sample = {"net_input": {"src_tokens": SRC, "src_lengths": SRC.ne(1).sum(1)}}
    for beam in BEAMS:
        generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_a=0,
                                      max_len_b=MAX_LEN_B)
        hypos = generator.generate([model], sample)
        got[f"beam{beam}"] = [(h[0]["tokens"], h[0]["positional_scores"]) for h in hypos]
    return got
