"""Pack CAVE scenes for a GPU machine that cannot see ../shared (a call carries at most 64 MiB).

    python benchmarks/gpu_zoo/pack_cave.py <shared>/data/cave_train <out>.npz [--val a,b,c]

Each scene (31, 512, 512) uint16 is resampled to the 28 TSA wavelengths (linear), scaled by its own maximum and
stored as 8 bits (lzma), with that maximum. The validation scenes are stored as 256² quadrants (10 of them, as the
toolbox's test loader wants); the rest whole, for training. unpack() returns float32 arrays (H, W, 28) in [0, 1].
"""
import argparse
import lzma
from pathlib import Path

import h5py
import numpy as np

TSA = np.array([453.3, 457.6, 462.1, 466.8, 471.6, 476.5, 481.6, 486.9, 492.4, 498.0, 503.9, 509.9, 516.2, 522.7,
                529.5, 536.5, 543.8, 551.4, 558.6, 567.5, 575.3, 584.3, 594.4, 604.2, 614.4, 625.1, 636.3, 648.1])
VAL = "fake_and_real_peppers,stuffed_toys,watercolors"


def _scene(path: Path) -> np.ndarray:
    with h5py.File(path, "r") as f:
        cube = f["cube"][:].astype(np.float32) / 65535.0
        wl = np.asarray(f["cube"].attrs["wavelengths"], dtype=float)
    i = np.clip(np.searchsorted(wl, TSA) - 1, 0, len(wl) - 2)
    t = ((TSA - wl[i]) / (wl[i + 1] - wl[i])).astype(np.float32)[:, None, None]
    return np.transpose(cube[i] * (1 - t) + cube[i + 1] * t, (1, 2, 0))  # (H, W, 28)


def pack(src: Path, out: Path, val: list[str]) -> None:
    arrays = {}
    for path in sorted(src.glob("cave_*.h5")):
        name = path.stem[len("cave_"):]
        hwc = _scene(path)
        peak = float(hwc.max())
        q = np.round(hwc / peak * 255).astype(np.uint8)
        if name in val:
            for k, (r, c) in enumerate([(0, 0), (0, 256), (256, 0), (256, 256)]):
                arrays[f"val/{name}_{k}"] = (q[r:r + 256, c:c + 256], peak)
        else:
            arrays[f"train/{name}"] = (q, peak)
    val_keys = sorted(k for k in arrays if k.startswith("val/"))[:10]
    arrays = {k: v for k, v in arrays.items() if k.startswith("train/") or k in val_keys}
    blob = {k: np.frombuffer(lzma.compress(np.ascontiguousarray(q).tobytes(), preset=6), np.uint8)
            for k, (q, _) in arrays.items()}
    blob.update({k + ":meta": np.array([p, *q.shape], dtype=np.float64) for k, (q, p) in arrays.items()})
    np.savez(out, **blob)
    print(f"{out}: {sum(k.startswith('train/') for k in arrays)} training scenes, {len(val_keys)} validation "
          f"crops, {out.stat().st_size / 2**20:.1f} MiB")


def unpack(path) -> dict[str, np.ndarray]:
    """{'train/<scene>' | 'val/<scene>_<k>': float32 (H, W, 28) in [0, 1]} from a pack()ed file."""
    z = np.load(path)
    out = {}
    for k in z.files:
        if k.endswith(":meta"):
            continue
        peak, *shape = z[k + ":meta"]
        q = np.frombuffer(lzma.decompress(z[k].tobytes()), np.uint8).reshape([int(s) for s in shape])
        out[k] = q.astype(np.float32) * np.float32(peak / 255)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--val", default=VAL)
    a = ap.parse_args()
    pack(a.src, a.out, a.val.split(","))
