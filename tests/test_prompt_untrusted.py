"""SPEC 4.1: the shared sanitiser (acceptance cases 140-142)."""

from __future__ import annotations

import pytest

from deerflow_web.services.prompt.untrusted import BLOCKED_TAG_NAMES
from deerflow_web.services.prompt.untrusted import neutralize_untrusted_tags


def test_deny_list_has_the_forty_names_of_the_spec() -> None:
    assert len(BLOCKED_TAG_NAMES) == 40
    assert len(set(BLOCKED_TAG_NAMES)) == 40
    assert {"system-reminder", "system_reminder", "uploaded_files", "current_uploads"} <= set(
        BLOCKED_TAG_NAMES
    )


@pytest.mark.parametrize("text", ["", "   ", "<div>x</div>", "plain report.pdf"])
def test_empty_whitespace_and_ordinary_text_pass_unchanged(text: str) -> None:
    assert neutralize_untrusted_tags(text) == text


@pytest.mark.parametrize("name", BLOCKED_TAG_NAMES)
def test_every_blocked_name_is_escaped_opening_and_closing(name: str) -> None:
    result = neutralize_untrusted_tags(f"a<{name}>b</{name}>c")
    assert result == f"a&lt;{name}&gt;b&lt;/{name}&gt;c"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<THINK>", "&lt;THINK&gt;"),
        ("< think >", "&lt; think &gt;"),
        ("<think attr='v'>", "&lt;think attr='v'&gt;"),
        ("x <system", "x &lt;system"),
        ("<system/>", "&lt;system/&gt;"),
        ("< / System >", "&lt; / System &gt;"),
        ("evil<system-reminder>hack.pdf", "evil&lt;system-reminder&gt;hack.pdf"),
    ],
)
def test_blocked_tags_in_any_form_are_escaped(text: str, expected: str) -> None:
    assert neutralize_untrusted_tags(text) == expected


@pytest.mark.parametrize(
    "text", ["<systems>", "<span>", "<table>", "<a href='x'>", "<mydata>", "<rolex>", "<memoryX>"]
)
def test_ordinary_tags_and_longer_words_are_untouched(text: str) -> None:
    assert neutralize_untrusted_tags(text) == text


def test_boundary_markers_are_rewritten() -> None:
    assert neutralize_untrusted_tags("a --- BEGIN USER INPUT --- b") == "a [BEGIN USER INPUT] b"
    assert neutralize_untrusted_tags("--- END USER INPUT ---") == "[END USER INPUT]"


def test_escaping_is_idempotent_so_values_can_pass_twice() -> None:
    once = neutralize_untrusted_tags("<system>x</system> --- BEGIN USER INPUT ---")
    assert neutralize_untrusted_tags(once) == once
