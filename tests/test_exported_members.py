"""The public facade stays complete and sorted."""

import helix_transport


def test_all_is_sorted_and_importable() -> None:
    names = helix_transport.__all__
    assert names == sorted(names, key=lambda n: (n[0].islower(), n))
    for name in names:
        assert getattr(helix_transport, name) is not None


def test_every_public_member_is_exported() -> None:
    public = {
        name
        for name, value in vars(helix_transport).items()
        if not name.startswith("_")
        and getattr(value, "__module__", "").startswith("helix_transport")
    }
    assert public <= set(helix_transport.__all__)
