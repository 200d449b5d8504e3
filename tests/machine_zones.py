"""Time zone files as another machine has them, in process: a directory put first on ``zoneinfo.TZPATH``
naming keys that differ between machines ("localtime" is the machine's own zone, a link to
/etc/localtime on Debian; "posixrules" the zone its POSIX TZ strings follow), each a copy of an IANA
zone's file. Every test can then say which zone "localtime" is, whatever this machine's setting."""

from __future__ import annotations

import contextlib
import shutil
import zoneinfo
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from weft_django import validation


def _zone_file(name: str, path: tuple[str, ...]) -> Path:
    for root in path:
        candidate = Path(root, name)
        if candidate.is_file():
            return candidate
    pytest.skip(f"no time zone file for {name} on {path}")


def _use(path: tuple[str, ...], keys: list[str]) -> None:
    zoneinfo.reset_tzpath(path)
    zoneinfo.ZoneInfo.clear_cache(only_keys=keys)  # only these: other tests keep their zone objects
    validation.portable_zone.cache_clear()
    validation._zone_names.cache_clear()


@contextlib.contextmanager
def machine_zones(
    root: Path, zones: Mapping[str, str], *, only: bool = False, forget: tuple[str, ...] = ()
) -> Iterator[None]:
    """Within the block, each key of ``zones`` (e.g. "localtime") is a copy of the named IANA zone's file;
    ``only``: no other zone loads (a machine without the system's database); ``forget``: other keys whose
    cached zones are dropped on the way in and out (loaded here before the block)."""
    original = tuple(zoneinfo.TZPATH)
    for key, name in zones.items():
        target = root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_zone_file(name, original), target)
    keys = [*zones, *forget]
    _use((str(root),) if only else (str(root), *original), keys)
    try:
        yield
    finally:
        _use(original, keys)
