"""The web page's format and rate picker, in headless Chromium (Debian's `chromium`, driven by Playwright): it offers
the formats and rates of its config, streams pcm and G.711 over the WebSocket at the picked rate and plays them
itself, asks for other formats as a whole file that the browser decodes and plays, and offers each as a download.

No gateway: the page is rendered by the gateway's own route (web.py) from a stand-in catalog, and every request of
the page, the WebSocket included, is answered inside the browser by the test (Playwright's routes), with audio of a
known shape (tests/support/encoded_audio.py). The gateway's side of `sample_rate` is tested with the gateway."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from playwright.async_api import Page, Route, WebSocketRoute, async_playwright

from loadtest.bench.audio_decode import G711_TABLES
from services.gateway.http.routes.web import STATIC_DIR, index
from tests.support.encoded_audio import MEDIA_TYPES, SILENT_S, TONE_S, encode, signal

pytestmark = pytest.mark.timeout(300)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--autoplay-policy=no-user-gesture-required"]
ORIGIN = "http://voxmesh.test"
FRAME_SAMPLES = 1000


async def rendered_page() -> str:
    catalog = SimpleNamespace(model="tiny", speakers=("ryan", "vivian"), languages=("auto", "english"),
                              model_type="custom_voice")
    response = await index(SimpleNamespace(catalog=catalog, keyring=SimpleNamespace(is_open=True)))
    return response.body.decode()


@pytest.fixture
async def page():
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: tests/install.sh installs Debian's chromium")
    html = await rendered_page()
    async with async_playwright() as driver:
        browser = await driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            page.speech_bodies, page.served_files = [], []

            async def serve(route: Route) -> None:
                path = route.request.url.removeprefix(ORIGIN)
                if path == "/":
                    await route.fulfill(body=html, content_type="text/html")
                elif path.startswith("/static/"):
                    await route.fulfill(body=(STATIC_DIR / Path(path).name).read_text(),
                                        content_type="text/javascript")
                elif path == "/v1/audio/speech":
                    answer = speech_answer(json.loads(route.request.post_data), page.speech_bodies)
                    page.served_files.append(answer["body"])
                    await route.fulfill(**answer)
                else:
                    await route.fulfill(status=404)

            await page.route(f"{ORIGIN}/**", serve)
            yield page
        finally:
            await browser.close()


def speech_answer(body: dict, bodies: list) -> dict:
    bodies.append(body)
    response_format = body["response_format"]
    rate = body.get("sample_rate", 24000)
    return {"status": 200, "body": encode(response_format, signal(rate), rate),
            "headers": {"Content-Type": MEDIA_TYPES[response_format], "X-Sample-Rate": str(rate),
                        "X-Request-Id": "req_file"}}


async def stream_answers(page: Page) -> asyncio.Queue:
    """Answer the page's WebSocket in the browser: after `input.done`, the known audio in the session's format at the
    session's rate, one frame of FRAME_SAMPLES at a time. The session.update the page sent is queued."""
    updates: asyncio.Queue = asyncio.Queue()

    closing: set = set()

    def on_socket(route: WebSocketRoute) -> None:
        session: dict = {}

        def on_message(message: str | bytes) -> None:
            event = json.loads(message)
            if event["type"] == "session.update":
                session.update(event)
                updates.put_nowait(event)
            elif event["type"] == "input.done":
                send_audio(route, session, closing)

        route.on_message(on_message)

    await page.route_web_socket(re.compile(r".*/v1/audio/speech/stream$"), on_socket)
    return updates


def send_audio(route: WebSocketRoute, session: dict, closing: set) -> None:
    law = {"pcm_mulaw": "ulaw", "pcm_alaw": "alaw"}.get(session.get("format", "pcm_s16le"))
    rate = session.get("sample_rate", 8000 if law else 24000)
    pcm = signal(rate)
    route.send(json.dumps({"type": "audio.start", "request_id": "req_ws", "format": session.get("format",
                                                                                                "pcm_s16le"),
                           "sample_rate": rate, "segment": 0, "text": "Hello."}))
    for at in range(0, len(pcm), FRAME_SAMPLES):
        route.send(encode(law or "pcm", pcm[at:at + FRAME_SAMPLES], rate))
    duration = len(pcm) / rate
    route.send(json.dumps({"type": "audio.done", "request_id": "req_ws", "samples": len(pcm),
                           "duration_s": duration}))
    route.send(json.dumps({"type": "session.done", "request_ids": ["req_ws"], "segments": 1, "samples": len(pcm),
                           "duration_s": duration}))
    closing.add(asyncio.get_running_loop().create_task(route.close(code=1000)))  # held: a task must not be lost


async def pick(page: Page, response_format: str, rate: int) -> None:
    await page.goto(ORIGIN + "/")
    await page.select_option("#format", response_format)
    await page.select_option("#sample-rate", str(rate))
    await page.click("#speak")


async def download(page: Page) -> tuple[str, str, bytes]:
    """The download link's file name, its text, and the bytes it offers."""
    await page.wait_for_selector("#download:not([hidden])")
    name = await page.get_attribute("#download", "download")
    data = await page.evaluate("async () => Array.from(new Uint8Array(await (await fetch("
                               "document.getElementById('download').href)).arrayBuffer()))")
    return name, await page.text_content("#download"), bytes(data)


async def test_the_picker_offers_the_configured_formats_and_each_ones_rates(page):
    await page.goto(ORIGIN + "/")
    formats = await page.eval_on_selector_all("#format option", "options => options.map(o => o.value)")
    config = await page.evaluate("window.voxmesh.config")
    assert formats == config["response_formats"] and "pcm" in formats and "mp3" in formats
    rates = "options => options.map(o => Number(o.value))"
    assert await page.input_value("#format") == "pcm" and await page.input_value("#sample-rate") == "24000"
    assert await page.eval_on_selector_all("#sample-rate option", rates) == config["sample_rates"]["pcm"]
    await page.select_option("#format", "opus")
    assert await page.eval_on_selector_all("#sample-rate option", rates) == [8000, 12000, 16000, 24000, 48000]
    await page.select_option("#format", "ulaw")
    assert await page.input_value("#sample-rate") == "8000"


@pytest.mark.parametrize(("response_format", "rate"), [("mp3", 16000), ("flac", 44100), ("opus", 48000),
                                                       ("wav", 8000)])
async def test_a_file_format_is_asked_for_played_by_the_browser_and_offered(page, response_format, rate):
    await pick(page, response_format, rate)
    await page.wait_for_function("() => window.voxmesh.file && window.voxmesh.file.durationS !== undefined",
                                 timeout=60_000)
    (body,) = page.speech_bodies
    assert (body["response_format"], body.get("sample_rate", 24000), body["voice"]) == (response_format, rate, "ryan")
    report = await page.evaluate("window.voxmesh")
    # The browser decoded it: its duration is the audio's (codecs pad a few ms).
    assert report["file"]["durationS"] == pytest.approx(SILENT_S + TONE_S, abs=0.1)
    assert report["file"]["sampleRate"] == rate and await page.text_content("#error") == ""
    name, text, data = await download(page)
    extension = {"opus": "opus"}.get(response_format, response_format)
    assert name == f"voxmesh.{extension}" and f"{response_format}, {rate} Hz" in text
    assert data == page.served_files[0], "the file offered is the one served (Ogg's serial number is random)"


@pytest.mark.parametrize(("response_format", "rate", "fields"), [
    ("pcm", 24000, {}),  # what the page always sent
    ("pcm", 16000, {"sample_rate": 16000}),
    ("ulaw", 8000, {"format": "pcm_mulaw"}),
    ("alaw", 8000, {"format": "pcm_alaw"}),
])
async def test_a_streamed_format_is_played_by_the_page_at_its_rate(page, response_format, rate, fields):
    updates = await stream_answers(page)
    await pick(page, response_format, rate)
    update = await asyncio.wait_for(updates.get(), 30)
    assert {key: update[key] for key in ("format", "sample_rate") if key in update} == fields
    await page.wait_for_function("window.voxmesh.events.some(e => e.type === 'session.done')")
    report = await page.evaluate("window.voxmesh")
    pcm = signal(rate)
    assert report["scheduledSamples"] == len(pcm) and report["sampleRate"] == rate
    assert await page.text_content("#error") == ""
    if response_format in G711_TABLES:  # the page expands G.711 as the standard does
        expanded = await page.evaluate(
            "() => Array.from(new window.voxmeshParts.FormatPicker(window.voxmesh.config, "
            "(id) => document.getElementById(id)).samples(Uint8Array.from({ length: 256 }, (_, i) => i).buffer))")
        assert expanded == G711_TABLES[response_format].tolist()
    name, text, data = await download(page)
    if response_format == "pcm":
        assert name == "voxmesh.wav" and f"WAV, {rate} Hz" in text
        assert int.from_bytes(data[24:28], "little") == rate and data[44:] == pcm.tobytes()
    else:
        assert name == f"voxmesh.{response_format}" and data == encode(response_format, pcm, rate)
