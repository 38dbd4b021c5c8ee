"""Models know their camera: checkpoints record the training masks and noise; another mask logs one warning."""
import logging

import pytest
import torch

from cassi import CASSI
from cassi.models import load_model
from cassi.models.camera import check_camera, describe_camera, other_masks_expected
from cassi.physics.masks import center_crop
from cassi.physics.noise import ShotNoise
from cassi.physics.simulate import BernoulliMasks, FixedMask, RandomMaskCrops, Simulator


def _warnings(caplog, model, mask, bands=28):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cassi.models"):
        ok = check_camera(model, CASSI(mask, bands=bands, step=2))
    return ok, [r.getMessage() for r in caplog.records if r.name == "cassi.models"]


def test_describe_records_each_mask_source_and_the_noise():
    big = (torch.rand(200, 300) > 0.5).float()
    crops = describe_camera(Simulator(RandomMaskCrops(big), bands=4, noise=ShotNoise(photons=100)))
    assert crops["masks"]["kind"] == "crops" and crops["masks"]["shape"] == [200, 300]
    assert crops["masks"]["segments"] and crops["noise"].startswith("ShotNoise(photons=100")
    assert describe_camera(Simulator(FixedMask(big), bands=4))["masks"]["kind"] == "fixed"
    assert describe_camera(Simulator(BernoulliMasks(0.3)))["masks"] == {"kind": "bernoulli", "p": 0.3}
    assert describe_camera(object()) is None


def test_a_window_of_the_training_mask_fits_and_another_mask_warns_once(caplog):
    g = torch.Generator().manual_seed(0)
    big = torch.rand(300, 320, generator=g)  # a calibrated (non-binary) mask
    model = torch.nn.Module()
    model.camera, model.source = describe_camera(Simulator(RandomMaskCrops(big))), "trained.ckpt"
    for window in (big, big[17:273, 33:289], big[:130, 190:320]):
        assert _warnings(caplog, model, window) == (True, [])
    other = torch.rand(256, 256, generator=g)  # same statistics, another mask
    ok, msgs = _warnings(caplog, model, other)
    assert not ok and len(msgs) == 1 and "trained.ckpt was trained for random crops of the mask" in msgs[0]
    assert _warnings(caplog, model, other) == (False, [])  # once per model and mask
    third = torch.rand(256, 256, generator=g)
    with other_masks_expected():  # a model scored across masks on purpose (model_card.py): no line, still False
        assert _warnings(caplog, model, third) == (False, [])
    assert _warnings(caplog, model, third)[1]  # outside it, the same mask warns (not remembered as said)


def test_every_window_of_64_px_or_more_is_recognised_and_constant_rows_name_no_mask(caplog):
    g = torch.Generator().manual_seed(3)
    mask = (torch.rand(256, 256, generator=g) < 0.5).float()
    mask[:, :70] = 0  # a dark border, as real masks have
    model = torch.nn.Module()
    model.camera = describe_camera(Simulator(FixedMask(mask)))
    for side in (64, 90, 100, 150, 200):  # centre crops of the scene sizes a model meets (the shared crops: 100, 150)
        assert _warnings(caplog, model, center_crop(mask, (side, side))) == (True, [])
    for top, left, h, w in ((1, 77, 64, 64), (63, 129, 64, 100), (100, 33, 90, 120), (5, 60, 64, 64)):
        assert _warnings(caplog, model, mask[top:top + h, left:left + w]) == (True, [])
    other = (torch.rand(100, 100, generator=g) < 0.5).float()
    other[:, :80] = 0  # another mask with a dark border: the border's constant segments name neither
    assert not _warnings(caplog, model, other)[0]
    border = mask[:64, 40:110].clone()
    border[:, 32:] = 1  # the border beside a bright stretch: nothing in it names the mask
    assert not _warnings(caplog, model, border)[0]


def test_bernoulli_camera_accepts_its_kind_only(caplog):
    model = torch.nn.Module()
    model.camera = describe_camera(Simulator(BernoulliMasks(0.5)))
    g = torch.Generator().manual_seed(1)
    assert _warnings(caplog, model, (torch.rand(64, 64, generator=g) < 0.5).float()) == (True, [])
    ok, msgs = _warnings(caplog, model, (torch.rand(64, 64, generator=g) < 0.2).float())
    assert not ok and "Bernoulli(0.5) masks" in msgs[0] and "fill 0.2" in msgs[0]


def test_shipped_demo_model_warns_on_another_camera_when_called(caplog):
    model = load_model("pretrained/synthetic_demo")
    assert model.camera["masks"] == {"kind": "bernoulli", "p": 0.5}
    op = CASSI(torch.full((32, 48), 0.7), bands=28, step=2)  # a grey (non-binary) mask
    with caplog.at_level(logging.WARNING, logger="cassi.models"):
        model.check(op)
    assert any("synthetic_demo.ckpt was trained for Bernoulli(0.5) masks" in r.getMessage() for r in caplog.records)


def test_shipped_tsa_models_know_their_masks(caplog, shared_data):
    tsa = FixedMask(shared_data / "masks" / "tsa_simu_mask_256.mat").mask
    real = FixedMask(shared_data / "masks" / "tsa_real_mask_660.mat").mask
    bern = (torch.rand(256, 256, generator=torch.Generator().manual_seed(2)) < 0.5).float()
    cave_tsa, tsa_real = load_model("pretrained/cave_tsa"), load_model("pretrained/tsa_real")
    assert _warnings(caplog, cave_tsa, tsa)[0] and _warnings(caplog, tsa_real, real)[0]
    assert _warnings(caplog, tsa_real, center_crop(real, (256, 256)))[0]
    for side in (100, 150):  # the shared test crops' sizes, where the mask is centre-cropped to the scene
        assert _warnings(caplog, cave_tsa, center_crop(tsa, (side, side))) == (True, [])
        assert _warnings(caplog, tsa_real, center_crop(real, (side, side))) == (True, [])
    for model in (cave_tsa, tsa_real):  # tsa_real loses 2.2 dB to GAP-TV through Bernoulli(0.5) masks
        ok, msgs = _warnings(caplog, model, bern)
        assert not ok and len(msgs) == 1
    assert not _warnings(caplog, cave_tsa, center_crop(real, (256, 256)))[0]


# ----------------------------------------------------------------------------- the camera config group
CONF = __import__("pathlib").Path(__file__).resolve().parents[1] / "conf"


@pytest.mark.parametrize("script", ["train", "evaluate", "reconstruct", "model_card", "fit_camera"])
def test_camera_group_composes_in_every_script(script, shared_data):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    keys = ["camera=tsa_real", "camera.bands=31", "camera.wavelengths=cave", "camera.step=1.5", "camera.axis=h",
            "camera.noise.photons=1000", f"paths.shared_data={shared_data}"]
    need = {"model_card": ["ckpt=x", "name=y"], "fit_camera": ["output_dir=x"], "reconstruct": ["data=shared_cave"]}
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose(script, overrides=[*keys, *need.get(script, [])])
    assert cfg.camera.mask.endswith("tsa_real_mask_660.mat") and cfg.camera.noise.photons == 1000
    if script == "fit_camera":
        return
    assert cfg.bands == 31 and cfg.camera.step == 1.5 and cfg.camera.axis == "h"
    sim = instantiate(cfg.data.simulator if "data" in cfg else cfg.validation.simulator)
    assert (sim.bands, sim.step, sim.axis) == (31, 1.5, "h") and sim.noise.photons == 1000
    assert type(sim.masks).__name__ == "RandomMaskCrops" and type(sim.eval_masks).__name__ == "FixedMask"


def test_per_band_offsets_reach_the_operator_and_the_simulator():
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    offsets = [round(1.2 * c + 0.04 * c * c, 2) for c in range(28)]  # a dispersion that no step gives
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["camera=synthetic", f"camera.offsets={offsets}", "camera.step=null"])
    op = instantiate(cfg.operator)(torch.ones(28, 64, 64))
    sim = instantiate(cfg.data.simulator)
    assert op.offsets == offsets and sim.offsets == offsets and sim.step is None
    # one route: the operator has no geometry of its own that could disagree with the simulator's
    from hydra.errors import ConfigCompositionException
    with initialize_config_dir(str(CONF), version_base="1.3"), pytest.raises(ConfigCompositionException):
        compose("train", overrides=["operator.step=1"])


def test_data_configs_choose_their_camera_and_the_command_line_wins(shared_data):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(CONF), version_base="1.3"):
        plain = compose("train")
        real = compose("train", overrides=["experiment=tsa_real"])
        mine = compose("train", overrides=["experiment=tsa_real", "camera=synthetic"])
    assert plain.camera.masks == "bernoulli" and real.camera.noise.photons == 3413
    assert real.camera.mask.endswith("tsa_real_mask_660.mat") and mine.camera.masks == "bernoulli"
    with initialize_config_dir(str(CONF), version_base="1.3"):  # measurement files read the camera's mask and key
        for data in ("measurements", "real"):
            cfg = compose("reconstruct", overrides=[f"data={data}", "data.predict.entries=m.mat", "camera.mask=c.mat",
                                                    "camera.key=code"])
            assert cfg.data.predict.mask == "c.mat" and cfg.data.predict.mask_key == "code"


@pytest.mark.parametrize("bad, message", [
    ({"masks": "x"}, "camera.masks must be one of"),
    ({"masks": "crops"}, "needs camera.mask"),
    ({"masks": "bernoulli", "wavelengths": [500, 600]}, "camera.wavelengths: wavelengths has 2 values"),
    ({"masks": "bernoulli", "noise": {"photon": 3}}, "unknown keys"),
    ({"masks": "bernoulli", "offsets": [0, 1], "step": None}, "camera.offsets has length 2 but bands=28"),
    ({"masks": "bernoulli", "offsets": list(range(28))}, r"camera.offsets replaces camera.step: give camera.step=null"),
    ({"masks": "mixture"}, "needs camera.mixture"),
    ({"masks": "mixture", "mixture": [{"masks": "crops"}]}, r"camera.mixture\[0\]: camera.masks=crops needs"),
    ({"masks": "bernoulli", "mixture": [{"masks": "bernoulli"}]}, "set camera.masks=mixture"),
    ({"masks": "bernoulli", "fill": [0.6, 0.2]}, r"camera.fill must be in \(0, 1\] or a range"),
])
def test_bad_camera_specs_fail_in_one_line(bad, message):
    from cassi.physics.camera import Camera

    with pytest.raises(ValueError, match=message) as e:
        Camera(**bad)
    assert "\n" not in str(e.value)


def test_camera_checks_the_frame_from_the_mask_header(tmp_path):
    from cassi.io import save_mask
    from cassi.physics.camera import Camera

    save_mask(tmp_path / "m.npy", (torch.rand(40, 50) > 0.5).float())
    cam = Camera(mask=tmp_path / "m.npy", masks="fixed", bands=4, wavelengths=None)
    cam.check((40, 50))
    with pytest.raises(ValueError, match="40×50, smaller than the 64×64 scenes"):
        cam.check((64, 64))
    with pytest.raises(ValueError, match="spread the 28 bands over 54 px along 'w', not less than the 50-px frame"):
        Camera(masks="bernoulli").check((40, 50))
    import scipy.io  # a file of several arrays: the line says which key chooses the mask
    scipy.io.savemat(tmp_path / "two.mat", {"a": torch.ones(40, 50).numpy(), "b": torch.zeros(40, 50).numpy()})
    with pytest.raises(ValueError, match=r"several candidate arrays .* \(here: camera.key=<name>\)"):
        Camera(mask=tmp_path / "two.mat", masks="fixed", bands=4, wavelengths=None).check((40, 50))
    Camera(mask=tmp_path / "two.mat", key="b", masks="fixed", bands=4, wavelengths=None).check((40, 50))
    sim = Camera(masks="blocks", fill=0.3, block=4).simulator()
    m = sim({"x": torch.rand(2, 28, 16, 16)})["mask"]
    assert m.shape == (2, 1, 16, 16) and bool((m[..., ::4, ::4].repeat_interleave(4, -2).repeat_interleave(4, -1) == m).all())


def test_a_mixture_camera_draws_each_sample_from_its_sources_and_its_record_fits_them(tmp_path, caplog):
    from cassi.io import save_mask
    from cassi.physics.camera import Camera

    fixed = (torch.rand(32, 32, generator=torch.Generator().manual_seed(1)) > 0.5).float()
    save_mask(tmp_path / "m.npy", fixed)
    cam = Camera(masks="mixture", bands=4, wavelengths=None, step=1, noise={"photons": [100, 1000]},
                 mixture=[{"mask": str(tmp_path / "m.npy"), "masks": "fixed", "weight": 1},
                          {"masks": "bernoulli", "fill": [0.2, 0.3], "weight": 1}])
    sim = cam.simulator()
    out = sim({"x": torch.rand(64, 4, 32, 32)}, generator=torch.Generator().manual_seed(0))
    is_fixed = (out["mask"] == fixed).flatten(1).all(1)
    fills = out["mask"][~is_fixed].flatten(1).mean(1)
    assert 10 < int(is_fixed.sum()) < 54 and bool(((fills > 0.15) & (fills < 0.35)).all())
    assert fills.std() > 0.01  # the fill factor is drawn per sample, not fixed
    record = describe_camera(sim)
    assert record["masks"]["kind"] == "mixture" and "[100, 1000]" in record["noise"]
    model = torch.nn.Linear(1, 1)
    model.camera = record
    with caplog.at_level(logging.WARNING, logger="cassi.models"):
        assert check_camera(model, CASSI(fixed, bands=4, step=1))
        assert check_camera(model, CASSI((torch.rand(32, 32) < 0.25).float(), bands=4, step=1))
        assert not check_camera(model, CASSI((torch.rand(32, 32) < 0.7).float(), bands=4, step=1))
    assert len(caplog.records) == 1 and "a mixture of the mask" in caplog.records[0].getMessage()


def test_shot_noise_over_a_range_of_photon_counts_draws_one_count_per_sample():
    y = torch.full((256, 1, 8, 8), 0.5)
    noisy = ShotNoise([10, 10000])(y, generator=torch.Generator().manual_seed(0))
    var = ((noisy - y) ** 2).flatten(1).mean(1)  # ≈ 0.5 / photons per sample
    assert var.max() / var.min() > 100 and float(var.max()) < 0.5 / 10 * 2 and float(var.min()) > 0.5 / 10000 / 2
    with pytest.raises(ValueError, match="lo <= hi"):
        ShotNoise([100, 10])
