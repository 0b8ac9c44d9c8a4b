"""Files shipped beside the code: ``lua/`` scripts and ``schemas/``.

In the repository they sit at the top level; in an installed wheel, inside the package.
Both layouts are found here, so an editable install and a wheel behave the same.
"""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Literal

Kind = Literal["lua", "schemas"]


def resource_dir(kind: Kind) -> Traversable:
    packaged = files("idemctl").joinpath(kind)
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[1] / kind
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"idemctl's {kind}/ folder is missing from this installation")


def read_resource(kind: Kind, name: str) -> str:
    return resource_dir(kind).joinpath(name).read_text(encoding="utf-8")
