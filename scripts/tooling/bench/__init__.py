"""The benchmark's library (scripts/bench/bench.py; docs/benchmarks.md).

    cli         the command line: flags, defaults, checks, the report written (the GPU check calls main())
    phases      the measurements at fixed lengths, phase by phase
    models      its models and batches, built through fairseq's APIs
    timing      its clocks, medians, profiles and record of the machine
    ops         --count-ops: operators and host syncs of an update
    update_ops  --count-ops --regime: those of fairseq's Trainer.train_step per precision, each sync named
    regime      --regime: fairseq's Trainer per precision on a WMT-like length mix
    length_mix  newstest2014's length histogram (newstest2014_ende_lengths.json), batched as fairseq-train batches it
    report      the benchmark's markdown
"""
