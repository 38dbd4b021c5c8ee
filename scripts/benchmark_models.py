"""Parameters, FLOPs, reconstruction time and training cost of the model configs (conf/benchmark_models.yaml).

    python scripts/benchmark_models.py                       # every conf/model config on this CPU
    python scripts/benchmark_models.py device=cuda train_size=256 train_batch=4 precision=[32,bf16] \
        checkpointing=[false,true]
    python scripts/benchmark_models.py 'models=[pretrained/cave_any]' repeats=5    # a shipped model against GAP-TV
FLOPs: one forward pass at flops_size² × bands, batch 1, counted by torch.utils.flop_counter.FlopCounterMode
(convolutions, matmuls and attention; a multiply-add counts 2; the operator's elementwise work is not
counted). Reconstruction: the median time of one forward pass at flops_size² × bands (batch 1, no
gradient) against GAP-TV (conf/solver/gap_tv.yaml) on the same measurement, in the same process. Training:
samples/s over ``steps`` Adam steps after one warm-up step, and peak memory (CUDA: max allocated above what was
allocated before; CPU: the peak resident memory above the resident memory before the first step, with Linux's
peak counter reset (/proc/self/clear_refs), in a fresh process per row).
Writes benchmark_models.{md,json} in the output folder (cassi.workflows.benchmarks.benchmark_models).
"""
import hydra
from omegaconf import DictConfig

from cassi.workflows.benchmarks import benchmark_models


@hydra.main(version_base="1.3", config_path="../conf", config_name="benchmark_models")
def main(cfg: DictConfig) -> None:
    benchmark_models(cfg)


if __name__ == "__main__":
    main()
