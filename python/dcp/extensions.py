"""The seed's stream extensions: what FileSystemWriter(_extensions=...) and
FileSystemReader(_extension_registry=...) take.

dcp's engine implements the transforms itself (docs/FORMAT.md section 3.1:
each item's extensions are recorded in the metadata, and a reader fails
naming any it does not know), so these classes only select them:

    writer = dcp.FileSystemWriter(path, _extensions=[dcp.ZStandard(level=3)])

is the same save as ``FileSystemWriter(path, compression="zstd:3")``.
Loads decode every extension the engine knows whatever registry is given;
an ExtensionRegistry takes only the engine's extensions (register() of any
other class raises NotImplementedError: a Python transform cannot run
inside the engine's I/O threads).
"""

from __future__ import annotations

__all__ = ["StreamTransformExtension", "ZStandard", "ExtensionRegistry"]


class StreamTransformExtension:
    """A transform of an item's stored bytes (the seed's base class)."""

    @staticmethod
    def registry_name() -> str:
        raise NotImplementedError

    def get_descriptor(self) -> str:
        """`name/version`, as recorded in the metadata."""
        raise NotImplementedError


class ZStandard(StreamTransformExtension):
    """zstd compression, block by block (the checksum blocks), of host
    tensors over 64 KiB; blocks that do not shrink are stored as they are.
    level: 1-22, or None for the engine's default."""

    def __init__(self, level: int | None = None):
        if level is not None:
            if isinstance(level, bool) or not isinstance(level, int):
                raise TypeError(f"ZStandard: level must be an int or None, "
                                f"not {level!r}")
            if not 1 <= level <= 22:
                raise ValueError(f"ZStandard: level {level} is outside 1-22")
        self.level = level

    @staticmethod
    def registry_name() -> str:
        return "stream.zstd"

    def get_descriptor(self) -> str:
        return "zstd/1.0"

    def _compression(self) -> str:
        return "zstd" if self.level is None else f"zstd:{self.level}"

    def __repr__(self) -> str:
        return f"ZStandard(level={self.level!r})"


class ExtensionRegistry:
    """The extensions a reader decodes: the engine's (ZStandard)."""

    def __init__(self):
        self._classes = {ZStandard.registry_name(): ZStandard}

    def register(self, cls) -> None:
        if cls is ZStandard:
            return
        raise NotImplementedError(
            f"ExtensionRegistry: {getattr(cls, '__name__', cls)!s} cannot be "
            f"registered: dcp decodes only the extensions its engine "
            f"implements ({', '.join(sorted(self._classes))})")

    def names(self) -> list[str]:
        return sorted(self._classes)


def compression_of(extensions) -> str | None:
    """The engine's compression option for FileSystemWriter's _extensions:
    None for none, else the one ZStandard's setting; NotImplementedError
    naming anything else."""
    if not extensions:
        return None
    extensions = list(extensions)
    unknown = [e for e in extensions if not isinstance(e, ZStandard)]
    if unknown:
        raise NotImplementedError(
            f"FileSystemWriter: _extensions {unknown!r} are not supported "
            f"(dcp implements ZStandard)")
    if len(extensions) > 1:
        raise ValueError(
            f"FileSystemWriter: _extensions lists {len(extensions)} "
            f"ZStandard transforms; give one")
    return extensions[0]._compression()
