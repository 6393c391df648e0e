"""The Multi30k study's library (scripts/study/study.py, scripts/study/length_probe.py).

    runs           the study's run results, the runs a table covers, its curves
    table          the study's table: seeds' mean ± std, paired bootstrap against a reference, the claims
    plan           the study's decisions: the order of its runs, and run, skip, probe or retrain each
    probe          the length probe's joined test sentences, buckets and scores
    probe_table    the length probe's table over seeds, repeats and differences per bucket
    results_table  the study in one table (README.md, results/multi30k_study/README.md), and the probe's figure
"""
