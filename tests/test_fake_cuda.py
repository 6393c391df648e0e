"""Every arch with CUDA device semantics on a CPU build (tests/helpers/fake_cuda: fake tensors on cuda:0, a do-nothing
CUDA device guard compiled on first use, torch.cuda stubbed): two training updates (forward, loss, backward,
Adam step) and incremental decoding with a beam reorder; FLOATER also with its solve captured as CUDA graphs.

Asserted: every step runs; no operator mixes cuda and cpu tensors; the host syncs outside captures are the
known ones below; inside a capture nothing syncs, copies to or from the host, or makes a cpu tensor. Values
are fake: nothing here checks a number. Skipped where no C++ compiler exists or the guard does not build."""
import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import fake_cuda
from fairseq_plugins.schemes import SCHEMES

CHILD = fake_cuda.HERE / "check_models.py"
ARCHS = tuple(s.arch("tiny") for s in SCHEMES.values() if s.arch_prefix)  # every scheme with architectures
SCENARIOS = [f"{arch}/{step}" for arch in ARCHS for step in ("train", "decode")]
SCENARIOS.append("floater_transformer_tiny/train_cuda_graph")
TRAIN_GROUPS = 2

# Host syncs outside captures that are known, by "path (function)": each makes the host wait for the device.
KNOWN_SYNCS = {
    "fairseq_plugins/modules/floater/flows.py (solve_checked)":
        "bool() of the solution's finiteness check, once per solver call (one per training forward)",
    "fairseq_plugins/modules/floater/scheme.py (check_decoding_step)":
        "bool() of the decoder features' finiteness check, once per incremental decoding step",
    "fairseq/models/transformer/transformer_encoder.py (forward_scriptable)":
        "fairseq's `if has_pads:` (encoder_padding_mask.any()), twice per encoder forward",
    "fairseq/models/transformer/transformer_decoder.py (extract_features_scriptable)":
        "fairseq's `prev_output_tokens.eq(padding_idx).any()`, once per decoder forward and decoding step",
    "fairseq_plugins/modules/floater/cuda_graph.py (__init__)":
        "torch.cuda.graph synchronises before each capture (forward and backward), once per captured bucket",
}


class Results:
    """Each group of scenarios run in a child process of its own on first use (the guard library must load before
    torch is imported): training (the heavier: forward, backward, Adam) in TRAIN_GROUPS groups, FLOATER's training
    (with and without CUDA graphs) and decoding with the controls, so that no single test pays for every scenario
    (the fast tier's clock counts a fixture in the test that first asks for it)."""

    def __init__(self, library, folder):
        self.library, self.folder, self.groups = library, folder, {}

    @staticmethod
    def group(scenario):
        if scenario.endswith("/decode") or scenario == "controls":
            return "decode"
        if scenario.startswith("floater"):
            return "train_floater"  # FLOATER's two: as heavy as several schemes' training
        # the other schemes' training in TRAIN_GROUPS children: all of it in one grew past the fast tier's
        # 30 CPU seconds as schemes were added
        return f"train_{ARCHS.index(scenario.partition('/')[0]) % TRAIN_GROUPS}"

    def __getitem__(self, scenario):
        group = self.group(scenario)
        if group not in self.groups:
            names = [s for s in [*SCENARIOS, "controls"] if self.group(s) == group]
            out = self.folder / f"{group}.json"
            proc = subprocess.run([sys.executable, "-m", "helpers.fake_cuda.check_models", str(self.library),
                                   str(out), *names], cwd=CHILD.parents[2], capture_output=True, text=True,
                                  timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
            if proc.returncode != 0 or not out.exists():
                pytest.fail(f"{CHILD.name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            self.groups[group] = json.loads(out.read_text())
            assert sorted(self.groups[group]) == sorted(names)  # every scenario asked for ran
        return self.groups[group][scenario]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    if torch.version.cuda or torch.version.hip:  # its own CUDA hooks: the fake device's registration collides
        pytest.skip(f"the fake CUDA device needs a CPU-only torch build; this one is {torch.__version__}")
    try:
        library = fake_cuda.build()
    except fake_cuda.BuildError as err:
        pytest.skip(f"fake CUDA guard library not built: {err}")
    return Results(library, tmp_path_factory.mktemp("fake_cuda"))


def site(finding):
    """'path (function)' of a finding's place, without the line number."""
    path, _, rest = finding["where"].partition(":")
    return f"{path} {rest.partition(' ')[2]}"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_runs_on_cuda_without_device_mismatch_or_unknown_sync(results, scenario):
    result = results[scenario]
    assert result["ok"], result["error"]
    findings = result["findings"]
    assert [f for f in findings if f["kind"] == "device mismatch"] == []
    assert [f for f in findings if f["in_capture"]] == []
    assert [f for f in findings if f["kind"] == "host sync" and site(f) not in KNOWN_SYNCS] == []
    assert result["guard_syncs"] == 0  # nothing waited on a stream, event or device through the guard


def test_floater_solve_is_captured_and_replayed(results):
    """FLOATER's training solve on cuda: one forward and one backward graph, captured on the first update and
    replayed on every update (three), with nothing in the captures that a replay would not repeat."""
    result = results["floater_transformer_tiny/train_cuda_graph"]
    assert result["ok"], result["error"]
    assert (result["captures"], result["replays"]) == (2, 6)
    assert [f for f in result["findings"] if f["in_capture"]] == []
    # and the step-by-step solve (the same model without graphs) captures nothing
    assert results["floater_transformer_tiny/train"]["captures"] == 0


def test_checks_catch_what_they_look_for(results):
    """The controls in check_models.py: each commented line there must give its finding, at that line."""
    result = results["controls"]
    assert result["ok"], result["error"]
    lines = CHILD.read_text().splitlines()
    expected = {
        ("device mismatch", False): "# device mismatch",
        ("host sync", False): "# host sync: a value read",
        ("cpu tensor in capture", True): "# cpu tensor in capture",
        ("host sync", True): "# host sync in capture",
    }
    found = {(f["kind"], f["in_capture"], f["where"]) for f in result["findings"]}
    for (kind, in_capture), comment in expected.items():
        line = next(i for i, text in enumerate(lines, 1) if comment in text)
        assert (kind, in_capture, f"tests/helpers/fake_cuda/check_models.py:{line} (controls)") in found, (kind, found)
    copy = next(i for i, text in enumerate(lines, 1) if "# host sync: a copy" in text)
    assert any(f["op"] == "_to_copy" and f["where"].endswith(f":{copy} (controls)") for f in result["findings"])
