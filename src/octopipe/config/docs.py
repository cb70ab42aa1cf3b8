"""The settings table of docs/FORMATS.md ("The job config"), written from the config itself:
`python -m octopipe.config.docs` prints it; tests/test_config.py holds the docs to it."""

from __future__ import annotations

from octopipe.config.job import all_settings

BEGIN = "<!-- settings table: python -m octopipe.config.docs -->"
END = "<!-- end of settings table -->"


def settings_table() -> str:
    """One row per setting: the job file's key, `run`'s flag, `octopipe.run`'s keyword, the
    default, the values it takes, and what it does."""
    rows = [
        "| key | flag | keyword | default | values | what it does |",
        "|---|---|---|---|---|---|",
    ]
    for s in all_settings():
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


if __name__ == "__main__":
    print(documented())
