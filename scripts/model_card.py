"""Model card of a trained checkpoint: its scores beside A⁺y and GAP-TV on the validation and the test scenes,
time per scene, training steps and CPU-hours (in all, over the ``init_weights=`` pieces the checkpoint records,
and its last piece's), geometry; plus its reference output on a small fixed input
(``cassi.models.reference_input``) that the tests compare with. With ``ship=true`` the weights go to
``cassi/pretrained/<name>.ckpt`` (loadable as ``pretrained/<name>`` everywhere a checkpoint is accepted).
A Refiner trained without projecting its stages onto y is scored projected too (``project=auto``), and shipped
projected when that raises its validation PSNR; it is scored with the flip ensemble on every stage too
(``ensemble=auto``: twice the U-Nets' time), kept where that raises its validation PSNR by more than 0.05 dB.
``measure=across_masks`` on a shipped model measures only the
card's table across masks, and sets it in the card and the weights' record; the rest of the card is kept.
The work is :func:`cassi.workflows.card.model_card`.

    python scripts/model_card.py ckpt=runs/cave_tsa/checkpoints/best-epoch010-step2816.ckpt name=cave_tsa ship=true
    python scripts/model_card.py ckpt=pretrained/cave_tsa name=cave_tsa measure=across_masks validation.test.crop_grid=2
"""
import hydra
from omegaconf import DictConfig

from cassi.workflows.card import card_job


@hydra.main(version_base="1.3", config_path="../conf", config_name="model_card")
def main(cfg: DictConfig) -> None:
    card_job(cfg)


if __name__ == "__main__":
    main()
