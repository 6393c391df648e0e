"""README.md and docs/: a page a newcomer reads in five minutes, links that resolve, and commands that do what it
says: the WMT14 loop trains exactly the papers' cells, fairseq's own commands run on the toy task, the Hydra toy
command resumes."""
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def fenced_blocks(text, lang):
    """The code of every ```lang block, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.M | re.S)


def block_with(text, lang, marker):
    (block,) = [b for b in fenced_blocks(text, lang) if marker in b]
    return block


def anchors(path):
    """GitHub's anchors for a markdown file's headings."""
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}


def test_readme_is_a_five_minute_page():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 260


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(doc):
    text = re.sub(r"^```.*?^```", "", doc.read_text(encoding="utf-8"), flags=re.M | re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(target)
    assert not broken, f"{doc.name}: {broken}"


def test_the_wmt14_loop_trains_and_evaluates_exactly_the_papers_cells(tmp_path):
    """The README's loop, run with the launchers replaced by stand-ins that record their calls: every experiment of
    the papers' tables (results/paper_numbers.json) trained once, each warm start converted from the Transformer of
    its pair and size after that one trained, each evaluated on its table's test set; none of the newer schemes'."""
    paper = json.loads((REPO / "results" / "paper_numbers.json").read_text(encoding="utf-8"))
    cells = {c["experiment"]: t["testset"] for t in paper["tables"] for r in t["rows"] for c in r["cells"]
             if t["testset"] == "newstest2013"}
    test_cells = {c["experiment"] for t in paper["tables"] if t["testset"] == "newstest2014"
                  for r in t["rows"] for c in r["cells"]}
    all_cells = set(cells) | test_cells
    log = tmp_path / "calls.log"
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (tmp_path / "configs").symlink_to(REPO / "configs")
    for name in ("train.sh", "evaluate.sh"):
        (scripts / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n')
        (scripts / name).chmod(0o755)
    (scripts / "transformer_to_floater.py").write_text(
        f"import sys\nopen({str(log)!r}, 'a').write('convert ' + ' '.join(sys.argv[1:]) + '\\n')\n")
    (scripts / "make_tables.py").write_text(textwrap.dedent(f"""\
        import os, sys
        if "--list" in sys.argv:  # the real selector
            os.execv(sys.executable, [sys.executable, {str(REPO / "scripts" / "make_tables.py")!r}, *sys.argv[1:]])
        open({str(log)!r}, "a").write("tables\\n")
        """))
    loop = block_with(README.read_text(encoding="utf-8"), "bash", "*_warm)")
    proc = subprocess.run(["bash", "-c", loop], cwd=tmp_path, text=True, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    calls = [line.split() for line in log.read_text().splitlines()]

    trained = [c[1] for c in calls if c[0] == "train.sh"]
    assert sorted(trained) == sorted(all_cells)  # each once, and nothing else
    for i, name in enumerate(trained):
        if name.endswith("_warm"):
            base = re.sub(r"_floater_(all|input)_warm$", "_transformer", name)
            layers = re.search(r"_floater_(all|input)_warm$", name).group(1)
            convert = ["convert", f"checkpoints/{base}/checkpoint_last.pt", f"checkpoints/{name}/warm_start.pt",
                       "--floater-layers", layers]
            assert convert in calls, name
            assert calls.index(convert) < calls.index(["train.sh", name])
            assert trained.index(base) < i, name
    assert len([c for c in calls if c[0] == "convert"]) == 8
    evaluated = [c[1:] for c in calls if c[0] == "evaluate.sh"]
    assert sorted(evaluated) == sorted([[c, "--subset", "valid"] for c in cells] + [[c] for c in test_cells])
    assert calls[-1] == ["tables"]


def test_the_newer_schemes_loop_runs_the_other_configs():
    """The newer schemes' loop takes the WMT14 configs that no paper table reports, and only those."""
    from fairseq_plugins.schemes import NEW_SCHEMES

    loop = block_with(README.read_text(encoding="utf-8"), "bash", "--list newer")
    assert "scripts/train.sh" in loop
    listed = subprocess.run([sys.executable, "scripts/make_tables.py", "--list", "newer"], cwd=REPO, text=True,
                            capture_output=True, check=True).stdout.split()
    assert sorted(listed) == sorted(f"wmt14_{pair}_{size}_{s}" for pair in ("en_de", "en_fr")
                                    for size in ("base", "big") for s in NEW_SCHEMES)
    # the count the README gives is the list's
    said = re.search(r"(\d+) more trainings, (\d+) of them big models", README.read_text(encoding="utf-8"))
    assert said and [int(n) for n in said.groups()] == [len(listed), sum("_big_" in c for c in listed)], said


def directly_run_scripts(text):
    """The scripts a code block of the docs runs by path (`scripts/x.py ...`, not `python scripts/x.py`): a command's
    first word, at a line's start or after ;, &&, ||, |, do, then or $(."""
    found = set()
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.M | re.S):
        found |= set(re.findall(r"(?:^|[;&|(]|\bdo|\bthen)\s*(scripts/[\w/.-]+)", block, flags=re.M))
    return found


def git_modes():
    """{path: mode} of git's index, or None outside a git checkout."""
    proc = subprocess.run(["git", "ls-files", "-s", "scripts"], cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    return {line.split("\t", 1)[1]: line.split()[0] for line in proc.stdout.splitlines()}


def test_every_script_the_docs_run_by_path_is_executable():
    """A script the docs run as `scripts/x ...` has a shebang and is executable in git (submit_paper.py was not:
    `Permission denied`), and so is every script with a shebang (a clone gets git's mode, not the author's)."""
    modes = git_modes()
    if modes is None:
        pytest.skip("not a git checkout: file modes come from git's index")
    direct = set()
    for doc in [README, *DOCS, *sorted((REPO / "configs").rglob("README.md"))]:
        direct |= directly_run_scripts(doc.read_text(encoding="utf-8"))
    assert "scripts/submit_paper.py" in direct and "scripts/train.sh" in direct, direct
    for path in sorted(direct):
        assert (REPO / path).read_text(encoding="utf-8").startswith("#!"), f"{path}: run by path, no shebang"
    shebang = {p for p in modes if (REPO / p).is_file() and (REPO / p).read_bytes().startswith(b"#!")}
    not_executable = sorted(p for p in shebang | direct if modes.get(p) != "100755")
    assert not not_executable, f"not executable in git: {not_executable}"


def toy_checkout(tmp_path):
    """A folder laid out as the repository root, for the README's commands (which write data/ and checkpoints/)."""
    for name in ("fairseq_plugins", "scripts", "configs"):
        (tmp_path / name).symlink_to(REPO / name)
    return {**{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}, "PWD": str(tmp_path),
            "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "2"}


@pytest.mark.slow
def test_readme_fairseq_commands_run_on_the_toy_task(tmp_path):
    """The README's fairseq-train / fairseq-generate / fairseq-interactive block and its hub snippet, as written
    (but 3 updates and hypotheses of at most 5 tokens, to keep it short), from an empty folder."""
    env = toy_checkout(tmp_path)
    text = README.read_text(encoding="utf-8")
    block = block_with(text, "bash", "fairseq-interactive")
    assert "--user-dir fairseq_plugins --arch" in block and "fairseq-generate" in block
    block = block.replace("source .venv/bin/activate\n", "")  # this venv is already on PATH
    assert "--max-epoch 12" in block
    block = block.replace("--max-epoch 12", "--max-update 3").replace("--lenpen 0.6", "--lenpen 0.6 --max-len-b 5")
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    assert any(line.startswith("Generate test with beam=4: BLEU") for line in out), proc.stdout[-2000:]
    assert out[-1].startswith("D-0\t"), proc.stdout[-2000:]

    hub = block_with(text, "python", "from_pretrained").replace("beam=4, lenpen=0.6", "beam=4, lenpen=0.6, max_len_b=5")
    proc = subprocess.run([sys.executable, "-c", hub], cwd=tmp_path, env=env, text=True, capture_output=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() and len(proc.stdout.split()) <= 5


@pytest.mark.slow
def test_readme_hydra_toy_command_resumes(tmp_path):
    """The README's fairseq-hydra-train command, run twice (2 updates, then up to 4): the second run continues from
    the first one's checkpoint_last.pt instead of starting afresh in a new outputs/<date>/<time>/."""
    env = toy_checkout(tmp_path)
    (command,) = [line for line in README.read_text(encoding="utf-8").splitlines()
                  if line.startswith("fairseq-hydra-train ") and "toy_transformer" in line]
    subprocess.run([sys.executable, "scripts/make_toy_data.py", "--out", "data/toy/raw", "--train", "2000", "--valid", "40", "--test", "40", "--test-long", "20"],
                   cwd=tmp_path, env=env, check=True, capture_output=True)
    subprocess.run(["bash", "scripts/prepare_bitext.sh", "data/toy/raw", "data/toy", "src", "tgt", "400", "test_long"],
                   cwd=tmp_path, env=env, check=True, capture_output=True)
    logs = []
    for updates in (2, 4):
        proc = subprocess.run(f"{command} optimization.max_update={updates}", shell=True, cwd=tmp_path, env=env,
                              text=True, capture_output=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        logs.append(proc.stdout + proc.stderr)
    assert "No existing checkpoint found" in logs[0]
    assert "Loaded checkpoint checkpoints/toy_transformer_hydra/checkpoint_last.pt (epoch 1 @ 2 updates)" in logs[1]
    assert not (tmp_path / "outputs").exists()
