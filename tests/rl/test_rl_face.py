"""``rlvr.rl``, the loop library's public face: every name in its ``__all__`` resolves, on first use, to the object
defined in the module the face names for it (no name reaches the face second-hand through another module's
re-export), and a name it does not have is an AttributeError that names it."""

import importlib

import pytest

import rlvr.rl as face


def test_the_face_lists_what_it_resolves():
    assert face.__all__ == sorted(face.__all__) == sorted(face._HOMES)


@pytest.mark.parametrize("name", face.__all__)
def test_each_name_is_its_home_modules_own(name):
    home = importlib.import_module(f"rlvr.rl.{face._HOMES[name]}")
    value = getattr(face, name)
    assert value is getattr(home, name)
    assert value.__module__ == home.__name__, f"{name} is defined in {value.__module__}, not {home.__name__}"


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="'rlvr.rl' has no attribute 'LoopConfg'"):
        face.LoopConfg  # noqa: B018
