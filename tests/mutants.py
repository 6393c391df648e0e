#!/usr/bin/env python3
"""How much the test suite catches: a fixed sample of one-line mutants of the product code, each run against the
test files that should kill it.

What it measures. Each record of ``MUTANTS`` is a plausible silent bug, one line of one product file changed (an
off-by-one in a clip distance, a sign flip, a wrong axis, a missing scale, a cache key that ignores a field, a
skipped invalidation, an RK4 coefficient changed, a refusal weakened or inverted, an ingest that drops or mislabels
a row, ...). For each one this script writes the mutant, runs

    python -m pytest -q -x -n 0 -p no:cacheprovider [-m "not slow"] <the record's tests>

from the repository root (this interpreter), and restores the file's original bytes (and its mtime) whatever
happens: an exception, Ctrl-C, SIGTERM or SIGHUP (a handler that raises), a timeout. A mutant is *killed* when
pytest exits non-zero (a timeout counts as killed, and says so), *SURVIVED* when the tests pass anyway (the
tests' blind spot, or, rarely, a mutant that changes nothing observable), *stale* when its ``old`` text no longer
occurs exactly once in its file (the code moved: update the record). The score is "killed K of N".

Killing is relative to the listed test files, not to the whole suite: a mutant that survives here may be caught by
a file it does not list, and editing a record's ``tests`` changes the score. So a before/after comparison (a
test made stronger, a refactor of the product code) must use the same records, the same test lists and the same
mode (``--fast`` or not); compare the per-mutant lines, not only the totals. The ``tests`` of each record are the
fast files that cover its code (none of tests/conftest.py's SLOW_MODULES unless nothing else covers it); a listed
file may still hold tests marked slow, which run unless ``--fast`` deselects them (-m "not slow", the fast tier of
``make test-fast``): then a mutant that only a slow test catches survives, which is itself worth knowing.

How to run (a few seconds to minutes per mutant, one pytest process at a time; -x stops at the first failure):

    python tests/mutants.py --check              # every record's old text found exactly once, compiles; no tests run
    python tests/mutants.py --list               # the records: id, group, file, tests, why
    python tests/mutants.py                      # every mutant (long: use --fast, or --only)
    python tests/mutants.py --only ID,ID --timeout 300 --out mutants.md
    python tests/mutants.py --fast --out /tmp/mutants.md   # deselect the tests marked slow
    python tests/mutants.py --baseline --only ID # first check that the listed tests pass unmutated

Safety. It refuses to start when a file it would mutate has uncommitted changes (``git diff --quiet -- FILE``,
staged ones too), so that restoring never undoes anyone's work; it holds a lock so that two runs never mutate at
once; before each mutant it journals the original bytes in a private temporary folder, so that a run killed with
SIGKILL (which no handler sees) is repaired by the next run (or ``--check``), which restores a file it finds still
holding that mutant's exact bytes. The child runs with PYTHONDONTWRITEBYTECODE=1, so that no bytecode of a mutant
is cached beside the source. Nothing is committed and no other file is touched.
"""
import argparse
import base64
import datetime
import fcntl
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple, Tuple

REPO = Path(__file__).resolve().parents[1]
STATE = Path(tempfile.gettempdir()) / f"mutants-{hashlib.sha1(str(REPO).encode()).hexdigest()[:12]}"
JOURNAL = STATE / "pending.json"
LOCK = STATE / "lock"
GROUPS = ("maths", "floater", "cache", "refusal", "campaign", "other")


class Mutant(NamedTuple):
    id: str
    file: str  # relative to the repository root
    old: str  # an exact substring, on one line, occurring exactly once in the file
    new: str  # what replaces it
    tests: Tuple[str, ...]  # test files (paths under tests/; a pytest node id works too) that should kill it
    why: str  # the bug, in one line
    group: str = "other"  # one of GROUPS: how the sample is spread


RA = "fairseq_plugins/modules/relative_attention.py"
FL = "fairseq_plugins/modules/floater/"
CHECK = "fairseq_plugins/fairseq_check.py"
CP = "scripts/tooling/gpu/campaign_jobs.py"

MUTANTS = [
    # -- the schemes' maths (fairseq_plugins/modules/) ---------------------------------------------------------
    Mutant("shaw-clip-off-by-one", RA, "(offset.clamp(-k, k) + k + row * (2 * k + 1)).view(-1)",
           "(offset.clamp(-k, k - 1) + k + row * (2 * k + 1)).view(-1)", ("tests/test_relative_attention.py",),
           "Shaw: keys at distance ≥ +k get the table row of k − 1 (clip(x, k) off by one on the right)", "maths"),
    Mutant("shaw-before-softmax-unscaled", RA, "        q = q * attention.scaling",
           "        q = q", ("tests/test_relative_attention.py",),
           "Shaw: fairseq's before_softmax logits (ShawRelative.scores) lose the 1/sqrt(d_z) scale", "maths"),
    Mutant("rope-rotation-sign", "fairseq_plugins/modules/position_scheme.py", "even * cos - odd * sin",
           "even * cos + odd * sin", ("tests/test_rope.py", "tests/test_xpos.py"),
           "the rotation slot (RoPE, xPos): the first component of each rotated pair takes +sin (no longer a "
           "rotation)", "maths"),
    Mutant("rope-ntk-exponent", "fairseq_plugins/modules/rope.py", "s ** (d / (d - 2))", "s ** (d / (d - 1))",
           ("tests/test_rope.py",), "RoPE NTK-aware scaling: base b·s^(d/(d−1)) instead of b·s^(d/(d−2))", "maths"),
    Mutant("t5-direction-flipped", "fairseq_plugins/modules/t5_bias.py", "(n < 0).long() * num_buckets",
           "(n > 0).long() * num_buckets", ("tests/test_position_schemes.py",),
           "T5: the bidirectional buckets' offset B/2 goes to keys behind the query instead of ahead", "maths"),
    Mutant("alibi-odd-heads-slopes", "fairseq_plugins/modules/alibi.py", "alibi_slopes(2 * closest)[0::2]",
           "alibi_slopes(2 * closest)[1::2]", ("tests/test_position_schemes.py",),
           "ALiBi: for a head count not a power of two, the extra heads take the wrong interleaved slopes", "maths"),
    Mutant("kerple-r1-r2-swapped", "fairseq_plugins/modules/kerple.py",
           "r1, r2 = self.r1(dtype).view(-1, 1, 1), self.r2(dtype).view(-1, 1, 1)",
           "r2, r1 = self.r1(dtype).view(-1, 1, 1), self.r2(dtype).view(-1, 1, 1)", ("tests/test_kerple.py",),
           "KERPLE: r1 and r2 swapped: −r2·log(1 + r1·|i − j|)", "maths"),
    Mutant("fire-encoder-far-is-query", "fairseq_plugins/modules/fire.py",
           "return i if self.causal else torch.maximum(i, j)", "return i", ("tests/test_fire.py",),
           "FIRE: the causal check dropped: the encoder normalises by ψ(max(L, i)), not the farther of i and j",
           "maths"),
    Mutant("fire-batched-index-transposed", "fairseq_plugins/modules/fire.py",
           "index = (i - j).abs() * n + self._far(i, j)", "index = (i - j).abs() + n * self._far(i, j)",
           ("tests/test_fire.py",),
           "FIRE: a padded batch gathers its bias from the (distance, far) table with the axes swapped", "maths"),
    Mutant("cross-prior-ratio-inverted", "fairseq_plugins/modules/cross_prior.py",
           "q_pos.to(dtype)[None, :] / self.ratio", "q_pos.to(dtype)[None, :] * self.ratio",
           ("tests/test_cross_prior.py",), "ALiBi sync prior: the sync point i·ρ instead of i/ρ", "maths"),
    # -- FLOATER: its flow, the RK4 solve, its caches, the shared solve ----------------------------------------
    Mutant("rk4-stage2-coefficient", FL + "rk4.py", "alpha=delta / 3, out=u[:, 1]", "alpha=delta / 2, out=u[:, 1]",
           ("tests/test_floater_rk4.py",),
           "latent RK4: stage 2 at z + δ k1/2 (classic RK4's) inside torchdiffeq's 3/8 rule", "floater"),
    Mutant("rk4-backward-adjoint-order", FL + "rk4.py", "q_grad[:, 1:].flip(1).cumsum(1).flip(1)",
           "q_grad[:, 1:].cumsum(1)", ("tests/test_floater_rk4.py",),
           "latent RK4 backward: the q increments' adjoint sums the earlier points, not the later ones", "floater"),
    Mutant("rk4-w2-integral-missing-half", FL + "rk4.py", "square=((t * t - t[0] * t[0]) / 2)",
           "square=((t * t - t[0] * t[0]))", ("tests/test_floater_rk4.py",),
           "latent RK4: ∫ w2 τ dτ without its 1/2 (the time term of p)", "floater"),
    Mutant("dynamics-time-dropped", FL + "dynamics.py", "return self.fc2(torch.cat([hidden, tau], dim=-1))",
           "return self.fc2(torch.cat([hidden, 0 * tau], dim=-1))",
           ("tests/test_floater_rk4.py", "tests/test_floater_dynamics.py"),
           "FLOATER h(τ, p): the output layer no longer sees τ (w2 τ dropped) in torchdiffeq's solves", "floater"),
    Mutant("eval-cache-key-ignores-updates", FL + "positions.py", "key += [flow._generation, flow._num_updates] + ",
           "key += [flow._generation] + ", ("tests/test_floater.py",),
           "FLOATER eval cache: its key ignores set_num_updates, so an update through .data reuses stale biases",
           "floater"),
    Mutant("update-every-schedule-off-by-one", FL + "positions.py", "lead._num_updates % every == 0",
           "lead._num_updates % every == 1", ("tests/test_floater.py", "tests/test_floater_authors.py"),
           "--floater-update-every N: the re-solve at updates 1, N+1, ... (update 0 reuses a cache it lacks)",
           "floater"),
    Mutant("whole-bias-sign", FL + "positions.py", "(c.y0.to(d.dtype) - b.to(d.dtype)) + d",
           "(b.to(d.dtype) - c.y0.to(d.dtype)) + d", ("tests/test_floater_authors.py",),
           "--floater-cache-whole-bias: today's b(0) − the re-solve's, the correction's sign flipped", "floater"),
    Mutant("whole-bias-b0-not-paused", FL + "positions.py",
           "flow.pause_theta([proj.bias for proj in projections] if whole else ())", "flow.pause_theta(())",
           ("tests/test_floater_authors.py",),
           "--floater-cache-whole-bias: b(0) keeps its gradient between re-solves (the flag's check dropped)",
           "floater"),
    Mutant("cache-extension-off-by-one", FL + "positions.py", "first_index=have - 1, dynamics=dynamics)",
           "first_index=have, dynamics=dynamics)", ("tests/test_floater.py",),
           "FLOATER cache extension: integrates from t_have with the state of t_(have−1) (one Δ shifted)", "floater"),
    Mutant("shared-solve-overwrites-grad", FL + "shared_solve.py", "p.grad.add_(g)", "p.grad.copy_(g)",
           ("tests/test_floater_shared_solve.py",),
           "--floater-shared-solve: the solve's gradient replaces b(0)'s micro-batch gradient instead of adding",
           "floater"),
    Mutant("step-table-row-shifted", FL + "scheme.py", 'saved["biases"][tgt_len - 1]', 'saved["biases"][tgt_len]',
           ("tests/test_floater.py",),
           "FLOATER incremental decoding: each step binds the next position's bias from the step table", "floater"),
    Mutant("rows-cumsum-wrong-axis", FL + "attention.py", "keep.cumsum(dim=1)", "keep.cumsum(dim=0)",
           ("tests/test_floater_attention.py",),
           "FLOATER token rows: counted over the batch instead of along each sentence", "floater"),
    # -- caches and incremental state elsewhere ----------------------------------------------------------------
    Mutant("shaw-index-cache-ignores-k", RA, "key = (k, tgt_len, src_len, device)", "key = (tgt_len, src_len, device)",
           ("tests/test_relative_attention.py",),
           "Shaw: the index cache is keyed without k: another clipping distance's buckets are reused", "cache"),
    Mutant("shaw-index-ignores-cached-steps", RA, "query = torch.arange(S - T, S, device=device)[:, None]",
           "query = torch.arange(T, device=device)[:, None]", ("tests/test_relative_attention.py",),
           "Shaw: a query's position ignores the cached steps (S − T) while decoding step by step", "cache"),
    Mutant("self-attn-step-positions-restart", "fairseq_plugins/modules/positional_attention.py",
           "torch.arange(start, start + tgt_len, device=query.device)",
           "torch.arange(tgt_len, device=query.device)", ("tests/test_cross_prior.py",),
           "self-attention: each incremental step's position restarts at 0 (the cached keys' length ignored)",
           "cache"),
    Mutant("cross-step-counter-frozen", "fairseq_plugins/modules/positional_attention.py",
           "saved[STEP] = start + tgt_len", "saved[STEP] = start", ("tests/test_cross_prior.py",),
           "cross-attention: the incremental state's step counter never advances (every step at position 0)",
           "cache"),
    # -- refusals and flag validation --------------------------------------------------------------------------
    Mutant("unpatched-refuses-memory-efficient", CHECK, "if skips and half and halved and not efficient and not get(",
           "if skips and half and halved and not get(", ("tests/test_fairseq_check.py",),
           "unpatched fairseq: --memory-efficient-fp16/bf16 refused too (the exemption dropped)", "refusal"),
    Mutant("unpatched-legacy-ddp-world-size", CHECK, "and world > 1:", "and world > 2:",
           ("tests/test_fairseq_check.py",),
           "unpatched fairseq: --floater-shared-solve under legacy_ddp on 2 processes no longer refused", "refusal"),
    Mutant("unpatched-bf16-harm-mislabelled", CHECK, 'flat = not get("common", "bf16") and not get(',
           "flat = not get(", ("tests/test_fairseq_check.py",),
           "unpatched fairseq: the --bf16 refusal names the flat-gradient harm (bf16 keeps no flat buffer)",
           "refusal"),
    Mutant("older-patch-counts-as-patched", CHECK, "return (patch_version() or 0) >= PATCH_VERSION",
           "return patch_version() is not None", ("tests/test_fairseq_check.py",),
           "fairseq_check: a fairseq with an older patch version counts as patched (nothing refused)", "refusal"),
    Mutant("positive-accepts-zero", "fairseq_plugins/flags.py", 'if not value > 0 or value == float("inf"):',
           'if value < 0 or value == float("inf"):', ("tests/test_fire.py",),
           "flags.positive: 0 (and NaN) accepted as > 0 (--fire-threshold 0, --floater-dt 0, ...)", "refusal"),
    Mutant("whole-bias-without-update-every", FL + "scheme.py",
           "if args.floater_cache_whole_bias and args.floater_update_every == 1:",
           "if args.floater_cache_whole_bias and args.floater_update_every < 1:", ("tests/test_floater.py",),
           "Floater.validate: --floater-cache-whole-bias without --floater-update-every N > 1 accepted", "refusal"),
    Mutant("yarn-without-length-accepted", "fairseq_plugins/modules/rope.py",
           'if kind == "yarn" and length is None:', 'if kind == "yarn" and length is None and factor is None:',
           ("tests/test_rope.py",),
           "RoPE validate: yarn without --rope-original-length passes the one-line check", "refusal"),
    Mutant("prior-flags-never-checked", "fairseq_plugins/models/position_transformer.py",
           "if scheme.name in used or scheme is prior:", "if scheme.name in used or scheme.cross:",
           ("tests/test_cross_prior.py",),
           "check_flags_act: a cross-prior flag on a model without that prior is no longer refused", "refusal"),
    Mutant("floater-checkpoint-activations-accepted", FL + "scheme.py",
           '("--checkpoint-activations", cfg.checkpoint_activations),', "",
           ("tests/test_activation_checkpointing.py",),
           "FLOATER build: --checkpoint-activations no longer refused (its bindings would be gone at recompute)",
           "refusal"),
    # -- the campaign's ingest, the WMT14 tables -------------------------------------------------------------
    Mutant("ingest-accepts-run-taken-again", CP, 'if run["status"] == "done":', 'if run["status"] == "finished":',
           ("tests/test_campaign.py",),
           "campaign ingest: a run the manifest has done is accepted again (checks the report's word)", "campaign"),
    Mutant("ingest-needs-no-hypotheses", CP, "f\"{prefix}runs/{run['run']}.hyp\", ", "",
           ("tests/test_campaign.py",),
           "campaign ingest: a finished run without its .hyp file is accepted", "campaign"),
    Mutant("sync-duplicates-records", CP, "known.pop(key(r), r)", "known.get(key(r), r)",
           ("tests/test_campaign.py",),
           "campaign manifest sync: every recorded run is kept twice (in order and again at the end)", "campaign"),
    Mutant("run-key-ignores-condition", CP, 'return run["condition"], run["run"]', 'return run["run"]',
           ("tests/test_campaign.py",),
           "campaign: runs keyed by name alone: the two conditions' records overwrite each other", "campaign"),
    Mutant("record-mislabels-bleu", CP, 'bleu_tok_lc=row.get("bleu_tok_lc"))', 'bleu_tok_lc=row.get("bleu"))',
           ("tests/test_campaign.py",),
           "campaign record: the manifest's BLEU tok-lc column gets sacreBLEU", "campaign"),
    Mutant("cli-ingest-drops-finished-rows", "scripts/gpu/campaign.py",
           "cp.record(manifest, finished, report, args.lease)", "cp.record(manifest, [], report, args.lease)",
           ("tests/test_campaign.py",),
           "campaign.py ingest: the lease is recorded but none of its finished runs (only the slow dry run reads it)",
           "campaign"),
    Mutant("tables-delta-sign", "scripts/make_tables.py", "{ours - paper:+.2f}", "{paper - ours:+.2f}",
           ("tests/test_tables.py",), "make_tables: Δ written as paper − ours", "campaign"),
    # -- elsewhere: the fused attention kernel's wrapper -------------------------------------------------------
    Mutant("fused-bias-grad-no-row-term", "fairseq_plugins/modules/fused_attention.py",
           ".sub_(row).mul_(alpha)", ".mul_(alpha)", ("tests/test_cross_prior.py",),
           "BiasedFlashCPU backward: dS = α ⊙ dz vᵀ without the softmax's − dz·z term (a learned bias's gradient)",
           "other"),
    Mutant("fused-sdpa-scale", "fairseq_plugins/modules/fused_attention.py", "1.0 / math.sqrt(q.size(-1))",
           "1.0 / q.size(-1)", ("tests/test_cross_prior.py",),
           "biased_sdpa: the fused CPU kernel's scale 1/d instead of 1/sqrt(d)", "other"),
]


# -- the files ----------------------------------------------------------------------------------------------------

def mutated_text(m: Mutant):
    """(original bytes, mutated bytes) of m's file, or (original, None) with the reason when it cannot apply."""
    original = (REPO / m.file).read_bytes()
    text = original.decode("utf-8")
    found = text.count(m.old)
    if "\n" in m.old or "\n" in m.new:
        return original, None, "old/new span lines"
    if found != 1:
        return original, None, f"old found {found} times"
    return original, text.replace(m.old, m.new, 1).encode("utf-8"), None


def dirty(files):
    """The files among `files` with uncommitted changes (working tree or index)."""
    out = []
    for f in sorted(set(files)):
        for extra in ([], ["--cached"]):
            rc = subprocess.run(["git", "diff", "--quiet", *extra, "--", f], cwd=REPO).returncode
            if rc not in (0, 1):
                sys.exit(f"mutants.py: git diff failed on {f} (rc {rc}): not a git checkout?")
            if rc == 1:
                out.append(f)
                break
    return out


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_journal(m: Mutant, original: bytes, mutant: bytes, stat):
    STATE.mkdir(mode=0o700, exist_ok=True)
    record = {"id": m.id, "file": m.file, "original": base64.b64encode(original).decode(),
              "mutant_sha256": sha(mutant), "mtime_ns": stat.st_mtime_ns, "atime_ns": stat.st_atime_ns}
    tmp = JOURNAL.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, JOURNAL)


def clear_journal():
    try:
        JOURNAL.unlink()
    except FileNotFoundError:
        pass


def recover():
    """A mutant left by a run that could not restore it (SIGKILL): restored if its file still holds exactly the
    mutant's bytes; a file changed since is left alone and the run refused."""
    if not JOURNAL.exists():
        return
    record = json.loads(JOURNAL.read_text())
    path = REPO / record["file"]
    original = base64.b64decode(record["original"])
    current = path.read_bytes() if path.exists() else None
    if current == original:
        clear_journal()
    elif current is not None and sha(current) == record["mutant_sha256"]:
        restore(path, original, record["atime_ns"], record["mtime_ns"])
        print(f"mutants.py: restored {record['file']}, left mutated ({record['id']}) by an interrupted run",
              file=sys.stderr)
    else:
        sys.exit(f"mutants.py: {record['file']} was mutated by an interrupted run ({record['id']}) and has changed "
                 f"since; its original bytes are in {JOURNAL} (base64, key 'original'): compare, then delete it")


class Interrupted(BaseException):
    """SIGTERM or SIGHUP: raised like KeyboardInterrupt, so that every finally restores."""


def _raise(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def restore(path: Path, original: bytes, atime_ns: int, mtime_ns: int):
    """The original bytes and times back; a signal arriving meanwhile is held until they are."""
    held = []
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in signals}
    try:
        with open(path, "wb") as f:
            f.write(original)
        # the original mtime: the bytecode cached for the original is valid again, and no cached bytecode of a
        # mutant (none is written: PYTHONDONTWRITEBYTECODE) could match it
        os.utime(path, ns=(atime_ns, mtime_ns))
        if path.read_bytes() != original:
            raise RuntimeError(f"{path}: restoring failed; its original bytes are in {JOURNAL}")
        clear_journal()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if held:
        if held[0] == signal.SIGINT:
            raise KeyboardInterrupt
        raise Interrupted(signal.Signals(held[0]).name)


# -- running one mutant ---------------------------------------------------------------------------------------

def pytest_command(tests, fast):
    return [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider",
            *(["-m", "not slow"] if fast else []), *tests]


def child_env():
    env = dict(os.environ)
    for name in ("TIER_MAX_SECONDS", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS"):
        env.pop(name, None)  # the fast tier's CPU bound would fail a slow-but-correct test: not the mutant's doing
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


FAILED = re.compile(r"^(FAILED|ERROR) (\S+)")


def run_tests(tests, timeout, fast):
    """(rc or None on timeout, seconds, first failing test or a short reason)."""
    started = time.monotonic()
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as log:
        proc = subprocess.Popen(pytest_command(tests, fast), cwd=REPO, env=child_env(), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        rc = None
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if proc.poll() is None:  # timeout, Ctrl-C or SIGTERM: the whole pytest process group goes
                for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 30)):
                    try:
                        os.killpg(proc.pid, sig)
                    except ProcessLookupError:
                        break
                    try:
                        proc.wait(timeout=grace)
                        break
                    except subprocess.TimeoutExpired:
                        continue
        seconds = time.monotonic() - started
        log.seek(0)
        lines = log.read().splitlines()
    first = next((m.group(2) for line in lines for m in [FAILED.match(line)] if m), None)
    if rc is None:
        return None, seconds, f"timeout after {timeout:g} s"
    if first is None and rc != 0:
        tail = [line for line in lines if line.strip()][-1:] or [f"exit {rc}"]
        first = tail[0][:160]
    return rc, seconds, first or ""


def verdict(rc):
    """killed / SURVIVED / error (pytest's own usage error or nothing collected: not the mutant's doing)."""
    if rc is None:
        return "killed (timeout)"
    if rc == 0:
        return "SURVIVED"
    if rc in (4, 5):  # usage error (a bad path or option), no tests collected (-m deselected them all)
        return "error"
    if rc < 0:
        return f"killed ({signal.Signals(-rc).name})"
    return "killed"


def run_mutant(m: Mutant, timeout, fast):
    if dirty([m.file]):
        return "dirty", 0.0, "uncommitted changes appeared in the file: skipped"
    original, mutant, why = mutated_text(m)
    if mutant is None:
        return "stale", 0.0, why
    path = REPO / m.file
    stat = path.stat()
    write_journal(m, original, mutant, stat)
    try:
        with open(path, "wb") as f:
            f.write(mutant)
        rc, seconds, first = run_tests(m.tests, timeout, fast)
    finally:
        restore(path, original, stat.st_atime_ns, stat.st_mtime_ns)
    return verdict(rc), seconds, first


# -- the command line ---------------------------------------------------------------------------------------

def check(mutants):
    """Every record applies: old once and on one line, new different, the mutant compiles, its tests exist."""
    bad = 0
    seen = set()
    for m in mutants:
        problems = []
        if m.id in seen:
            problems.append("duplicate id")
        seen.add(m.id)
        if m.group not in GROUPS:
            problems.append(f"group {m.group!r}")
        if m.old == m.new:
            problems.append("new == old")
        if not (REPO / m.file).is_file():
            problems.append("no such file")
        else:
            _, mutant, why = mutated_text(m)
            if mutant is None:
                problems.append(why)
            elif m.file.endswith(".py"):
                try:
                    compile(mutant, m.file, "exec")
                except SyntaxError as err:
                    problems.append(f"mutant does not compile ({err.msg}, line {err.lineno})")
        for t in m.tests:
            if not t.startswith("tests/") or not (REPO / t.split("::")[0]).is_file():
                problems.append(f"no test file {t}")
        if problems:
            bad += 1
        print(f"{m.id:<40} {'ok' if not problems else 'STALE: ' + '; '.join(problems)}")
    counts = {g: sum(m.group == g for m in mutants) for g in GROUPS}
    print(f"{len(mutants) - bad} of {len(mutants)} records apply ({', '.join(f'{g} {n}' for g, n in counts.items())})")
    return 1 if bad else 0


def markdown(rows, args, killed, total, started):
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True).stdout.strip()
    command = " ".join(shlex.quote(a) for a in pytest_command([], args.fast)[1:]) + " <tests>"
    lines = [f"# Mutants: killed {killed} of {total}", "",
             f"Code `{head}` (uncommitted changes elsewhere not counted), {started:%Y-%m-%d %H:%M}; each mutant "
             f"against its own test files (`python {command}`, timeout {args.timeout:g} s). Killing is relative to "
             "those files: compare runs with the same records and mode only.", "",
             "| mutant | group | file | result | s | first failing test | tests |", "|---|---|---|---|---:|---|---|"]
    for m, status, seconds, first in rows:
        cell = first.replace("|", "\\|")
        lines.append(f"| `{m.id}` | {m.group} | `{m.file}` | {status} | {seconds:.1f} | {cell} | "
                     f"{', '.join(t.replace('tests/', '') for t in m.tests)} |")
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str):
    path = path.resolve()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", help="comma-separated mutant ids (default: all)")
    p.add_argument("--list", action="store_true", help="print the records and exit")
    p.add_argument("--check", action="store_true", help="only check that every record applies (no tests run)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant's pytest (default 600)")
    p.add_argument("--out", type=Path, help="also write the results as a markdown table (atomically)")
    p.add_argument("--fast", action="store_true", help='deselect the tests marked slow (-m "not slow")')
    p.add_argument("--baseline", action="store_true",
                   help="first run each selected test list unmutated; refuse if one fails")
    args = p.parse_args(argv)
    mutants = MUTANTS
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        by_id = {m.id: m for m in MUTANTS}
        unknown = [w for w in wanted if w not in by_id]
        if unknown:
            p.error(f"unknown mutant id(s): {', '.join(unknown)} (see --list)")
        mutants = [by_id[w] for w in wanted]
    if args.list:
        for m in mutants:
            print(f"{m.id}\t{m.group}\t{m.file}\t{' '.join(m.tests)}\t{m.why}")
        return 0

    STATE.mkdir(mode=0o700, exist_ok=True)
    with open(LOCK, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.exit("mutants.py: another run holds the lock (one run at a time: they would mutate the same tree)")
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _raise)
        recover()
        if args.check:
            return check(mutants)
        changed = dirty(m.file for m in mutants)
        if changed:
            sys.exit(f"mutants.py: refusing to start: uncommitted changes in {', '.join(changed)} (commit or stash "
                     "them, or leave their mutants out with --only)")
        if args.baseline:
            for tests in dict.fromkeys(m.tests for m in mutants):
                rc, seconds, first = run_tests(tests, args.timeout, args.fast)
                print(f"baseline {' '.join(tests)}: {'pass' if rc == 0 else 'FAIL'} {seconds:.1f}s {first}",
                      flush=True)
                if rc != 0:
                    sys.exit("mutants.py: a test list fails unmutated; its mutants would all count as killed")
        started = datetime.datetime.now()
        print(f"{len(mutants)} mutant(s), each: python {' '.join(pytest_command(['<tests>'], args.fast)[1:])}",
              flush=True)
        rows = []
        try:
            for m in mutants:
                status, seconds, first = run_mutant(m, args.timeout, args.fast)
                rows.append((m, status, seconds, first))
                print(f"{m.id:<40} {status:<18} {seconds:7.1f}s  {first if status != 'SURVIVED' else ''}",
                      flush=True)
        except (KeyboardInterrupt, Interrupted) as err:
            print(f"mutants.py: interrupted ({type(err).__name__} {err}); the mutated file was restored",
                  file=sys.stderr)
            return 130
        ran = [r for r in rows if r[1] not in ("stale", "dirty", "error")]
        killed = sum(r[1].startswith("killed") for r in ran)
        other = len(rows) - len(ran)
        print(f"killed {killed} of {len(ran)}" + (f" ({other} stale, dirty or in error, not counted)" if other else ""))
        if args.out:
            write_atomic(args.out, markdown(rows, args, killed, len(ran), started))
            print(f"wrote {args.out}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
