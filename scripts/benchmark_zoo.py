"""The field's models in cassi against their reference code (the MST toolbox's; DPU's, SSR's and SAUNet's
authors'): parameters, FLOPs, forward and training-step time, same weights, same scene, same process, alternating
(:func:`cassi.workflows.benchmarks.benchmark_zoo`).

    python scripts/benchmark_zoo.py toolbox=<MST checkout>/simulation/train_code [methods=[mst_s]] [threads=[1,2]]
    python scripts/benchmark_zoo.py authors.dpu=<DPU checkout> 'methods=[dpu_5stg,dpu_9stg]'

Writes benchmark_zoo.{md,json} in the output folder and prints the table.
"""
import hydra
from omegaconf import DictConfig

from cassi.workflows.benchmarks import benchmark_zoo


@hydra.main(version_base="1.3", config_path="../conf", config_name="benchmark_zoo")
def main(cfg: DictConfig) -> None:
    benchmark_zoo(cfg)


if __name__ == "__main__":
    main()
