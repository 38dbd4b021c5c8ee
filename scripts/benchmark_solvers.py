"""Our GAP-TV (cassi.solvers.GAPTV) vs a textbook GAP-TV (cassi/solvers/textbook.py).

    python scripts/benchmark_solvers.py                      # 1×28×256×256 scene, Bernoulli mask, 2 threads
    python scripts/benchmark_solvers.py repeats=3 solver.iters=40
Both run the same iterations with the same TV weights from the same pseudo-inverse start, so
they compute the same iterates: the PSNRs must agree within ``psnr_tol`` dB. Times are medians
of repeated runs after warm-up, ours first, then the textbook (the textbook's page faulting
slows whatever runs right after it, so the runs are not interleaved). Writes benchmark_solvers.json and
benchmark_solvers.md into the Hydra output directory (atomically; cassi.workflows.benchmarks.benchmark_solvers).
"""
import hydra
from omegaconf import DictConfig

from cassi.workflows.benchmarks import benchmark_solvers


@hydra.main(version_base="1.3", config_path="../conf", config_name="benchmark_solvers")
def main(cfg: DictConfig) -> None:
    benchmark_solvers(cfg)


if __name__ == "__main__":
    main()
