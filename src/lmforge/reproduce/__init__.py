"""Miniature reproductions, one module per paper, each returning a :class:`ClaimResult`."""

from lmforge.reproduce.base import REPRODUCTIONS, ClaimResult, Figure, Table, get, register_reproduction

__all__ = ["REPRODUCTIONS", "ClaimResult", "Figure", "Table", "get", "register_reproduction"]
