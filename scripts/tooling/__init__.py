"""The scripts' shared library, importable as ``tooling`` (a script in scripts/ finds it beside itself, one in a
folder below puts scripts/ on sys.path; scripts/setup_env.sh puts scripts/ on the venv's path for tests and other
importers). Nothing here runs on import; command-line entry points live in scripts/.

What the user's tools share:
    tooling.atomic   write a file under a temporary name beside it, then rename it into place
    tooling.paths    paths in committed results, relative to the repository (scripts/result_paths.py)
    tooling.supervise  a command in a process group of its own, output pumped, killed with all it started at a cap
    tooling.bleu     the papers' tokenized BLEU (scripts/tokenized_bleu.py)
    tooling.bootstrap  paired bootstrap resampling over test sentences (make_tables.py, the study's tables)
    tooling.cells    the WMT14 cells: experiment names <-> configs/wmt14.yaml's pair, size, scheme (scripts/hydra_config.py)
    tooling.slurm_jobs  Slurm's clients for a submission that never queues a job twice (scripts/submit_paper.py)
    tooling.invariance  a sentence alone vs in a left-padded batch, any scheme, any device (tests, the GPU check)
    tooling.position_arrays  a checkpoint loaded without its data; what its position schemes learned, as tensors
    tooling.position_figures  the figures of those tensors (scripts/plot_positions.py)

The project's own verification, a subpackage per role:
    tooling.study    the Multi30k study (scripts/study/): its runs, table, plan, length probe, results table
    tooling.bench    the benchmark (scripts/bench/bench.py): its command line, phases, models, clocks, ops, regime
    tooling.gpu      the GPU check and the GPU campaign (scripts/gpu/): sections, CUDA-graph check, users' path,
                     verdicts, the campaign's jobs
"""
