"""The settings tables of docs/FORMATS.md ("The job config"), written from the config itself:
`run`'s settings, and the planning commands' own (`planning.py`). `python -m
octopipe.config.docs` prints both; tests/test_config.py holds the docs to them."""

from __future__ import annotations

from octopipe.config.fields import Setting
from octopipe.config.job import all_settings

BEGIN = "<!-- settings table: python -m octopipe.config.docs -->"
END = "<!-- end of settings table -->"
PLANNING_BEGIN = "<!-- planning settings table: python -m octopipe.config.docs -->"
PLANNING_END = "<!-- end of planning settings table -->"


def settings_table(settings: list[Setting] | None = None) -> str:
    """One row per setting (default: `run`'s): the job file's key, the flag, `octopipe.run`'s
    keyword, the default, the values it takes, and what it does."""
    rows = [
        "| key | flag | keyword | default | values | what it does |",
        "|---|---|---|---|---|---|",
    ]
    for s in all_settings() if settings is None else settings:
        default = (
            ""
            if s.default is None
            else f"`{str(s.default).lower() if s.kind is bool else s.default}`"
        )
        flag = f"`{s.spec.flag}`" if s.spec.flag else ""
        values = s.bounds_text() or {bool: "true, false", str: "text"}.get(s.kind, "")
        doc = s.spec.doc.replace("|", "\\|")
        rows.append(f"| `{s.key}` | {flag} | `{s.keyword}` | {default} | {values} | {doc} |")
    return "\n".join(rows)


def documented() -> str:
    """The table as it stands between its markers in docs/FORMATS.md."""
    return f"{BEGIN}\n{settings_table()}\n{END}"


def planning_documented() -> str:
    """The planning commands' own settings' table, between its markers in docs/FORMATS.md."""
    from octopipe.config.planning import planning_settings

    return f"{PLANNING_BEGIN}\n{settings_table(planning_settings())}\n{PLANNING_END}"


if __name__ == "__main__":
    print(documented())
    print()
    print(planning_documented())
