"""Configuration of <Method name>."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param


@dataclass
class NameConfig(BaseConfig):
    """<Method name>.

    Args:
        alpha (`float`, defaults to 0.5): <what it is> (paper: 0.5, Sec. 4.1).
    """

    alpha: float = param(0.5, "<what it is>", paper="0.5 (Sec. 4.1)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("alpha", self.alpha, 0.0, 1.0)
