"""The same command on the same machine replays: fairseq-train run twice with one command (the Transformer,
dropout on, one thread, as the study trains) gives bit-identical parameters, and fairseq-generate on each gives
the same hypotheses with the same scores, token by token (its H- and P- lines). What does not replay across
machines, and why: docs/reproducibility.md."""
import pytest

from conftest import run
from helpers.small_task import ONE_THREAD, assert_same_model, run1, small_data, train_cmd

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_data(tmp_path_factory)


@pytest.mark.parametrize("arch", ["transformer_tiny"])
def test_the_same_command_twice_gives_the_same_model_and_hypotheses(data, tmp_path, arch):
    hypotheses = []
    for name in ("first", "second"):
        save = tmp_path / name
        run1(train_cmd(data, save, arch, "--dropout", "0.1", max_update=20))
        run(["bash", "scripts/generate.sh", str(data), str(save / "checkpoint_last.pt"), "test",
             str(tmp_path / f"{name}.json"), "--max-len-a", "0", "--max-len-b", "12"], env_extra=ONE_THREAD)
        log = (tmp_path / f"{name}.gen").read_text(encoding="utf-8").splitlines()
        hypotheses.append([line for line in log if line.startswith(("H-", "P-"))])  # scores to 4 decimals
    assert_same_model(tmp_path / "first" / "checkpoint_last.pt", tmp_path / "second" / "checkpoint_last.pt")
    scored = [line for line in hypotheses[0] if line.startswith("H-")]
    assert len(scored) == 40 and len({line.split("\t")[1] for line in scored}) > 10  # 40 sentences, many scores
    assert hypotheses[0] == hypotheses[1]
