"""Lay a pack_cave.py file out for both trainers (on the GPU machine):

    python benchmarks/gpu_zoo/prepare.py <pack>.npz <mask_256.mat> <root>

<root>/data/cave_kaist/{train/sceneNN.mat (img_expand, uint16), val/sceneNN.mat (img, float32), mask_256.mat}
(cassi's conf/data/cave_kaist.yaml layout) and the MST toolbox's layout over the same files:
<root>/tb/{cave_1024_28 -> train, TSA_simu_data/{mask.mat, mask_3d_shift.mat, Truth -> val}}.
"""
import shutil
import sys
from pathlib import Path

import numpy as np
import scipy.io as sio

sys.path.insert(0, str(Path(__file__).parent))
from pack_cave import unpack  # noqa: E402


def main(pack, mask_file, root):
    root = Path(root)
    kaist = root / "data" / "cave_kaist"
    for d in ("train", "val"):
        (kaist / d).mkdir(parents=True, exist_ok=True)
    scenes = unpack(pack)
    n = {"train": 0, "val": 0}
    for key in sorted(scenes):
        split = key.split("/")[0]
        n[split] += 1
        if split == "train":
            sio.savemat(kaist / "train" / f"scene{n[split]:02d}.mat",
                        {"img_expand": np.round(scenes[key] * 65535).astype(np.uint16)})
        else:
            sio.savemat(kaist / "val" / f"scene{n[split]:02d}.mat", {"img": scenes[key]})
    shutil.copy(mask_file, kaist / "mask_256.mat")
    mask = sio.loadmat(mask_file)["mask"].astype(np.float32)
    tsa = root / "tb" / "TSA_simu_data"
    tsa.mkdir(parents=True, exist_ok=True)
    sio.savemat(tsa / "mask.mat", {"mask": mask})
    h, w = mask.shape
    shifted = np.zeros((h, w + 2 * 27, 28), np.float32)
    for c in range(28):
        shifted[:, 2 * c:2 * c + w, c] = mask
    sio.savemat(tsa / "mask_3d_shift.mat", {"mask_3d_shift": shifted})
    for link, target in ((root / "tb" / "cave_1024_28", kaist / "train"), (tsa / "Truth", kaist / "val")):
        if not link.exists():
            link.symlink_to(target.resolve(), target_is_directory=True)
    print(f"{root}: {n['train']} training scenes, {n['val']} validation crops")


if __name__ == "__main__":
    main(*sys.argv[1:4])
