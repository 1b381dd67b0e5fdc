"""The web page against a base (voice-cloning) mesh, in headless Chromium: a person uploads a reference recording
as a named voice, sees it listed, speaks with it, watches the waveform drawn as the audio plays, and downloads the
audio as a WAV holding exactly the streamed samples; or speaks in the voice of a reference file directly.

The mesh wants an API key (as a shared deployment would): the page lists, saves and speaks with the key a person
types in. The audio clock is the test's (as in test_web_page.py): it stays at 0 until the test moves it, so nothing has played
and the waveform is blank until then."""

from __future__ import annotations

import re
import wave
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Page, WebSocketRoute

from messages.audio_format import SAMPLE_RATE, SAMPLES_PER_FRAME
from tests.support.mesh import Mesh, run_mesh
from tests.support.reference_audio_files import audio_file
from tests.mesh.test_web_page import page  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(300)

REF_TEXT = "This is how I sound."
API_KEY = "page-key"
OPTIONS = '{"max_new_tokens": 12, "ignore_eos": true, "seed": 5}'
INK = """() => { const c = document.getElementById("waveform");
  const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n; }"""
"""Pixels the waveform canvas has drawn (not transparent)."""
AFTER_TWO_FRAMES = """async () => { const before = window.voxmesh.waveform.draws;
  await new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)));
  return window.voxmesh.waveform.draws - before; }"""
"""Waveform draws during the next two animation frames."""


@pytest.fixture(scope="module")
def base_mesh(tiny_base_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):
    with run_mesh(tiny_base_checkpoint, tmp_path_factory.mktemp("web-voice-state"),
                  env={"VOXMESH_API_KEYS": API_KEY}) as running:
        yield running


async def record_stream(page: Page) -> list[bytes]:
    """The audio the server sends the page's WebSocket, passed on as it comes."""
    audio: list[bytes] = []

    def on_socket(route: WebSocketRoute) -> None:
        server = route.connect_to_server()

        def from_server(message: str | bytes) -> None:
            if isinstance(message, bytes):
                audio.append(message)
            route.send(message)

        server.on_message(from_server)
        route.on_message(server.send)

    await page.route_web_socket(re.compile(r".*/v1/audio/speech/stream$"), on_socket)
    return audio


async def load_with_key(mesh: Mesh, page: Page) -> None:
    await page.goto(mesh.gateway_url + "/")
    await page.wait_for_function("document.getElementById('voice-status').textContent !== ''")
    assert await page.text_content("#voice-status") == "enter the API key to see the saved voices"
    await page.fill("#api-key", API_KEY)
    await page.dispatch_event("#api-key", "change")
    await page.wait_for_function("document.getElementById('voice-status').textContent === ''")
    assert await page.is_visible("#clone") and await page.eval_on_selector_all("#voice option", "o => o.length") >= 1


async def open_page(mesh: Mesh, page: Page) -> list[bytes]:
    audio = await record_stream(page)
    await load_with_key(mesh, page)
    await page.set_input_files("#ref-audio", files=[{"name": "me.wav", "mimeType": "audio/wav",
                                                     "buffer": audio_file(2.0, 22050, seed=4)}])
    await page.fill("#ref-text", REF_TEXT)
    await page.fill("#text", "Hello in a voice from the page.")
    await page.click("summary")
    await page.fill("#options", OPTIONS)
    return audio


async def speak_until_done(page: Page) -> dict:
    await page.click("#speak")
    await page.wait_for_function("window.voxmesh.events.some(e => e.type === 'session.done' || e.type === 'error')",
                                 timeout=120_000)
    return await page.evaluate("window.voxmesh")


async def test_a_voice_uploaded_on_the_page_is_listed_spoken_drawn_and_downloadable(base_mesh, page, tmp_path):
    streamed = await open_page(base_mesh, page)
    await page.fill("#voice-name", "Page-Voice")
    await page.click("#save-voice")
    await page.wait_for_function("document.getElementById('voice').value === 'page-voice'", timeout=120_000)
    assert await page.text_content("#voice-status") == "saved “page-voice”"
    listed = await page.eval_on_selector_all("#voice option", "options => options.map(o => [o.value, o.text])")
    assert listed == [["", "the reference file below"], ["page-voice", "page-voice (in-context)"]]
    assert not await page.is_visible("#download")

    report = await speak_until_done(page)
    assert [e["type"] for e in report["events"] if e["type"] in ("error", "audio.done")] == ["audio.done"]
    pcm = b"".join(streamed)
    assert report["scheduledSamples"] == len(pcm) // 2 == 12 * SAMPLES_PER_FRAME

    # Nothing has played at audio time 0 (the first buffer starts 0.2 s in): the canvas is blank. Then 0.3 s played.
    assert await page.evaluate(INK) == 0
    await page.evaluate("t => { window.testAudioTime = t; }", report["buffers"][0]["start"] + 0.3)
    await page.wait_for_function(f"window.voxmesh.waveform.playhead === {int(0.3 * SAMPLE_RATE)} && ({INK})() > 200")
    await page.evaluate("t => { window.testAudioTime = t; }", report["buffers"][-1]["start"] + 1.0)  # all played
    await page.wait_for_function(f"window.voxmesh.waveform.playhead === {report['scheduledSamples']}")
    assert await page.evaluate(AFTER_TWO_FRAMES) == 0, "the waveform stops drawing once the audio has played"

    async with page.expect_download() as download_info:
        await page.click("#download")
    download = await download_info.value
    assert download.suggested_filename == "voxmesh.wav"
    saved = tmp_path / "voxmesh.wav"
    await download.save_as(saved)
    with wave.open(str(saved)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, SAMPLE_RATE)
        assert wav.getnframes() == report["scheduledSamples"]
        assert wav.readframes(wav.getnframes()) == pcm


@pytest.mark.parametrize("x_vector_only", [False, True], ids=["in-context", "x-vector"])
async def test_the_page_speaks_in_the_voice_of_a_reference_file(base_mesh, page, x_vector_only):
    streamed = await open_page(base_mesh, page)
    await page.select_option("#voice", "")
    if x_vector_only:
        await page.check("#x-vector-only")
    report = await speak_until_done(page)
    assert [e["type"] for e in report["events"] if e["type"] in ("error", "audio.done")] == ["audio.done"]
    updated = next(e["event"] for e in report["events"] if e["type"] == "session.updated")["session"]["speech"]
    assert re.fullmatch(r"<\d+ characters>", updated["ref_audio"])
    assert ("x_vector_only_mode" in updated) == x_vector_only and ("ref_text" in updated) != x_vector_only
    assert report["scheduledSamples"] == len(b"".join(streamed)) // 2 == 12 * SAMPLES_PER_FRAME


async def test_the_page_asks_for_a_file_when_it_has_none(base_mesh, page):
    await load_with_key(base_mesh, page)
    await page.select_option("#voice", "")
    await page.click("#speak")
    await page.wait_for_function("document.getElementById('error').textContent !== ''")
    assert await page.text_content("#error") == "choose a reference audio file, or a saved voice"
    assert await page.evaluate("window.voxmesh.events.length") == 0  # no request went out


def test_the_page_serves_its_scripts_and_nothing_else(base_mesh):
    for name in ("app", "recording", "voices", "waveform"):
        script = httpx.get(f"{base_mesh.gateway_url}/static/{name}.js", timeout=30)
        assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    other = httpx.get(f"{base_mesh.gateway_url}/static/index.js", timeout=30)
    assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"
