"""The GPU check (scripts/gpu/gpu_check.py), the speed check (scripts/gpu/speed_check.py) and the GPU campaign
(scripts/gpu/campaign.py).

    common          the check's sections, caps and bounds, and its small helpers
    sections        each section run in its own process under its cap: machine, precision, bench, invariance
    graph           the floater_graph section: FLOATER's CUDA-graph solve against its loop
    users_path      the users_path section: train.sh, evaluate.sh, make_tables.py on a stand-in WMT14 En-De
    wmt14_stand_in  that stand-in: newstest2014's lengths, made-up words
    verdicts        the check's report (markdown, json) and its verdicts
    campaign_jobs   the campaign's runs, jobs, concurrency, archives and manifest
    campaign_report a campaign call's archives of its runs and its campaign.md
    mps             CUDA MPS started and stopped for a call's many processes on one GPU
"""
