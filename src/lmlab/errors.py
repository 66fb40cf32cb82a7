"""Exceptions that carry a one-line message for the user (importable without torch)."""

from __future__ import annotations


class LmlabError(Exception):
    """Base class; `str()` is a single line naming the bad value and what was expected."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else type(self).__name__


class UsageError(LmlabError):
    """Bad command-line input (exit code 2)."""


class ModelNotFoundError(LmlabError, FileNotFoundError):
    """A model spec that names nothing loadable: unknown alias, missing package, missing file."""


class CorruptModelError(ModelNotFoundError):
    """A model file that exists but is truncated or corrupt (a GGUF cut short, a safetensors with a bad header)."""


class OutputError(LmlabError, OSError):
    """Results or a cache could not be written (disk full, a path under a file, no permission); exit code 1.

    Whatever was written before stays intact: writes go to a temporary name and are renamed into place.
    """
