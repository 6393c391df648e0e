"""scripts/filter_by_length.py --join: consecutive pairs packed greedily while both sides stay within the cap, each
pair in at most one join, the joins after the single pairs; --join without a token cap is one line."""
import subprocess
import sys

from conftest import REPO, env

import filter_by_length


def test_joins_are_greedy_runs_of_consecutive_pairs_within_the_cap():
    src = [3, 4, 10, 2, 2, 2, 9]
    tgt = [3, 4, 3, 2, 2, 9, 1]
    # 0+1: 7 and 7 pieces, a third would pass 10; 2 alone fills the cap; 3+4 fit, + 5 passes it on the target
    # side (13); 5+6: 11 source pieces; 6 is the last line
    assert filter_by_length.packs(src, tgt, 10) == [(0, 1), (3, 4)]
    assert filter_by_length.packs([1] * 7, [1] * 7, 3) == [(0, 2), (3, 5)]  # three at a time, the 7th alone
    assert filter_by_length.packs([5, 5], [5, 5], 9) == []


def test_join_needs_a_token_cap(tmp_path):
    for name in ("a.en", "a.de"):
        (tmp_path / name).write_text("x .\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "scripts/filter_by_length.py", "--src", str(tmp_path / "a.en"), "--tgt",
                           str(tmp_path / "a.de"), "--max-words", "5", "--join", "--out-prefix",
                           str(tmp_path / "out")], cwd=REPO, env=env(), capture_output=True, text=True)
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [
        "filter_by_length.py: --join needs --max-tokens (joins are capped in sentencepiece pieces)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.de", "a.en"]
