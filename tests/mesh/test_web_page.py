"""The web page at `/`, in headless Chromium (Debian's `chromium`, driven by Playwright), against the real mesh: it
offers the served model's voices, plays the audio while it streams (WebAudio buffers scheduled back to back), and
shows the first-packet time and the count of samples scheduled, which ends equal to what `audio.done` reports.

Wall-clock pacing would make these tests measure the machine (a busy CPU falls behind real time and the page rightly
counts an underrun), so the test owns both clocks: the page's WebSocket is routed through the test, which hands it
the server's messages one at a time, and the page's audio clock (`currentTime`) is a number the test sets. Before
each chunk after the first, the clock is set to just before the end of the audio scheduled so far: the chunk
arrives just in time, the tightest pace without an underrun; or, in the underrun test, just after it."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from dataclasses import dataclass

import pytest
from playwright.async_api import Page, WebSocketRoute, async_playwright

from messages.audio_format import SAMPLE_RATE, SAMPLES_PER_FRAME

pytestmark = pytest.mark.timeout(300)

CHROMIUM = "/usr/bin/chromium"  # Debian's package (tests/install.sh); Playwright never downloads a browser here
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
FRAMES_PER_SEGMENT = 60  # 4.8 s of audio: several chunks per segment, so playback starts mid-stream
LEAD_S = 0.2  # app.js START_LEAD_S
TEST_CLOCK = """
  window.testAudioTime = 0;
  Object.defineProperty(BaseAudioContext.prototype, "currentTime", { get: () => window.testAudioTime });
"""
SCHEDULED_END = "() => { const b = window.voxmesh.buffers.at(-1); return b.start + b.samples / window.voxmesh.config.sample_rate; }"


@dataclass(frozen=True)
class Closed:
    code: int | None
    reason: str | None


@pytest.fixture
async def page():
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: tests/install.sh installs Debian's chromium")
    async with async_playwright() as driver:
        browser = await driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            await page.add_init_script(TEST_CLOCK)
            yield page
        finally:
            await browser.close()


async def route_stream(page: Page) -> asyncio.Queue:
    """Route the page's WebSocket through the test: the server's messages (and its close) queue up here."""
    arrivals: asyncio.Queue = asyncio.Queue()

    def on_socket(route: WebSocketRoute) -> None:
        server = route.connect_to_server()
        server.on_message(arrivals.put_nowait)
        server.on_close(lambda code, reason: arrivals.put_nowait(Closed(code, reason)))
        route.on_message(server.send)
        arrivals.put_nowait(route)

    await page.route_web_socket(re.compile(r".*/v1/audio/speech/stream$"), on_socket)
    return arrivals


async def play_paced(page: Page, arrivals: asyncio.Queue, late_s: float) -> None:
    """Hand the page the server's messages one by one until the server closes. Before each audio chunk after the
    first, set the audio clock `late_s` past the end of the audio scheduled so far (negative: that much before), then
    wait until the page scheduled the chunk: a page that held audio back would hang here."""
    route = await arrivals.get()
    chunks = 0
    while True:
        message = await arrivals.get()
        if isinstance(message, Closed):
            await route.close(code=message.code, reason=message.reason)
            return
        if isinstance(message, bytes):
            if chunks:
                await page.evaluate(f"late => {{ window.testAudioTime = ({SCHEDULED_END})() + late; }}", late_s)
            route.send(message)
            chunks += 1
            await page.wait_for_function("n => window.voxmesh.buffers.length >= n", arg=chunks)
        else:
            route.send(message)


async def speak(mesh, page: Page, late_s: float) -> dict:
    arrivals = await route_stream(page)
    await page.goto(mesh.gateway_url + "/")
    voices = await page.eval_on_selector_all("#voice option", "options => options.map(o => o.value)")
    assert set(voices) == {"ryan", "vivian", "eric"}
    await page.select_option("#voice", "vivian")
    await page.fill("#text", "Hello from the page. It plays while the rest is made.")
    await page.click("summary")  # open "Options", as a person would
    await page.fill("#options", json.dumps({"max_new_tokens": FRAMES_PER_SEGMENT, "ignore_eos": True, "seed": 9}))
    await page.click("#speak")
    await asyncio.wait_for(play_paced(page, arrivals, late_s), 120)
    await page.wait_for_function("window.voxmesh.events.some(e => e.type === 'session.done')")
    return await page.evaluate("window.voxmesh")


async def test_the_page_plays_the_stream_as_it_arrives_back_to_back(mesh, page):
    report = await speak(mesh, page, late_s=-0.001)  # each chunk arrives 1 ms before the audio runs out

    events = report["events"]
    assert [e["type"] for e in events if e["type"] in ("error", "audio.done")] == ["audio.done", "audio.done"]
    first_done = next(e for e in events if e["type"] == "audio.done")
    buffers = report["buffers"]
    # Playback starts before audio.done arrives: the first buffer was due to play, and playing, by then.
    assert buffers[0]["start"] < first_done["contextTime"], (buffers[0], first_done)
    assert buffers[0]["contextTimeAtSchedule"] < first_done["contextTime"]
    # Back to back: one run from one anchor, each buffer starting where the previous ends.
    assert report["underruns"] == 0
    assert {b["anchor"] for b in buffers} == {buffers[0]["anchor"]}
    for before, after in zip(buffers, buffers[1:]):
        assert after["offset"] == before["offset"] + before["samples"]
        assert after["start"] == pytest.approx(before["start"] + before["samples"] / SAMPLE_RATE, abs=1e-9)
    # The count of scheduled samples is the duration audio.done reports.
    reported = [e["event"] for e in events if e["type"] == "audio.done"]
    assert report["scheduledSamples"] == sum(b["samples"] for b in buffers) == sum(d["samples"] for d in reported)
    assert report["scheduledSamples"] == round(sum(d["duration_s"] for d in reported) * SAMPLE_RATE)
    assert report["scheduledSamples"] == 2 * FRAMES_PER_SEGMENT * SAMPLES_PER_FRAME
    # What a person sees.
    assert await page.text_content("#samples-scheduled") == str(report["scheduledSamples"])
    assert report["firstPacketMs"] > 0
    # Formatted as the page does (JavaScript's toFixed rounds a tie up, Python's format to even: 412.5 -> 413, 412).
    shown = await page.evaluate("ms => ms.toFixed(0)", report["firstPacketMs"])
    assert await page.text_content("#first-packet") == f"{shown} ms"
    assert (await page.text_content("#state")).startswith("done: 9.60 s of audio in 2 segment(s)")
    assert await page.text_content("#error") == ""


async def test_a_chunk_that_arrives_late_restarts_playback_after_the_lead(mesh, page):
    report = await speak(mesh, page, late_s=0.05)  # each chunk after the first arrives 50 ms too late
    buffers = report["buffers"]
    assert report["underruns"] == len(buffers) - 1
    assert report["scheduledSamples"] == 2 * FRAMES_PER_SEGMENT * SAMPLES_PER_FRAME
    for before, after in zip(buffers, buffers[1:]):
        late_at = before["start"] + before["samples"] / SAMPLE_RATE + 0.05
        assert after["contextTimeAtSchedule"] == pytest.approx(late_at, abs=1e-9)
        assert (after["anchor"], after["offset"]) == (pytest.approx(late_at + LEAD_S, abs=1e-9), 0)
        assert after["start"] == after["anchor"]
