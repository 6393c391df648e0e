"""The tests' shared helpers (importable as ``helpers``: pytest puts tests/ on sys.path; a child process of a
test runs with tests/ as its working directory or script directory). Nothing here imports torch on import of the
package itself (``fake_cuda`` must load its library before torch).

    tiny_models           build(arch) of every untrained tiny model in-process, batches, the 24-word task
    small_task            fairseq-train on the small corpus: commands, one or two ranks, checkpoint comparison
    floater_helpers       FLOATER flows with random dynamics, solve counting
    precision_harness     fairseq's Trainer in-process for every precision mode (fp16 optimizer on CPU)
    cuda_stand_ins        torch.cuda's streams and events for the two CPU layers below
    cuda_graph_emulation  CUDA graphs on CPU: captures record, replays overwrite static buffers
    fake_cuda/            fake tensors on cuda:0 with a do-nothing C++ device guard
    slurm_cluster         a one-node Slurm cluster for the sbatch tests
    wmt14_mirror          a miniature mirror of the WMT14 archives
    old_checkpoints       a fixture checkpoint loaded as fairseq-generate loads it, its outputs on one batch
"""
