"""scripts/gpu/gpu_check.sh, the one command for a machine with a GPU, checked on CPU as far as it goes: its dry run
(CUDA graphs through the CPU emulation, the smallest sizes) writes every section of the report, and the graph
path's gradients there are the loop's; each section runs in its own process under its cap, so a section that
raises or hangs is reported with its reason while the others' rows stay in the report (and the run fails);
without a GPU and without --dry-run it refuses in one line."""
import json
import os
import re
import subprocess
import time

import pytest
import torch

from conftest import REPO, env
from fairseq_plugins.schemes import MODELS as SCHEME_MODELS
from helpers.gpu_check_run import gpu_check, no_machine_paths
from helpers.small_task import small_data
from tooling.bench import length_mix
from tooling.gpu.verdicts import verdicts
from tooling.gpu.users_path import train_stats
from tooling.gpu.wmt14_stand_in import write_stand_in

TITLES = ["## Machine", "## FLOATER's CUDA-graph solve against the loop",
          "## Every arch × precision on the toy task",
          "## Benchmark: the users' regime; FLOATER with and without CUDA graphs"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_data(tmp_path_factory)


def test_dry_run_of_the_first_call_writes_its_sections(data, tmp_path):
    """The default call is the correctness sections machine, floater_graph, precision (the speed section is a second call, below: the
    sections did not fit one command of the third H100 run); each writes its rows, and the report names the second
    call."""
    out = tmp_path / "out"
    proc = gpu_check("--dry-run", "--out-dir", str(out), "--data", str(data / "bin"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (out / "gpu_check.md").read_text()
    report = json.loads((out / "gpu_check.json").read_text())
    assert md.startswith("# GPU check — DRY RUN on CPU")
    positions = [md.index(title) for title in TITLES[:3]]  # in priority order
    assert positions == sorted(positions) and TITLES[3] not in md and "## e." not in md
    assert "a second call: `scripts/gpu/gpu_check.sh --sections bench --out-dir DIR`" in md
    sections = report["sections"]
    assert list(sections) == ["machine", "floater_graph", "precision"]
    assert all(s["status"] == "completed" and s["seconds"] <= s["cap_s"] for s in sections.values()), sections

    def rows(section, kind):
        return [r for r in sections[section]["rows"] if r["kind"] == kind]

    assert rows("machine", "machine")[0]["note"].startswith("DRY RUN on CPU")
    assert rows("floater_graph", "solve") and all(r["values"] < 1e-6 and r["gradients"] < 1e-6
                                                  for r in rows("floater_graph", "solve"))
    trainer = rows("floater_graph", "trainer")
    assert trainer and all(r["gradient_error"] < 1e-6 and r["updates"] >= 1 and r["captured_buckets"] > 0
                           for r in trainer), trainer
    # both orders of lengths: graph and loop agree at every length; longest-first keeps every bucket's graphs, a
    # longer bucket drops the shorter ones' (their buffers are too small)
    steps = rows("floater_graph", "order_step")
    assert [(r["order"], r["length"]) for r in steps] == [("longest-first", 24), ("longest-first", 16),
                                                          ("shortest-first", 16), ("shortest-first", 24)]
    assert all(r["gradient_error"] < 1e-6 and r["loss_error"] < 1e-6 for r in steps), steps
    memory = {r["order"]: r for r in rows("floater_graph", "order_memory")}
    assert memory["longest-first"]["captured_buckets"] == 2 and memory["shortest-first"]["captured_buckets"] == 1
    assert all(0 < r["graph_memory_mib"] <= r["bound_mib"] for r in memory.values()), memory
    precision = rows("precision", "precision")
    assert [(r["arch"], r["mode"]) for r in precision] == [("rope_transformer_tiny", "fp32"),
                                                            ("rope_transformer_tiny", "bf16")]
    assert all(r["ok"] and r["sentences"] > 0 and r["train_loss"] is not None for r in precision), precision
    assert all("hypotheses" not in r for r in sections["precision"]["rows"])  # compared, not kept
    no_machine_paths(out, tmp_path)
    assert "## Verdict" in md and report["verdicts"] and all(v["passed"] for v in report["verdicts"])


def test_a_failing_section_leaves_the_others_and_fails_the_run(data, tmp_path):
    """A section that raises is one report row with the exception's last line; the sections before and after it
    (here the speed section bench, the second call's) are in the report with their rows, and the exit status is 1."""
    out = tmp_path / "out"
    proc = gpu_check("--dry-run", "--out-dir", str(out), "--data", str(data / "bin"),
                     "--sections", "machine,floater_graph,bench",
                     extra_env={"GPU_CHECK_FAIL_SECTION": "floater_graph"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    md = (out / "gpu_check.md").read_text()
    report = json.loads((out / "gpu_check.json").read_text())
    sections = report["sections"]
    assert [(n, s["status"]) for n, s in sections.items()] == [
        ("machine", "completed"), ("floater_graph", "failed"), ("bench", "completed")]
    ratios = {r["model"]: r for r in sections["bench"]["rows"] if r["kind"] == "ratio"}
    assert set(ratios) == {"transformer", "floater", "floater_graph"}
    assert ratios["floater_graph"]["graph_buckets"] > 0 and ratios["floater"]["graph_buckets"] is None
    assert (out / "gpu_check_bench.md").exists()
    regime = {(r["update_freq"], r["precision"], r["model"]): r for r in sections["bench"]["rows"]
              if r["kind"] == "regime"}
    assert set(regime) == {(1, p, m) for p in ("bf16", "amp") for m in ("transformer", "floater")} | {
        (4, "bf16", m) for m in ("transformer", "floater", "floater_shared")}
    assert all(r["tokens_per_s"] > 0 and r["train_ratio"] > 0 and r["gflop_per_update"] > 0 for r in regime.values())
    assert "| floater | tiny | amp | 512 | 1 |" in md and "| floater_shared | tiny | bf16 | 512 | 4 |" in md
    assert (out / "gpu_check_regime.md").exists() and (out / "gpu_check_regime_uf4.md").exists()
    assert "Profiles: one more update of each model (tiny bf16 512)" in (out / "gpu_check_regime.md").read_text()
    no_machine_paths(out, tmp_path)
    reason = "RuntimeError: failure injected into section floater_graph (GPU_CHECK_FAIL_SECTION)"
    assert sections["floater_graph"]["reason"] == reason
    assert "**Failed** after" in md and reason in md
    assert "python 3." in md and "| floater_graph | 32 |" in md  # the other sections' rows
    assert TITLES[2] not in md  # not asked for
    # the command as asked (a rerun of some sections says so), without the machine's paths
    assert "Command: `scripts/gpu/gpu_check.sh --dry-run --sections machine,floater_graph,bench`" in md
    failed = [v["check"] for v in report["verdicts"] if not v["passed"]]
    assert failed == [f"FLOATER's CUDA-graph solve against the loop: {reason}"]
    assert proc.stderr.strip().splitlines()[-1].startswith("FAILED: FLOATER's CUDA-graph solve")


def test_a_section_past_its_cap_is_killed_and_reported(tmp_path):
    """A hung section is killed at its cap with everything it started, and the report says so; the report is
    written before the first section and again the moment each section ends, so it is there while the next runs."""
    out = tmp_path / "out"
    proc = subprocess.Popen(["bash", "scripts/gpu/gpu_check.sh", "--dry-run", "--out-dir", str(out), "--sections",
                             "machine,bench", "--cap", "bench=4"], cwd=REPO,
                            env={**env(), "OMP_NUM_THREADS": "1", "GPU_CHECK_HANG_SECTION": "bench"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = set()
    md_path = out / "gpu_check.md"
    while proc.poll() is None:
        md = md_path.read_text() if md_path.exists() else ""
        if md.count("Not run yet.") == 2:
            seen.add("header")
        if "Completed in" in md and "python 3." in md and TITLES[3] + "\n\nNot run yet." in md:
            seen.add("machine, while bench runs")
        time.sleep(0.05)
    stdout, stderr = proc.communicate()
    assert seen == {"header", "machine, while bench runs"}, stderr[-3000:]
    assert proc.returncode == 1, stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    bench = report["sections"]["bench"]
    assert bench["status"] == "timed out" and bench["reason"] == "timed out after 4 s" and bench["cap_s"] == 4
    assert 4 <= bench["seconds"] < 30
    md = md_path.read_text()
    assert "**Timed out after 4 s** (its cap)" in md and "python 3." in md
    assert [v["check"] for v in report["verdicts"] if not v["passed"]] == [
        "Benchmark: the users' regime; FLOATER with and without CUDA graphs: timed out after 4 s"]
    pids = [int(p) for p in re.search(r"hanging: pids (\d+) (\d+)", stderr).groups()]
    time.sleep(0.5)
    for pid in pids:  # the section's process and its child: killed, not left behind
        assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2], pid


def test_bad_flags_are_one_line(tmp_path):
    for argv, message in [(["--cap", "precision=soon"], "--cap precision=soon: expected a positive number of seconds"),
                          (["--cap", "decode=10"], "--cap decode=10: expected NAME=SECONDS with NAME one of machine, "
                                                   "floater_graph, precision, bench, invariance, users_path"),
                          (["--sections", "machine,gpu"], "--sections machine,gpu: expected some of "
                                                          "machine,floater_graph,precision,bench,invariance,"
                                                          "users_path, or all"),
                          (["--models", "rope,fourier"], "--models rope,fourier: unknown model 'fourier' (expected "
                                                         f"some of {' '.join(SCHEME_MODELS)})")]:
        proc = gpu_check("--dry-run", "--out-dir", str(tmp_path / "out"), *argv, timeout=120)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [f"scripts/gpu/gpu_check.sh: {message}"], \
            proc.stderr
        assert not (tmp_path / "out").exists()


def test_a_check_out_of_bounds_fails_the_run():
    """The verdict table and the exit status: a graph gradient off by 1% in float32, a graph path that never
    captured, graph memory over its bound, a loss far from fp32's, or a section that did not complete, fails;
    the same report within bounds passes."""
    def section(*rows, status="completed", reason=None):
        return {"title": "t", "cap_s": 10, "seconds": 1.0, "status": status, "reason": reason, "rows": list(rows)}

    trainer = {"kind": "trainer", "mode": "fp32", "update_freq": 3, "gradient_error": 1e-8, "captured_buckets": 2}
    orders = [row for order in ("longest-first", "shortest-first") for row in (
        {"kind": "order_step", "order": order, "length": 32, "gradient_error": 1e-7, "loss_error": 0.0},
        {"kind": "order_memory", "order": order, "graph_memory_mib": 90.0, "bound_mib": 100.0,
         "captured_buckets": 1})]
    report = {"sections": {
        "machine": section({"kind": "machine", "device": "cuda"}),
        "floater_graph": section({"kind": "solve", "positions": 21, "values": 0.0, "gradients": 1e-7}, trainer,
                                 *orders),
        "precision": section({"kind": "precision", "ok": True, "train_loss": 5.0, "fp32_loss": 5.1}),
        "bench": section({"kind": "bench"}, {"kind": "ratio", "model": "floater_graph", "graph_buckets": 1})}}
    assert all(v["passed"] for v in verdicts(report))

    def failed(section_name, *rows, **status):
        bad = {**report, "sections": {**report["sections"], section_name: section(*rows, **status)}}
        return [v["check"] for v in verdicts(bad) if not v["passed"]]

    graph_rows = report["sections"]["floater_graph"]["rows"]
    for broken in ({"gradient_error": 1e-2}, {"captured_buckets": 0}):
        rows = [{**r, **broken} if r["kind"] == "trainer" else r for r in graph_rows]
        assert failed("floater_graph", *rows) == ["Trainer fp32, --update-freq 3: gradient, graph vs loop"]
    rows = [{**r, "graph_memory_mib": 120.0} if r["kind"] == "order_memory" and r["order"] == "shortest-first"
            else r for r in graph_rows]
    assert failed("floater_graph", *rows) == ["graph memory shortest-first / its bound (buckets captured > 0)"]
    # a completed section without one order's rows fails that order's checks; one that timed out is judged on
    # the rows it wrote (and fails as a section)
    rows = [r for r in graph_rows if r.get("order") != "longest-first"]
    assert failed("floater_graph", *rows) == ["training steps longest-first: gradient and loss, graph vs loop",
                                              "graph memory longest-first / its bound (buckets captured > 0)"]
    assert failed("floater_graph", *rows, status="timed out", reason="timed out after 80 s") == [
        "t: timed out after 80 s"]
    assert failed("precision", {"kind": "precision", "ok": True, "train_loss": 8.0, "fp32_loss": 5.0}) == [
        "every arch × precision trains and decodes; loss vs fp32 (relative)"]
    assert failed("bench", {"kind": "bench"}, {"kind": "ratio", "model": "floater_graph", "graph_buckets": 0}) == [
        "benchmark ran; floater_graph captured at every length"]
    assert failed("machine", status="timed out", reason="timed out after 20 s") == [
        "t: timed out after 20 s"]
    # f.: each scheme within the CPU's bound or twice fairseq's Transformer's on the same GPU; one seed twice alike
    def invariance(scheme, dtype, error):
        return {"kind": "invariance", "scheme": scheme, "dtype": dtype, "steps": 301, "teacher_forced": error,
                "incremental": error / 2, "beam_differ": 0}

    replay = {"kind": "replay", "arch": "transformer_tiny", "deterministic": False, "identical": True,
              "ms_per_update": 9.0}
    fine = [invariance("sinusoidal", "fp32", 2e-6), invariance("fire", "fp32", 2e-6),
            invariance("sinusoidal", "bf16", 0.05), invariance("fire", "bf16", 0.09), replay]
    assert failed("invariance", *fine) == []  # bf16: within twice the Transformer's 0.05
    assert failed("invariance", *fine[:1], invariance("fire", "fp32", 3e-4), *fine[2:]) == [
        "batch invariance fp32: every scheme alone vs batched"]
    assert failed("invariance", *fine[:3], invariance("fire", "bf16", 0.11), replay) == [
        "batch invariance bf16: every scheme alone vs batched"]
    assert failed("invariance", *fine[:4], {**replay, "identical": False}) == [
        "one seed twice, the same parameters (default algorithms)"]
    # g.: every step of the users' path exits 0, each training with updates and a tokens/s, make_tables a table
    def users_step(scheme, step, **fields):
        return {"kind": "step", "scheme": scheme, "step": step, "rc": 0, "seconds": 9.0, **fields}

    trained = {"updates": 10, "tokens_per_s": 2e5}
    tables = {"kind": "tables", "rc": 0, "tables": [{"title": "t", "header": "| a |", "rows": ["| 0.01 (27.9, x) |"]}]}
    users = [users_step("transformer", "train.sh", **trained), users_step("relative", "train.sh", **trained),
             users_step("transformer", "evaluate.sh"), users_step("relative", "evaluate.sh"), tables]
    check = "the users' path: train.sh (updates, tokens/s), evaluate.sh, make_tables.py exit 0 for every scheme"
    assert failed("users_path", *users) == []
    for broken in ({**users[1], "updates": None}, {**users[1], "tokens_per_s": None}, {**users[3], "rc": 1}):
        assert failed("users_path", *[broken if r["kind"] == "step" and r["scheme"] == broken["scheme"]
                                      and r["step"] == broken["step"] else r for r in users]) == [check]
    assert failed("users_path", *users[:3], tables) == [check]  # relative trained but never evaluated
    assert failed("users_path", *users[:4], {**tables, "tables": []}) == [check]


def test_section_b_accounts_what_each_memory_pool_holds():
    """Section floater_graph's per-pool accounting (CUDA only, so checked on a made-up torch.cuda.memory_snapshot()): per pool,
    its segments' bytes and their allocated blocks', and the segment with the most free bytes, which shows a
    segment that one live tensor keeps reserved (a replaced tape's, split for the next output gradient); the
    report lists each pool of both runs."""
    from tooling.gpu.graph import pool_accounting
    from tooling.gpu.verdicts import floater_graph_lines

    mib = 2**20

    def segment(pool, *blocks):
        return {"segment_pool_id": pool, "total_size": sum(size for size, _ in blocks) * mib,
                "blocks": [{"size": size * mib, "state": state} for size, state in blocks]}

    segments = [segment((0, 0), (36, "active_allocated"), (322, "inactive")),
                segment((0, 0), (3, "active_allocated"), (1, "active_awaiting_free"), (16, "inactive")),
                segment((0, 0), (718, "active_allocated")),
                segment((0, 7), (36, "active_allocated"), (164, "inactive"))]
    pools = pool_accounting(segments)
    assert pools == [
        {"pool": "default", "pool_id": [0, 0], "segments": 3, "reserved_mib": 1096.0, "allocated_mib": 757.0,
         "most_free_segment_mib": [358.0, 36.0]},
        {"pool": "graph", "pool_id": [0, 7], "segments": 1, "reserved_mib": 200.0, "allocated_mib": 36.0,
         "most_free_segment_mib": [200.0, 36.0]}]
    row = {"kind": "order_memory", "order": "shortest-first", "dims": "base", "tokens": 4096, "captured_buckets": 1,
           "graph_memory_measure": "m", "reserved_loop_mib": 1012.0, "reserved_graph_mib": 2458.0,
           "peak_loop_mib": 3015.8, "peak_graph_mib": 3194.7, "held_by_graphs_mib": 795.5,
           "graph_memory_mib": 1446.0, "tape_mib": 717.2, "bucket_buffers_mib": 80.2, "bound_mib": 1155.9,
           "pools_loop": pools[:1],
           "pools_graph": pools}
    lines = floater_graph_lines({"sections": {"floater_graph": {"rows": [row]}}})
    assert "| shortest-first | loop | default | 3 | 1096.0 | 757.0 | 358.0 / 36.0 |" in lines
    assert "| shortest-first | graphs | graph | 1 | 200.0 | 36.0 | 200.0 / 36.0 |" in lines
    dry = {**row, "pools_loop": None, "pools_graph": None}  # the dry run has no CUDA allocator
    assert not any("memory pool" in line for line in floater_graph_lines({"sections": {"floater_graph": {
        "rows": [dry]}}}))


@pytest.mark.slow
def test_dry_run_of_the_invariance_section(data, tmp_path):
    """f.: every row of the scheme table in fp32 and bf16 (small lengths, 4 steps on CPU), and one seed twice with
    and without deterministic algorithms, each identical."""
    out = tmp_path / "out"
    proc = gpu_check("--dry-run", "--sections", "invariance", "--out-dir", str(out), "--data", str(data / "bin"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((out / "gpu_check.json").read_text())["sections"]["invariance"]["rows"]
    schemes = [s.name for s in SCHEME_MODELS.values() if s.arch_prefix or s.flags]
    assert [(r["scheme"], r["dtype"]) for r in rows if r["kind"] == "invariance"] == [
        (s, d) for s in schemes for d in ("fp32", "bf16")]
    assert all(r["teacher_forced"] < 1e-5 for r in rows if r.get("dtype") == "fp32")
    replay = [r for r in rows if r["kind"] == "replay"]
    assert [r["deterministic"] for r in replay] == [False, True] and all(r["identical"] for r in replay), replay
    assert "## Batch invariance" in (out / "gpu_check.md").read_text()


def test_dry_run_of_the_users_path(tmp_path):
    """g.: train.sh for the Transformer's WMT14 cell on the stand-in corpus with CPU=1, then evaluate.sh (its two
    epoch checkpoints averaged) and make_tables.py, all in the section's work folder: the report has every step's
    exit status, updates and tokens/s, and the table row it filled."""
    repo_files = [REPO / "results" / "wmt14_en_de_base_transformer.json", REPO / "results" / "tables.md",
                  REPO / "checkpoints" / "wmt14_en_de_base_transformer"]
    before = [p.exists() and p.stat().st_mtime for p in repo_files]
    out = tmp_path / "out"
    proc = gpu_check("--dry-run", "--sections", "users_path", "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    section = json.loads((out / "gpu_check.json").read_text())["sections"]["users_path"]
    assert section["status"] == "completed", section

    def rows(kind):
        return [r for r in section["rows"] if r["kind"] == kind]

    assert rows("corpus") == [{"kind": "corpus", "train": 120, "valid": 16, "test": 16, "dictionary": 304,
                               "seconds": rows("corpus")[0]["seconds"]}]
    steps = rows("step")
    assert [(r["scheme"], r["step"], r["rc"]) for r in steps] == [("transformer", "train.sh", 0),
                                                                   ("transformer", "evaluate.sh", 0)]
    train, evaluate = steps
    # the cell's batch (8 GPUs' worth on one process: update_freq 8), 2 epochs of 1 update; CPU=1 turns fp16 off
    assert (train["precision"], train["max_tokens"], train["update_freq"], train["epochs"], train["updates"]) == (
        "fp32", 4096, 8, 2, 2), train
    assert train["tokens_per_s"] > 0 and train["tokens_per_update"] > 0
    assert evaluate["checkpoints"] == "checkpoint1.pt,checkpoint2.pt"  # the cell averages epochs: both there
    assert evaluate["sentences"] == 16 and 0 <= evaluate["bleu"] <= 100
    (tables,) = rows("tables")
    assert tables["rc"] == 0 and [t["title"] for t in tables["tables"]] == [
        "FLOATER (Liu et al. 2020), Table 2: BLEU on newstest2014"]
    assert [row.split(" (27.9, ")[0] for row in tables["tables"][0]["rows"]] == [
        f"| input block only | sinusoidal | {evaluate['bleu']:.2f}"]
    md = (out / "gpu_check.md").read_text()
    assert "## The users' path" in md and "Its BLEU means nothing" in md
    assert "| transformer | `train.sh` | 0 |" in md and "| fp32 | 4096 × 8 | 2 |" in md
    assert "FLOATER (Liu et al. 2020), Table 2" in (out / "gpu_check_users_tables.md").read_text()
    assert all(v["passed"] for v in json.loads((out / "gpu_check.json").read_text())["verdicts"])
    no_machine_paths(out, tmp_path)
    assert [p.exists() and p.stat().st_mtime for p in repo_files] == before  # nothing into results/, checkpoints/


def test_the_stand_in_corpus_has_the_recipes_layout_and_newstests_lengths(tmp_path):
    """prepare_wmt14.sh's layout (what train.sh and evaluate.sh read), a piece per word, every word of the
    vocabulary in the dictionary, and each sentence as long as the length drawn from newstest2014's."""
    entries = write_stand_in(tmp_path, {"train": 60, "valid": 5, "test": 7}, vocab=250, seed=3)
    assert entries == 256  # 250 words + fairseq's 4 specials, padded to a multiple of 8 as fairseq-preprocess does
    words = [line.split()[0] for line in (tmp_path / "bin" / "dict.en.txt").read_text().splitlines()]
    assert len([w for w in words if not w.startswith("madeupword")]) == 250
    for f in ("spm.model", "raw/test.de", "raw/valid.en", "bin/dict.en.txt", "bin/dict.de.txt",
              "bin/train.en-de.en.bin", "bin/test.en-de.de.idx"):
        assert (tmp_path / f).is_file(), f
    pairs = length_mix.load_pairs()
    for k, (split, n) in enumerate((("train", 60), ("valid", 5), ("test", 7))):
        drawn = length_mix.draw(pairs, n, 3 + k)
        for side, lang in enumerate(("en", "de")):
            raw = (tmp_path / "raw" / f"{split}.{lang}").read_text().splitlines()
            pieces = (tmp_path / "spm" / f"{split}.{lang}").read_text().splitlines()
            assert [len(line.split()) for line in raw] == [len(line.split()) for line in pieces] == [
                p[side] for p in drawn]


def test_train_stats_read_the_last_epochs_summary():
    log = """{'common': {'fp16': True}, 'dataset': {'max_tokens': 4096}, 'optimization': {'update_freq': [8]}}
[train_inner][INFO] - epoch 001:      5 / 5 loss=9.1, wps=1000, ups=1, wpb=30000, num_updates=5
[valid][INFO] - epoch 001 | valid on 'valid' subset | loss 9.039 | wps 0 | wpb 486 | bsz 16 | num_updates 5
[train][INFO] - epoch 001 | loss 9.105 | ppl 555.33 | wps 150000 | ups 5 | wpb 30100 | bsz 800 | num_updates 5
[valid][INFO] - epoch 002 | valid on 'valid' subset | loss 9.0 | wps 0 | wpb 486 | bsz 16 | num_updates 10
[train][INFO] - epoch 002 | loss 9.089 | ppl 548.7 | wps 210000.5 | ups 7 | wpb 29900 | bsz 790 | num_updates 10
"""
    assert train_stats(log) == {"precision": "fp16", "max_tokens": 4096, "update_freq": 8, "epochs": 2,
                                "updates": 10, "tokens_per_s": 210000.5, "tokens_per_update": 29900.0}
    assert train_stats("Traceback ...")["updates"] is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_a_gpu_it_refuses_in_one_line(tmp_path):
    proc = gpu_check("--out-dir", str(tmp_path / "out"), timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "scripts/gpu/gpu_check.sh: no CUDA device; use --dry-run to check the script on CPU"]
    assert not (tmp_path / "out").exists()
