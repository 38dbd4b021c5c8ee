"""Carry ../shared/data's training scenes, masks and test crops to a GPU machine that cannot see them (a call carries at most
64 MiB), and lay them out there as cassi reads them (CASSI_SHARED_DATA):

    python benchmarks/gpu_fit/pack_shared.py pack <shared>/data <out>.npz      # here
    python benchmarks/gpu_fit/pack_shared.py unpack <out>.npz <dir>            # there: <dir>/cave_train/*.h5, masks/, cave/

Each CAVE scene (31, 512, 512) uint16 is stored as 8 bits of its own maximum (lzma), so the scenes there differ from
the originals by that rounding (at most half a step of max/255); the masks and the 3 test crops (cave/, 4 MB) are
carried as they are.
"""
import lzma
import sys
from pathlib import Path

import h5py
import numpy as np

MASKS = ("tsa_simu_mask_256.mat", "tsa_real_mask_660.mat")


def pack(shared: Path, out: Path) -> None:
    blob = {}
    for path in sorted((shared / "cave_train").glob("cave_*.h5")):
        with h5py.File(path, "r") as f:
            cube = f["cube"][:]
            attrs = dict(f["cube"].attrs)
        peak = int(cube.max())
        q = np.round(cube.astype(np.float64) * (255 / peak)).astype(np.uint8)
        d = np.diff(q, axis=0, prepend=np.uint8(0))  # band by band (mod 256): a quarter smaller once compressed
        blob[f"scene/{path.stem}"] = np.frombuffer(lzma.compress(d.tobytes(), preset=6), np.uint8)
        blob[f"meta/{path.stem}"] = np.array([peak, *q.shape], np.int64)
        blob[f"wl/{path.stem}"] = np.asarray(attrs["wavelengths"], np.float64)
    for name in MASKS:
        blob[f"mask/{name}"] = np.frombuffer((shared / "masks" / name).read_bytes(), np.uint8)
    for path in sorted((shared / "cave").glob("*.mat")):
        blob[f"crop/{path.name}"] = np.frombuffer(path.read_bytes(), np.uint8)
    np.savez(out, **blob)
    print(f"{out}: {sum(k.startswith('scene/') for k in blob)} scenes, {out.stat().st_size / 2**20:.1f} MiB")


def unpack(pack_file: Path, root: Path) -> None:
    z = np.load(pack_file)
    (root / "cave_train").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    (root / "cave").mkdir(parents=True, exist_ok=True)
    for k in z.files:
        kind, name = k.split("/", 1)
        if kind == "scene":
            peak, *shape = (int(v) for v in z[f"meta/{name}"])
            q = np.cumsum(np.frombuffer(lzma.decompress(z[k].tobytes()), np.uint8).reshape(shape), axis=0, dtype=np.uint8)
            cube = np.round(q.astype(np.float64) * (peak / 255)).astype(np.uint16)
            with h5py.File(root / "cave_train" / f"{name}.h5", "w") as f:
                d = f.create_dataset("cube", data=cube)
                d.attrs.update(wavelengths=z[f"wl/{name}"], layout="chw", bit_depth=16)
        elif kind in ("mask", "crop"):
            (root / ("masks" if kind == "mask" else "cave") / name).write_bytes(z[k].tobytes())
    print(f"{root}: {len(list((root / 'cave_train').glob('*.h5')))} scenes, {len(list((root / 'cave').glob('*.mat')))} "
          f"test crops, masks {sorted(p.name for p in (root / 'masks').iterdir())}")


if __name__ == "__main__":
    {"pack": pack, "unpack": unpack}[sys.argv[1]](Path(sys.argv[2]), Path(sys.argv[3]))
