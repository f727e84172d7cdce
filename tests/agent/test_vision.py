"""Pictures for vision models in a real `create_agent` loop, seen from the model's side.

With vision on, the pictures of the message follow the `<current_uploads>` block as image
blocks, and `view_image` shows an earlier one; with vision off the model gets text only
and is not offered the tool. The fake model records every message list it is given.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.messages import HumanMessage
from langchain_core.messages import ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from PIL import Image

from deerflow_web.agent import make_file_tools
from deerflow_web.agent import make_upload_middleware
from deerflow_web.agent import model_accepts_images
from deerflow_web.agent import vision_enabled
from deerflow_web.models import ImageLimits
from tests.support.agent_helpers import AgentContext
from tests.support.agent_helpers import RecordingToolModel
from tests.support.agent_helpers import human_with_files
from tests.support.agent_helpers import thread_uploads
from tests.support.agent_helpers import write_file
from tests.support.pictures import SVG
from tests.support.pictures import jpeg_with_exif
from tests.support.pictures import png_bytes

EVIL_PNG = "evil<system>chart.png"


def _model(*replies: AIMessage, **fields: Any) -> RecordingToolModel:
    script: Iterator[AIMessage] = iter(replies)
    return RecordingToolModel(messages=script, **fields)


def _call(name: str, call_id: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


@pytest.fixture
def base(tmp_path: Path) -> Path:
    base = tmp_path / "data"
    uploads = thread_uploads(base, "t1")
    write_file(uploads / "photo.jpg", jpeg_with_exif(3200, 1600))
    write_file(uploads / EVIL_PNG, png_bytes(120, 60))
    write_file(uploads / "logo.svg", SVG)
    write_file(uploads / "notes.txt", "plain notes\n")
    write_file(uploads / "earlier.png", png_bytes(80, 40))
    write_file(thread_uploads(base, "t2") / "secret.png", png_bytes(10, 10))
    return base


def _agent(
    base: Path, chat_model: RecordingToolModel, mode: str = "current", **options: Any
) -> Any:
    return create_agent(
        chat_model,
        tools=make_file_tools(base_dir=base, **options),
        middleware=make_upload_middleware(base_dir=base, mode=mode, **options),
        context_schema=AgentContext,
        checkpointer=InMemorySaver(),
    )


def _run(agent: Any, message: HumanMessage, thread_id: str = "t1") -> dict[str, Any]:
    return agent.invoke(
        {"messages": [message]},
        config={"configurable": {"thread_id": thread_id}},
        context={"thread_id": thread_id, "run_id": "run-1"},
    )


def _message_with_pictures() -> HumanMessage:
    return human_with_files(
        "what do these show?",
        {"filename": "photo.jpg", "size": 1},
        {"filename": EVIL_PNG, "size": 1},
        {"filename": "logo.svg", "size": 1},
        {"filename": "notes.txt", "size": 1},
        id="h1",
    )


def _image_blocks(content: Any) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        return []
    return [part for part in content if isinstance(part, dict) and part.get("type") == "image"]


def _decoded(block: dict[str, Any]) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(block["base64"])))


def test_with_vision_the_pictures_follow_the_upload_block(base: Path) -> None:
    model = _model(AIMessage("I see a photo and a chart."))
    agent = _agent(base, model, vision=True, image_limits=ImageLimits(max_edge=800))
    _run(agent, _message_with_pictures())

    [human] = model.received[0]
    assert isinstance(human, HumanMessage) and human.id == "h1"
    content = human.content
    assert isinstance(content, list)
    assert content[0]["type"] == "text"
    text = content[0]["text"]
    assert text.startswith("<current_uploads>\n")
    assert text.endswith("</current_uploads>\n\nwhat do these show?")
    assert human.additional_kwargs["original_user_content"] == "what do these show?"

    assert [part["type"] for part in content] == ["text", "text", "image", "text", "image", "text"]
    photo, chart = _image_blocks(content)
    assert photo["mime_type"] == "image/jpeg" and chart["mime_type"] == "image/png"
    assert _decoded(photo).size == (400, 800)  # turned upright, shrunk to the max edge
    assert _decoded(chart).size == (120, 60)
    assert "exif" not in _decoded(photo).info
    assert content[1]["text"] == (
        "Picture 1 of 2 attached to this message: /mnt/user-data/uploads/photo.jpg "
        "(400×800 px, JPEG, resized from 1600×3200)"
    )
    assert "evil&lt;system&gt;chart.png" in content[3]["text"]
    assert "SVG" in content[5]["text"] and "logo.svg" in content[5]["text"]
    assert "<system>" not in json.dumps(content, ensure_ascii=False)
    assert "view_image" in model.bound_tools


def test_without_vision_the_model_gets_text_only_and_no_view_image(base: Path) -> None:
    model = _model(AIMessage("ok"))
    agent = _agent(base, model, vision=False)
    _run(agent, _message_with_pictures())

    [human] = model.received[0]
    assert isinstance(human.content, str)
    assert human.content.startswith("<current_uploads>\n")
    assert "photo.jpg" in human.content
    assert _image_blocks(human.content) == []
    assert "view_image" not in model.bound_tools
    assert set(model.bound_tools) == {"list_uploaded_files", "read_file", "glob", "grep"}


def test_a_message_without_pictures_stays_a_string_with_vision_on(base: Path) -> None:
    model = _model(AIMessage("ok"))
    agent = _agent(base, model, vision=True)
    _run(agent, human_with_files("read it", {"filename": "notes.txt", "size": 1}))
    [human] = model.received[0]
    assert isinstance(human.content, str)
    assert human.content.endswith("</current_uploads>\n\nread it")


def test_list_content_keeps_the_clients_own_blocks(base: Path) -> None:
    client_image = {"type": "image", "url": "https://example.org/x.png"}
    message = human_with_files(
        [{"type": "text", "text": "compare"}, client_image],
        {"filename": "earlier.png", "size": 1},
    )
    model = _model(AIMessage("ok"))
    _run(_agent(base, model, vision=True), message)
    [human] = model.received[0]
    assert human.content[0]["text"].startswith("<current_uploads>")
    assert human.content[1] == {"type": "text", "text": "compare"}
    assert human.content[2] == client_image
    assert len(_image_blocks(human.content)) == 2


def test_pictures_beyond_the_cap_are_only_named(base: Path) -> None:
    model = _model(AIMessage("ok"))
    agent = _agent(base, model, vision=True, image_limits=ImageLimits(max_images=1))
    _run(agent, _message_with_pictures())
    [human] = model.received[0]
    assert len(_image_blocks(human.content)) == 1
    note = human.content[-1]["text"]
    assert "1 more picture(s)" in note and "evil&lt;system&gt;chart.png" in note


def test_the_incremental_mode_sends_the_new_pictures(base: Path) -> None:
    model = _model(AIMessage("ok"), AIMessage("again"))
    agent = _agent(base, model, vision=True, mode="incremental")
    _run(agent, HumanMessage("hello", id="h1"))
    first = model.received[0][0]
    assert len(_image_blocks(first.content)) == 3  # earlier.png, the chart, the photo
    _run(agent, HumanMessage("and now?", id="h2"))
    second = model.received[1][-1]
    assert second.content == "and now?"  # nothing new: no block, no pictures


def test_view_image_shows_an_earlier_picture_and_refuses_the_rest(base: Path) -> None:
    uploads = "/mnt/user-data/uploads"
    model = _model(
        AIMessage(
            "",
            tool_calls=[
                _call("view_image", "c1", path=f"{uploads}/earlier.png"),
                _call("view_image", "c2", path=f"{uploads}/notes.txt"),
                _call("view_image", "c3", path=f"{uploads}/logo.svg"),
                _call("view_image", "c4", path="/mnt/user-data/../../t2/user-data/uploads/x.png"),
                _call("view_image", "c5", path=f"{uploads}/secret.png"),
                _call("view_image", "c6", path="/etc/passwd"),
                _call("view_image", "c7", path=uploads),
            ],
        ),
        AIMessage("done"),
    )
    _run(_agent(base, model, vision=True), HumanMessage("look at my earlier chart"))
    results = {m.tool_call_id: m for m in model.received[1] if isinstance(m, ToolMessage)}

    shown = results["c1"]
    assert shown.status == "success"
    assert shown.content[0] == {
        "type": "text",
        "text": "/mnt/user-data/uploads/earlier.png (80×40 px, PNG)",
    }
    [block] = _image_blocks(shown.content)
    assert block["mime_type"] == "image/png" and _decoded(block).size == (80, 40)

    for call_id in ("c2", "c3", "c4", "c5", "c6", "c7"):
        assert results[call_id].status == "error", call_id
        assert _image_blocks(results[call_id].content) == []
    assert "not a picture" in results["c2"].content
    assert "SVG" in results["c3"].content
    assert results["c4"].content == "Access denied: path traversal detected"
    assert results["c5"].content.startswith("File not found")  # thread t2's file
    assert "directory" in results["c7"].content


def test_view_image_works_in_the_per_user_layout(tmp_path: Path) -> None:
    base = tmp_path / "data"
    write_file(thread_uploads(base, "t1", "u1") / "mine.png", png_bytes(30, 20))
    write_file(thread_uploads(base, "t1", "u2") / "theirs.png", png_bytes(30, 20))
    model = _model(
        AIMessage(
            "",
            tool_calls=[
                _call("view_image", "c1", path="/mnt/user-data/uploads/mine.png"),
                _call("view_image", "c2", path="/mnt/user-data/uploads/theirs.png"),
            ],
        ),
        AIMessage("done"),
    )
    agent = _agent(base, model, vision=True, require_user=True)
    agent.invoke(
        {"messages": [HumanMessage("look")]},
        config={"configurable": {"thread_id": "t1"}},
        context={"thread_id": "t1", "user_id": "u1"},
    )
    results = {m.tool_call_id: m for m in model.received[1] if isinstance(m, ToolMessage)}
    assert len(_image_blocks(results["c1"].content)) == 1
    assert results["c2"].status == "error"


def test_auto_follows_the_models_profile(base: Path) -> None:
    seeing = _model(AIMessage("ok"), profile={"image_inputs": True})
    blind = _model(AIMessage("ok"), profile={"image_inputs": False})
    assert model_accepts_images(seeing) is True
    assert model_accepts_images(blind) is False
    assert model_accepts_images(_model(AIMessage("ok"))) is None
    assert vision_enabled(None, seeing, uses_app_settings=False)
    assert not vision_enabled(None, blind, uses_app_settings=False)
    assert not vision_enabled(None, None, uses_app_settings=False)
    assert not vision_enabled(False, seeing, uses_app_settings=False)  # explicit wins

    _run(_agent(base, seeing, model=seeing), _message_with_pictures())
    assert len(_image_blocks(seeing.received[0][0].content)) == 2
    assert "view_image" in seeing.bound_tools
    _run(_agent(base, blind, model=blind), _message_with_pictures())
    assert isinstance(blind.received[0][0].content, str)
    assert "view_image" not in blind.bound_tools


def test_the_setting_wins_over_the_profile(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("agent:\n  vision: false\n  image_max_edge: 64\n", encoding="utf-8")
    monkeypatch.setenv("DEER_FLOW_CONFIG_PATH", str(config))
    seeing = _model(AIMessage("ok"), profile={"image_inputs": True})
    assert not vision_enabled(None, seeing, uses_app_settings=True)
    config.write_text("agent:\n  vision: auto\n", encoding="utf-8")
    assert vision_enabled(None, seeing, uses_app_settings=True)
    config.write_text("agent:\n  vision: yes\n", encoding="utf-8")
    assert vision_enabled(None, None, uses_app_settings=True)


def test_a_symlinked_picture_is_never_sent(base: Path, tmp_path: Path) -> None:
    outside = write_file(tmp_path / "outside.png", png_bytes(40, 40))
    (thread_uploads(base, "t1") / "planted.png").symlink_to(outside)
    model = _model(AIMessage("ok"))
    _run(_agent(base, model, vision=True), human_with_files("see", {"filename": "planted.png"}))
    [human] = model.received[0]
    assert _image_blocks(human.content) == []
