"""Training content beyond CAVE (cassi.data.sources, spectra, scenes): measured spectra, generated scenes, the
mixture, fetching. Sources are stood in by small files in pytest's temporary folders (nothing is downloaded)."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from cassi.data import scenes, sources, spectra
from cassi.io.spectral import TSA_WAVELENGTHS

ROOT = Path(__file__).resolve().parents[1]


def test_colour_science_spectra_need_no_fetch_and_cover_the_bands():
    s = spectra.reflectances(TSA_WAVELENGTHS, ("colour",))
    assert s.values.shape == (len(s.names), 28) and len(s) > 400  # ColorCheckers, TCS, CQS, CIE 2017, rawtoaces
    assert float(s.values.min()) >= 0 and float(s.values.max()) <= 1 and set(s.sources) == {"colour"}
    assert any(n.startswith("cie2017/") for n in s.names) and any(n.startswith("rawtoaces190/") for n in s.names)


def test_fetched_sources_are_read_in_their_units(content):
    el = spectra.reflectances([450.0, 600.0], ("earthlib",), root=content)
    assert el.names == ("earthlib/a", "earthlib/b", "earthlib/c")
    assert torch.allclose(el.values[1], torch.tensor([0.1 + 0.8 * 5 / 39, 0.1 + 0.8 * 20 / 39], dtype=torch.float64),
                          atol=1e-6)  # micrometres read as nm
    ptb = spectra.reflectances([450.0, 600.0], ("psychtoolbox",), root=content)
    assert len(ptb) == 9 and torch.allclose(ptb.values, torch.full((9, 2), 0.5, dtype=torch.float64))  # koivisto /4096
    # a band beyond a spectrum's range by more than ``reach`` leaves it out (the stand-in ends at 790 nm)
    assert len(spectra.reflectances([450.0, 795.0], ("earthlib",), root=content, reach=10)) == 3
    with pytest.raises(ValueError, match="no spectrum"):
        spectra.reflectances([450.0, 801.0], ("earthlib",), root=content, reach=10)


def test_a_missing_source_names_the_fetch_command(tmp_path):
    with pytest.raises(sources.ContentMissing, match=r"fetch_content.py sources=\[earthlib\]"):
        spectra.reflectances(TSA_WAVELENGTHS, ("earthlib",), root=tmp_path)
    with pytest.raises(ValueError, match="unknown reflectance sources"):
        spectra.reflectances(TSA_WAVELENGTHS, ("kaist",))


def test_rgb_lookup_matches_the_colour_and_varies_the_spectra():
    wl = spectra._GRID  # the camera's bands = the visible grid: the colour of the result can be checked
    lookup = spectra.RGBToSpectrum(wl, ("colour",))
    rgb = torch.rand(8, 8, 3, generator=torch.Generator().manual_seed(1)) * 0.5 + 0.2
    a = lookup(rgb, lookup.table(torch.Generator().manual_seed(0)))
    back = torch.einsum("jc,chw->hwj", torch.from_numpy(lookup.m).float(), a)
    assert a.shape == (len(wl), 8, 8) and torch.allclose(back, rgb, atol=1e-4)  # the same colour under D65
    b = lookup(rgb, lookup.table(torch.Generator().manual_seed(1)))
    assert (a - b).abs().max() > 0.01  # another table: another metamer
    assert torch.equal(a, lookup(rgb, lookup.table(torch.Generator().manual_seed(0))))


def test_illuminants_are_positive_of_mean_one_and_seeded():
    lights = [spectra.random_illuminant(TSA_WAVELENGTHS, torch.Generator().manual_seed(s)) for s in range(20)]
    for light in lights:
        assert light.shape == (28,) and float(light.min()) >= 0 and abs(float(light.mean()) - 1) < 1e-9
    assert len({round(float(x[0]), 6) for x in lights}) > 10
    assert torch.equal(lights[3], spectra.random_illuminant(TSA_WAVELENGTHS, torch.Generator().manual_seed(3)))


def test_dead_leaves_are_deterministic_cubes_in_range(content, tmp_path):
    d = scenes.DeadLeaves(3, 32, 40, wavelengths="tsa", seed=5, library=("colour", "earthlib"), root=content,
                          shapes=300)
    x = d[1]["x"]
    assert x.shape == (28, 32, 40) and x.dtype == torch.float32 and float(x.min()) >= 0 and float(x.max()) <= 1
    assert torch.equal(x, scenes.DeadLeaves(3, 32, 40, "tsa", 5, ("colour", "earthlib"), content, shapes=300)[1]["x"])
    assert not torch.equal(x, d[2]["x"]) and d[1]["name"] == "leaves_5_1"
    assert float(x.std()) > 0.01  # shapes, not one flat spectrum
    # without the fetched textures (an empty root) the shapes are textured by noise; the colour sets suffice
    bare = scenes.DeadLeaves(1, 16, 16, "tsa", library=("colour",), root=tmp_path, shapes=100)
    assert bare[0]["x"].shape == (28, 16, 16)
    with pytest.raises(IndexError):
        d[3]
    with pytest.raises(ValueError, match="radius"):
        scenes.DeadLeaves(1, 16, 16, "tsa", library=("colour",), radius=(4, 2))


def test_photo_scenes_hold_back_photographs_and_name_them(content):
    p = scenes.PhotoScenes(4, 24, 24, "tsa", seed=1, exclude=["coffee.png"], library=("colour",), root=content,
                           zoom=0.5)
    assert sorted(f.name for f in p.files) == ["Garden.jpg", "LadyBird.jpg", "Wood.jpg", "astronaut.png", "chelsea.png"]
    items = [p[i] for i in range(4)]
    assert all(i["x"].shape == (28, 24, 24) and 0 <= float(i["x"].min()) and float(i["x"].max()) <= 1 for i in items)
    assert not any("coffee" in i["name"] for i in items)
    only = scenes.PhotoScenes(1, 24, 24, "tsa", photos=["coffee"], library=("colour",), root=content)
    assert only[0]["name"].startswith("photo_coffee_")
    with pytest.raises(ValueError, match="not among"):
        scenes.PhotoScenes(1, 24, 24, "tsa", photos=["kaist.png"], library=("colour",), root=content)
    with pytest.raises(sources.ContentMissing, match=r"skimage.*fetch_content.py sources=\[skimage\]"):
        scenes.PhotoScenes(1, 24, 24, "tsa", library=("colour",), root=content / "nowhere")


def test_mixture_draws_by_weight_and_describes_itself_stably(content):
    a = scenes.DeadLeaves(2, 16, 16, "tsa", seed=0, library=("colour",), root=content, shapes=100)

    class Refuses(torch.utils.data.Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            raise AssertionError("a source of weight 0 was read")

    m = scenes.Mixture({"leaves": a, "never": Refuses()}, weights=[1, 0], samples_per_epoch=6, seed=2)
    names = [m[i]["name"] for i in range(6)]
    assert all(n.startswith("0:leaves_0_") for n in names)
    assert torch.equal(m[4]["x"], m[4]["x"]) and names == [m[i]["name"] for i in range(6)]
    assert "0x" not in repr(scenes.Mixture([a], samples_per_epoch=2))  # a cache key: no object addresses
    with pytest.raises(ValueError, match="weights"):
        scenes.Mixture([a, a], weights=[1])


def test_a_mixtures_pool_is_keyed_by_its_sources_settings_not_their_addresses(content, tmp_path):
    """The cache key of a pool over a mixture with a CubeFiles source (which has no repr of its own) is the same for
    two separately built mixtures (as in two processes: a stopped pool continues, a second run reuses it) and
    differs when a source's setting does."""
    from cassi.data import FirstIterates
    from cassi.data.datasets import CubeFiles
    from cassi.io import save_cube
    from cassi.physics.simulate import BernoulliMasks, Simulator

    save_cube(cube := tmp_path / "c.h5", np.random.default_rng(0).random((28, 20, 20), np.float32))

    def key(relight=0.5):
        mix = scenes.Mixture([CubeFiles([cube], relight=relight), scenes.DeadLeaves(
            2, 16, 16, "tsa", seed=0, library=("colour",), root=content, shapes=50)], samples_per_epoch=2)
        return FirstIterates(mix, Simulator(BernoulliMasks(0.5), bands=28, step=2), None, patch_size=8)._key()

    assert key() == key() and "0x" not in json.dumps(key())
    assert key() != key(relight=0.25)


def test_fetch_keeps_going_past_a_failing_source_and_leaves_nothing_half_written(tmp_path, monkeypatch):
    def works(src, tmp, out):
        for m in src.members:
            if "*" not in m and "LICENSE" not in m:
                (out / Path(m).name).write_bytes(b"data")
        return "pkg.whl"

    def fails(src, tmp, out):
        (out / "partial.bin").write_bytes(b"x")
        raise RuntimeError("no network")

    monkeypatch.setattr(sources, "_unpack_wheel", lambda src, tmp, out: (works if src.name == "skimage" else fails)(
        src, tmp, out))
    logs = []
    with pytest.raises(RuntimeError, match="earthlib: no network"):
        sources.fetch(["earthlib", "skimage"], root=tmp_path, log=logs.append)
    record = json.loads((tmp_path / "skimage" / "SOURCE.json").read_text())
    assert record["package"].startswith("scikit-image") and record["licences"]["coffee.png"].startswith("CC0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["skimage"]  # no earthlib folder, no temporary left
    assert any("FAILED" in line for line in logs)
    with pytest.raises(ValueError, match="unknown content sources"):
        sources.fetch(["kaist"], root=tmp_path)


def test_a_tiny_training_on_the_mixture(content, tmp_path, shared_data):
    """data=content_refine composes in train.py: GAP-TV over a mixture of CAVE crops, dead leaves and photographs,
    then two training steps of a Refiner on windows of them."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cassi_train_script", ROOT / "scripts" / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    small = [f"data.train.cubes.sources.{s}.{k}=32" for s in ("leaves", "photos") for k in ("height", "width")]
    val = [f"data.val.parts.{s}.{k}" for s in ("leaves", "photos") for k in ("height=32", "width=32", "n=1",
                                                                               "library=[colour]")]
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[
            "experiment=tiny_cpu", "data=content_refine", "model.width=4", "model.depth=2", "model.solver.iters=5",
            "data.train.cubes.samples_per_epoch=3", "data.train.cubes.sources.cave.patch_size=32", *small,
            "data.train.cubes.sources.leaves.library=[colour]", "data.train.cubes.sources.leaves.shapes=100", "data.train.cubes.sources.photos.library=[colour]",
            "data.train.patch_size=16", "data.val.parts.cave.crop_to=32", *val,
            "trainer.fast_dev_run=2", "data.batch_size=2", "callbacks.progress=null", "test=false",
            f"paths.content={content}", f"paths.shared_data={shared_data}", f"paths.output_dir={tmp_path}"])
    value = train.main(cfg)
    assert np.isfinite(value)
    names = torch.load(tmp_path / "first_iterates.pt", weights_only=False)["names"]
    assert len(names) == 3 and all(n.split(":")[0] in "012" for n in names)  # the mixture's scenes, by source
    # validation: CAVE's two scenes (four quadrants each), then held-back dead leaves and photographs
    datamodule = instantiate(cfg.data)
    val = [datamodule.datasets["val"][i]["name"] for i in range(len(datamodule.datasets["val"]))]
    assert len(val) == 10 and val[0].startswith("cave_sponges_y0x0") and val[8].startswith("leaves_2000000")
    assert val[9].startswith(("photo_chelsea_2000000", "photo_Garden_2000000"))
    assert datamodule.datasets["train"].cubes.sources[2].files == [content / "skimage" / "astronaut.png"]


def test_fetch_into_a_relative_root_hands_the_unpackers_absolute_folders(tmp_path, monkeypatch):
    """pip and apt-get run with the temporary folder as their working directory: a relative root doubled there."""
    seen = []

    def unpack(src, tmp, out):
        seen.append(tmp)
        for m in src.members:
            if "*" not in m and "LICENSE" not in m:
                (out / Path(m).name).write_bytes(b"data")
        return "pkg.whl"

    monkeypatch.setattr(sources, "_unpack_wheel", unpack)
    monkeypatch.chdir(tmp_path)
    done = sources.fetch(["skimage"], root="data/content", log=lambda line: None)
    assert seen and all(p.is_absolute() for p in seen)
    assert done["skimage"] == tmp_path / "data" / "content" / "skimage"
    assert (done["skimage"] / "SOURCE.json").is_file()
