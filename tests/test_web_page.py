"""The web page at `/`, in headless Chromium (Debian's `chromium`, driven by Playwright), against the real mesh: it
offers the served model's voices, plays the audio while it streams (WebAudio buffers scheduled back to back), and
shows the first-packet time and the count of samples scheduled, which ends equal to what `audio.done` reports."""

from __future__ import annotations

import json
import shutil

import pytest
from playwright.async_api import async_playwright

from messages.audio_format import SAMPLE_RATE, SAMPLES_PER_FRAME

pytestmark = pytest.mark.timeout(300)

CHROMIUM = "/usr/bin/chromium"  # Debian's package (tests/install.sh); Playwright never downloads a browser here
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
FRAMES_PER_SEGMENT = 60  # 4.8 s of audio: much longer than the first packet takes, so playback starts mid-stream


@pytest.fixture
async def page():
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: tests/install.sh installs Debian's chromium")
    async with async_playwright() as driver:
        browser = await driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield await browser.new_page()
        finally:
            await browser.close()


async def test_the_page_plays_the_stream_as_it_arrives_back_to_back(mesh, page):
    await page.goto(mesh.gateway_url + "/")
    voices = await page.eval_on_selector_all("#voice option", "options => options.map(o => o.value)")
    assert set(voices) == {"ryan", "vivian", "eric"}
    await page.select_option("#voice", "vivian")
    await page.fill("#text", "Hello from the page. It plays while the rest is made.")
    await page.click("summary")  # open "Options", as a person would
    await page.fill("#options", json.dumps({"max_new_tokens": FRAMES_PER_SEGMENT, "ignore_eos": True, "seed": 9}))
    await page.click("#speak")
    await page.wait_for_function("window.voxmesh.events.some(e => e.type === 'session.done')", timeout=120_000)
    report = await page.evaluate("window.voxmesh")

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
    assert await page.text_content("#first-packet") == f"{report['firstPacketMs']:.0f} ms"
    assert (await page.text_content("#state")).startswith("done: 9.60 s of audio in 2 segment(s)")
    assert await page.text_content("#error") == ""
