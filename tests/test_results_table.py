"""The study in one table and one figure (scripts/tooling/study/results_table.py): the READMEs' copies of the table are
what the committed runs give, its readings are short, a converged campaign's summary fills its column, the probe's
figure is drawn from the committed probe files; the study's documents stay short enough to read."""
import json
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO
from test_readme import LINK, anchors
from tooling.study import results_table as rt

STUDY_README = REPO / "results" / "multi30k_study" / "README.md"
HISTORY = REPO / "results" / "multi30k_study" / "history.md"
EVIDENCE = REPO / "docs" / "real_text_evidence.md"


def test_readmes_carry_the_table_the_committed_runs_give():
    assert rt.check() == [], "run scripts/study/study.py results-table"
    assert (REPO / rt.TABLE_FILE).read_text(encoding="utf-8") == rt.build()


def source_tree(tmp_path):
    """A root holding the table's committed sources and a README with the markers."""
    for path in [*rt.SOURCES.values(), rt.PROBE / "probe_table.md"]:
        if (REPO / path).is_file():
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / path, tmp_path / path)
    for path in rt.COPIES:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(f"# x\n\n{rt.BEGIN}\nold\n{rt.END}\n\nafter\n", encoding="utf-8")
    return tmp_path


def test_check_names_a_stale_or_missing_copy_and_write_mends_it(tmp_path):
    root = source_tree(tmp_path)
    (root / "README.md").write_text("# x\n\nno table\n", encoding="utf-8")
    wrong = dict(rt.check(root))
    assert set(wrong) == {"README.md", str(rt.STUDY / "README.md")}
    assert "no <!--" in wrong["README.md"] and "differs" in wrong[str(rt.STUDY / "README.md")]
    rt.write(root)
    assert rt.check(root) == [("README.md", f"no {rt.BEGIN} … {rt.END} block")]  # no markers: left alone
    text = (root / rt.STUDY / "README.md").read_text(encoding="utf-8")
    assert text.startswith("# x\n\n") and text.endswith(f"{rt.END}\n\nafter\n") and "\nold\n" not in text


def test_the_converged_column_reads_a_gpu_summary_when_there_is_one(tmp_path):
    root = source_tree(tmp_path)
    gpu = root / rt.SOURCES["converged (GPU)"]
    assert not gpu.exists()
    rows = [line.split(" | ") for line in rt.build(root).splitlines() if line.startswith("| ") and "`" in line]
    assert rows and all(r[3] == "—" for r in rows)
    gpu.parent.mkdir(parents=True)
    shutil.copy(root / rt.SOURCES["20 epochs"], gpu)  # the same format
    rows = [line.split(" | ") for line in rt.build(root).splitlines() if line.startswith("| ") and "`" in line]
    assert all(r[3] == r[2] for r in rows)
    assert "at converged (GPU) (3 seeds)" in rt.build(root)
    # a campaign under way: models listed without runs yet (table.md's PARTIAL) leave their cells empty
    partial = json.loads(gpu.read_text(encoding="utf-8"))
    partial["models"] = {m: {"seeds": [], "bleu_tok_lc": [], "bleu": []} for m in ("transformer", "rope")}
    partial["claims"] = []
    gpu.write_text(json.dumps(partial), encoding="utf-8")
    rows = [line.split(" | ") for line in rt.build(root).splitlines() if line.startswith("| ") and "`" in line]
    assert all(r[3] == "—" for r in rows)


def test_every_cell_is_the_stored_result():
    table = rt.build()
    row = {line.split(" | ")[0].split("`")[1]: line.split(" | ") for line in table.splitlines() if "(`" in line}
    assert row["relative"][1:3] == ["**+4.08** [+2.98, +5.19]", "**+2.24** [+1.26, +3.20]"]  # table.md's rows
    assert row["alibi"][2] == "+0.36 [-0.43, +1.14]"  # within seed noise: not bold
    assert row["transformer"][1:3] == ["30.40 BLEU", "37.10 BLEU"]
    assert row["alibi_sync"][4:7] == ["**+6.31**", "**+14.75**", "**+18.96**"]  # probe_table.md's Δ
    assert row["randomized"][4] == "+4.24"  # [-0.01, +7.63]: within seed and probe noise
    assert row["floater_warm"][4:7] == ["—"] * 3  # a fine-tune has no train-short run
    assert "+0.16 [-0.26, +0.62] at 8 epochs (5 seeds)" in table


def test_readings_cover_every_scheme_in_a_dozen_words():
    models = json.loads((REPO / rt.SOURCES["8 epochs"]).read_text(encoding="utf-8"))["models"]
    assert set(models) <= set(rt.READINGS)
    for model, (label, reading) in rt.READINGS.items():
        assert reading and len(reading.split()) <= rt.MAX_READING_WORDS, model


def test_tabulate_remakes_the_table_only_for_its_sources(tmp_path):
    assert not rt.refresh(tmp_path)
    assert REPO / rt.PROBE in rt.sources() and REPO / "results" / "multi30k_gpu" in rt.sources()
    root = source_tree(tmp_path / "root")
    (root / rt.PROBE / "runs").mkdir()
    shutil.copy(REPO / rt.PROBE / "summary.json", root / rt.PROBE)
    for probe in (REPO / rt.PROBE / "runs").glob("*.probe.json"):
        shutil.copy(probe, root / rt.PROBE / "runs")
    assert not rt.refresh(root / rt.STUDY / "len14", root=root)  # not a source
    assert not (root / rt.TABLE_FILE).exists()
    assert rt.refresh(root / rt.STUDY / "epochs20", root=root)
    assert rt.check(root) == [] and (root / rt.FIGURE).read_bytes()[:4] == b"\x89PNG"


def test_probe_plot_draws_the_committed_probe_files(tmp_path):
    runs = rt.probe_runs(REPO / rt.PROBE)
    assert "transformer" in runs and "rope_ntk_x4" not in runs and all(len(s) == 3 for s in runs.values())
    out = tmp_path / "probe.png"
    proc = subprocess.run([sys.executable, "scripts/study/study.py", "probe-plot", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (REPO / rt.FIGURE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def cells(text):
    return [c.strip() for line in text.splitlines() if line.startswith("|") for c in line.strip("|").split("|")]


@pytest.mark.parametrize("doc, most", [(STUDY_README, 150), (EVIDENCE, 120), (HISTORY, None)],
                         ids=lambda x: x.name if hasattr(x, "name") else str(x))
def test_study_documents_are_read_in_minutes(doc, most):
    text = doc.read_text(encoding="utf-8")
    if most:
        assert len(text.splitlines()) <= most
    long = [c[:60] for c in cells(text) if len(c.split()) > 40]
    assert not long, long
    body = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    broken = []
    for target in LINK.findall(body):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(target)
    assert not broken
    bullets = re.findall(r"^- (.*(?:\n  .*)*)", text, flags=re.M)  # readings: at most two sentences each
    assert not [b[:60] for b in bullets if len(re.findall(r"\.\s+[A-Z]", b)) > 1]


def test_the_evidence_answers_the_papers_questions_and_points_to_the_table():
    text = EVIDENCE.read_text(encoding="utf-8")
    headings = re.findall(r"^## (.*)$", text, flags=re.M)
    for question in ("relative beat absolute", "FLOATER help", "extrapolate", "budget"):
        assert any(question in h for h in headings), question
    assert "results/multi30k_study/README.md" in text and "history.md" in text
    study = STUDY_README.read_text(encoding="utf-8")
    assert rt.copy_in(study) and "history.md" in study and "## The length probe" in study
