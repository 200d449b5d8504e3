"""The docs say what the code does (issue 20: ranges, pages, log lines and definitions a new user
checked against the real thing)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = ROOT / "weft_django"


def _read(relative: str) -> str:
    return (ROOT / relative).read_text(encoding="utf-8")


def _check_ids(letter: str) -> list[int]:
    found: set[int] = set()
    for path in CODE.rglob("*.py"):
        # weft.E012 in checks, or "E002" given to conf's reporter (which adds "weft.")
        found.update(
            int(n) for n in re.findall(rf"(?:\bweft\.|\"){letter}(\d{{3}})\b", path.read_text(encoding="utf-8"))
        )
    return sorted(found)


def test_the_readme_names_every_system_check() -> None:
    readme = _read("README.md")
    errors, warnings = _check_ids("E"), _check_ids("W")
    assert errors == list(range(1, len(errors) + 1)), errors
    match = re.search(r"`weft\.E001`[–-]`E(\d{3})`, `W001`[–-]`W(\d{3})`", readme)
    assert match is not None, "README's Status no longer gives the check ranges"
    assert int(match.group(1)) == errors[-1], f"README says E001-E{match.group(1)}; the code has E{errors[-1]:03d}"
    assert int(match.group(2)) == warnings[-1]


def test_the_index_does_not_call_the_admins_schedules_page_unbuilt() -> None:
    assert (CODE / "templates/admin/weft_django/schedule/change_form.html").exists()
    assert "ScheduleAdmin" in "".join(p.read_text(encoding="utf-8") for p in (CODE / "admin").glob("*.py"))
    index = _read("docs/index.md")
    not_built = index[index.index("Not built yet") :].split("\n\n")[0]
    assert "schedule" not in not_built.lower(), not_built


def test_the_takeover_log_line_in_operations_md_is_the_real_one() -> None:
    engine = "".join(path.read_text(encoding="utf-8") for path in (CODE / "engine").glob("*.py"))
    formats = set(re.findall(r'"(took over workflow=[^"]*)"', engine))
    assert formats, "the engine no longer logs 'took over workflow='"
    operations = _read("docs/operations.md")
    documented = re.search(r"The survivors log `(took over workflow=[^`]*)`", operations)
    assert documented is not None
    as_format = re.sub(r"<[^>]+>", "%s", documented.group(1))
    assert as_format in formats, f"docs: {documented.group(1)!r}; code: {sorted(formats)}"


def _intro(relative: str) -> str:
    text = _read(relative)
    body = text.split("\n", 1)[1]
    return re.split(r"\n(?:##|```)", body, maxsplit=1)[0]


def test_settings_and_concepts_say_what_weft_is() -> None:
    for page in ("docs/settings.md", "docs/concepts.md"):
        intro = _intro(page)
        assert "durable workflow" in intro.lower(), f"{page} does not say what weft is: {intro!r}"
        assert re.search(r"\bweft\b", intro), page
        assert "weft_django" in intro or "weft-django" in intro, page
