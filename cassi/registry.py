"""The classes a file may name: checkpoints, the solver inside a Refiner's checkpoint, model conversions.

A checkpoint names its model's class ({"_target_": name, **arguments}); that name is looked up here and nowhere
else, so a file from elsewhere can only choose among classes that code has registered — never import a module
or build an arbitrary class. cassi's models and solvers register themselves; to load checkpoints of a class of
your own, register it in code before loading::

    import cassi

    @cassi.register
    class MyNet(torch.nn.Module): ...

A class is found by its short name ("GAPTV"), its defining path ("cassi.solvers.pnp.GAPTV") or its package path
("cassi.solvers.GAPTV"). Hydra configs (your own files) still instantiate any ``_target_``: only file contents
are held to the registry. Standard library only.
"""
from __future__ import annotations

__all__ = ["register", "resolve", "registered"]

_CLASSES: dict[str, type] = {}


def _names(cls: type, name: str | None) -> set[str]:
    module = cls.__module__
    names = {name or cls.__name__, f"{module}.{cls.__qualname__}"}
    parts = module.split(".")
    if len(parts) > 2:  # the package's public path, e.g. cassi.solvers.GAPTV for cassi.solvers.pnp.GAPTV
        names.add(f"{'.'.join(parts[:2])}.{cls.__qualname__}")
    return names


def register(cls: type | None = None, *, name: str | None = None):
    """Make ``cls`` loadable from files, under its short name (or ``name``) and its module paths. Use as a
    decorator (``@register``, ``@register(name="mine")``) or a call (``register(MyNet)``); returns the class.
    ValueError when a name is already taken by another class."""

    def add(c: type) -> type:
        if not isinstance(c, type):
            raise TypeError(f"register() takes a class, got {c!r}")
        keys = _names(c, name)
        for key in keys:
            other = _CLASSES.get(key)
            if other is not None and other is not c:
                raise ValueError(f"cannot register {c.__module__}.{c.__qualname__} as {key!r}: "
                                 f"{other.__module__}.{other.__qualname__} has that name")
        _CLASSES.update(dict.fromkeys(keys, c))
        return c

    return add if cls is None else add(cls)


def resolve(name, base: type, what: str = "class") -> type:
    """The registered class called ``name``, a subclass of ``base``; ValueError naming ``what`` (e.g. "model
    class") otherwise. Nothing is imported: an unknown name is refused as it is."""
    cls = _CLASSES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"{what} {name!r} is not a registered cassi class (files may only name registered "
                         f"classes; register your own with cassi.register(cls) before loading)")
    if not issubclass(cls, base):
        raise ValueError(f"{what} {name!r} is {cls.__module__}.{cls.__qualname__}, not a {base.__name__}")
    return cls


def registered(base: type = object) -> list[str]:
    """The short names of the registered subclasses of ``base``, sorted."""
    return sorted(n for n, c in _CLASSES.items() if "." not in n and issubclass(c, base))
