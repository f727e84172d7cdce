"""English and Simplified Chinese through Flask-Babel, chosen per request.

The language comes from, in order: a `lang` query parameter, the `lang` cookie the
language switch sets, then the browser's `Accept-Language`. Catalogues are compiled from
the `.po` files in memory when the app starts (Babel's own compiler), so the repository
holds no generated `.mo` files and no build step can be forgotten.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po
from babel.support import NullTranslations
from babel.support import Translations
from flask import Flask
from flask import request
from flask_babel import Babel
from flask_babel import Domain
from flask_babel import get_locale

LANG_COOKIE = "lang"
DEFAULT_LANGUAGE = "en"


@dataclass(frozen=True)
class Language:
    """A language the UI is offered in."""

    code: str  # what the cookie, the query parameter and Accept-Language matching use
    locale: str  # Babel's locale identifier, also the folder under translations/
    html_lang: str  # the BCP 47 tag for <html lang>
    label: str  # the language's own name, as the switch shows it


LANGUAGES = {
    "en": Language("en", "en", "en", "English"),
    "zh": Language("zh", "zh_Hans", "zh-Hans", "简体中文"),
}
_BY_LOCALE = {language.locale: language for language in LANGUAGES.values()}


def select_language() -> str:
    """The language code for this request (query parameter > cookie > Accept-Language)."""
    for candidate in (request.args.get("lang"), request.cookies.get(LANG_COOKIE)):
        if candidate in LANGUAGES:
            return candidate
    return request.accept_languages.best_match(list(LANGUAGES), default=DEFAULT_LANGUAGE)


def select_locale() -> str:
    """Flask-Babel's locale selector."""
    return LANGUAGES[select_language()].locale


def current_language() -> Language:
    """The language the current page is rendered in."""
    return _BY_LOCALE.get(str(get_locale()), LANGUAGES[DEFAULT_LANGUAGE])


@functools.cache
def _compile(po_path: Path, mtime_ns: int) -> Translations:
    """Compile one `.po` file to an in-memory catalogue (cached per file version)."""
    with open(po_path, "rb") as handle:
        catalog = read_po(handle)
    buffer = BytesIO()
    write_mo(buffer, catalog)  # fuzzy entries are left out, as pybabel compile does
    buffer.seek(0)
    return Translations(buffer)


def load_catalogues(directory: Path) -> dict[str, Translations]:
    """Every `{locale}/LC_MESSAGES/messages.po` under `directory`, compiled."""
    catalogues = {}
    for po_path in sorted(directory.glob("*/LC_MESSAGES/messages.po")):
        locale = po_path.parent.parent.name
        catalogues[locale] = _compile(po_path, po_path.stat().st_mtime_ns)
    return catalogues


class PoDomain(Domain):
    """A Flask-Babel domain that serves the catalogues compiled at start-up."""

    def __init__(self, catalogues: dict[str, Translations]) -> None:
        super().__init__()
        self.catalogues = catalogues

    def get_translations(self) -> Translations | NullTranslations:
        """The current locale's catalogue; English needs none."""
        return self.catalogues.get(str(get_locale())) or NullTranslations()


class CompiledBabel(Babel):
    """Flask-Babel, reading `.po` files compiled in memory instead of `.mo` files."""

    def __init__(self, catalogues: dict[str, Translations]) -> None:
        super().__init__()
        self._domain = PoDomain(catalogues)

    @property
    def domain_instance(self) -> Domain:  # type: ignore[override]
        """The one domain of this app."""
        return self._domain


def init_app(app: Flask, translations_dir: Path) -> None:
    """Attach Flask-Babel with the compiled catalogues and expose the language to templates."""
    babel = CompiledBabel(load_catalogues(translations_dir))
    babel.init_app(app, locale_selector=select_locale)

    @app.context_processor
    def language_context() -> dict[str, object]:
        return {"current_language": current_language(), "languages": LANGUAGES.values()}
