"""idemctl.frozen: the quick ``__init__`` is the dataclass's own in all it does (signature,
defaults, fresh default factories, keyword-only fields, ``__post_init__``), and the class
stays frozen, hashable and equal by value; every class of the package that uses it is
checked against the ``__init__`` that ``@dataclass(frozen=True)`` makes of it."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from dataclasses import field
from pathlib import Path

import pytest

import idemctl
from idemctl.frozen import frozen
from idemctl.model import ClaimRequest


@frozen
class Sample:
    a: int
    b: str = "b"
    items: list[int] = field(default_factory=list)
    hidden: int = field(default=7, init=False)
    named: int = field(default=0, kw_only=True)

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a < 0")


def test_it_does_what_the_dataclass_init_does() -> None:
    s = Sample(1, named=3)
    assert (s.a, s.b, s.items, s.hidden, s.named) == (1, "b", [], 7, 3)
    assert Sample(1).items is not Sample(1).items  # a fresh list each time
    assert Sample(1, "x", [2]) == Sample(a=1, b="x", items=[2])
    assert hash(ClaimRequest("k", "f")) == hash(ClaimRequest("k", "f"))  # frozen: hashable
    assert dataclasses.replace(s, a=2) == Sample(2, named=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.a = 2  # type: ignore[misc]
    with pytest.raises(ValueError, match="a < 0"):
        Sample(-1)
    with pytest.raises(TypeError):
        Sample(1, "b", [], 3)  # type: ignore[misc]  # named is keyword-only
    with pytest.raises(TypeError):
        Sample()  # type: ignore[call-arg]


def _frozen_classes() -> list[type]:
    """The package's classes whose ``__init__`` idemctl.frozen made, from the modules whose
    source uses ``@frozen``."""
    root = Path(idemctl.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if "\n@frozen\n" not in path.read_text():
            continue
        name = ".".join(("idemctl", *path.relative_to(root).with_suffix("").parts))
        module = importlib.import_module(name)
        for value in vars(module).values():
            code = getattr(getattr(value, "__init__", None), "__code__", None)
            if (
                isinstance(value, type)
                and value.__module__ == name
                and code is not None
                and code.co_filename.startswith("<idemctl.frozen ")
            ):
                found.append(value)
    return found


FROZEN = _frozen_classes()


def test_the_package_uses_it_for_its_model() -> None:
    names = {c.__name__ for c in FROZEN}
    assert {"Record", "Acquired", "ClaimRequest", "Completion", "Context", "Event"} <= names


@pytest.mark.parametrize("cls", FROZEN, ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_each_class_keeps_the_signature_dataclass_gives_it(cls: type) -> None:
    assert dataclasses.is_dataclass(cls)
    assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    ours = inspect.signature(cls.__init__)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    assert list(ours.parameters) == ["self", *(f.name for f in fields)]
    for f in fields:
        p = ours.parameters[f.name]
        assert (p.kind is inspect.Parameter.KEYWORD_ONLY) == f.kw_only
        has_default = f.default is not dataclasses.MISSING
        has_factory = f.default_factory is not dataclasses.MISSING
        assert (p.default is not inspect.Parameter.empty) == (has_default or has_factory)
        if has_default:
            assert p.default is f.default
