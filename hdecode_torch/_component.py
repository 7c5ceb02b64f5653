"""What metrics and decoders share: the hierarchy they work on, their parameters and their label."""

from __future__ import annotations

__all__ = ["HierarchyComponent"]


class HierarchyComponent:
    """Holds a checked :class:`~hdecode_torch.Hierarchy` and names itself with its parameters."""

    name: str = ""
    description: str = ""

    def __init__(self, hierarchy, *, validate: bool = True):
        from .hierarchy import Hierarchy

        if not isinstance(hierarchy, Hierarchy):
            raise TypeError(f"Expected `hierarchy` to be a Hierarchy, but got {type(hierarchy).__name__}")
        self.hierarchy = hierarchy
        self.validate = validate

    @property
    def params(self) -> dict:
        return {}

    @property
    def key(self) -> str:
        """``name[param=value,...]``, the label used in tables, logs and JSON."""
        if not self.params:
            return self.name
        return f"{self.name}[{','.join(f'{k}={v:g}' for k, v in self.params.items())}]"

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({self.hierarchy!r}{args})"
