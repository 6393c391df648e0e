"""The scripts' shared library (importable as ``tooling``: a script's own directory is on sys.path, and
scripts/setup_env.sh puts scripts/ on the venv's path for tests and other importers).

    tooling.atomic   write a file under a temporary name beside it, then rename it into place
    tooling.paths    paths in committed results, relative to the repository (scripts/result_paths.py)
    tooling.bleu     the papers' tokenized BLEU (scripts/tokenized_bleu.py)
    tooling.study    the Multi30k study's run results, the runs a table covers, its curves (scripts/study.py)
    tooling.study_table  the study's table: seeds' mean ± std, paired bootstrap against a reference, the claims
    tooling.study_plan  the study's decisions: the order of its runs, and run, skip, probe or retrain each
    tooling.length_probe  the length probe's joined test sentences, buckets and scores (scripts/length_probe.py)
    tooling.length_probe_table  the length probe's table over seeds, repeats and differences per bucket
    tooling.bench    the benchmark's measurements at fixed lengths, phase by phase (scripts/bench.py)
    tooling.bench_models  the benchmark's models and batches, built through fairseq's APIs
    tooling.bench_timing  the benchmark's clocks, medians, profiles and record of the machine
    tooling.bench_ops  scripts/bench.py --count-ops: operators and host syncs of an update
    tooling.bench_regime  scripts/bench.py --regime: fairseq's Trainer per precision on a WMT-like length mix
    tooling.length_mix  newstest2014's length histogram, batched as fairseq-train batches it
    tooling.bench_report  the benchmark's markdown
    tooling.cells    the WMT14 cells: experiment names <-> configs/wmt14.yaml's pair, size, scheme (scripts/hydra_config.py)
    tooling.invariance  a sentence alone vs in a left-padded batch, any scheme, any device (tests, gpu_check.py)
    tooling.position_arrays  a checkpoint loaded without its data; what its position schemes learned, as tensors
    tooling.position_figures  the figures of those tensors (scripts/plot_positions.py)
    tooling.supervise  a command in a process group of its own, output pumped, killed with all it started at a cap
    tooling.gpu_common  the GPU check's sections, caps and bounds, and its small helpers (scripts/gpu_check.py)
    tooling.gpu_graph  the GPU check's section b: FLOATER's CUDA-graph solve against its loop
    tooling.gpu_sections  the GPU check's sections a, c, d, f, and each section run in its own process under its cap
    tooling.gpu_report  the GPU check's report (markdown, json) and its verdicts
    tooling.campaign  the GPU campaign's runs, jobs, concurrency, archives and manifest (scripts/campaign.py)

Command-line entry points stay in scripts/*.py; nothing here runs on import.
"""
