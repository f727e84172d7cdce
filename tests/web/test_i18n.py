"""The Chinese catalogue: complete, in step with the source, placeholders intact."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from babel.messages.extract import extract_from_dir
from babel.messages.pofile import read_po

from deerflow_web.web.i18n import load_catalogues

ROOT = Path(__file__).resolve().parents[2]
TRANSLATIONS = ROOT / "translations"
PO_FILE = TRANSLATIONS / "zh_Hans" / "LC_MESSAGES" / "messages.po"
PLACEHOLDER = re.compile(r"%\(\w+\)[sd]|\{\w+\}")


@pytest.fixture(scope="module")
def catalog():
    with open(PO_FILE, "rb") as handle:
        return read_po(handle)


def source_messages() -> set[str]:
    """Every message the code and templates ask to translate (babel.cfg's extraction)."""
    method_map = [("deerflow_web/web/**.py", "python"), ("templates/**.html", "jinja2")]
    keywords = {"_": None, "gettext": None, "ngettext": (1, 2), "_l": None, "lazy_gettext": None}
    found = set()
    for _filename, _lineno, message, _comments, _context in extract_from_dir(
        str(ROOT), method_map, keywords=keywords
    ):
        found.add(message[0] if isinstance(message, tuple) else message)
    return found


def test_every_source_message_is_in_the_catalogue(catalog) -> None:
    in_catalog = {m.id[0] if isinstance(m.id, tuple) else m.id for m in catalog if m.id}
    missing = source_messages() - in_catalog
    assert not missing, f"run pybabel extract/update (see babel.cfg): {sorted(missing)}"


def test_every_message_is_translated_with_the_same_placeholders(catalog) -> None:
    for message in catalog:
        if not message.id:
            continue
        assert not message.fuzzy, message.id
        source = message.id if isinstance(message.id, str) else " ".join(message.id)
        target = message.string if isinstance(message.string, str) else message.string[0]
        assert target, f"untranslated: {source!r}"
        assert sorted(set(PLACEHOLDER.findall(source))) == sorted(
            set(PLACEHOLDER.findall(target))
        ), source


def test_catalogues_compile_in_memory() -> None:
    catalogues = load_catalogues(TRANSLATIONS)
    assert set(catalogues) == {"zh_Hans"}
    assert catalogues["zh_Hans"].gettext("New thread") == "新建会话"
    assert not list(TRANSLATIONS.rglob("*.mo"))  # nothing generated is kept in the tree
