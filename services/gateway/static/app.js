// voxmesh web page: sends the text over the streaming WebSocket and plays the PCM as it arrives.
//
// Each binary frame (s16le mono) becomes an AudioBuffer scheduled to start exactly where the previous one ends, so
// consecutive buffers play back to back. The first buffer starts START_LEAD_S after it arrives: a small jitter
// buffer. If a frame arrives after the audio scheduled so far has run out (the network or the mesh fell behind),
// playback is re-anchored to now, and that underrun is counted. The PCM is also kept (recording.js): the waveform
// (waveform.js) is drawn from it as it plays, and once the request is done it is offered as a WAV file. A base model
// speaks in a cloned voice: a saved one, or a reference audio file sent with the request (voices.js). The format and
// rate picker (formats.js) streams pcm or G.711 at the picked rate the same way (G.711 offered as it came), or asks
// for a whole file of another format, which the browser plays in the <audio> element and offers as it came.
"use strict";

(() => {
  const START_LEAD_S = 0.2;
  const config = JSON.parse(document.getElementById("voxmesh-config").textContent);
  const $ = (id) => document.getElementById(id);
  const { ClonedVoices, FormatPicker, Recording, Waveform, fetchSpeech } = window.voxmeshParts;

  // What happened in the last session, for people (the page) and for tests (window.voxmesh).
  const report = window.voxmesh = {
    config, events: [], buffers: [], scheduledSamples: 0, underruns: 0, firstPacketMs: null, audioDone: [],
    waveform: null, format: "pcm", sampleRate: config.sample_rate, file: null,
  };

  class StreamPlayer {
    constructor(sampleRate) {
      this.sampleRate = sampleRate;
      this.context = new AudioContext({ sampleRate });
      this.anchor = null; // context time of sample 0 of the current back-to-back run
      this.offset = 0; // samples scheduled since the anchor
      this.sources = new Set();
      this.placed = []; // {start, first, samples} of every buffer: where each sample plays, for the waveform
      this.numSamples = 0;
    }

    schedule(samples) {
      const buffer = this.context.createBuffer(1, samples.length, this.sampleRate);
      const channel = buffer.getChannelData(0);
      for (let i = 0; i < samples.length; i++) channel[i] = samples[i] / 32768;
      const now = this.context.currentTime;
      if (this.anchor === null || this.anchor + this.offset / this.sampleRate < now) {
        if (this.anchor !== null) report.underruns += 1;
        this.anchor = now + START_LEAD_S;
        this.offset = 0;
      }
      const start = this.anchor + this.offset / this.sampleRate;
      const source = this.context.createBufferSource();
      source.buffer = buffer;
      source.connect(this.context.destination);
      source.onended = () => this.sources.delete(source);
      source.start(start);
      this.sources.add(source);
      report.buffers.push({ start, anchor: this.anchor, offset: this.offset, samples: samples.length,
                            contextTimeAtSchedule: now });
      this.placed.push({ start, first: this.numSamples, samples: samples.length });
      this.offset += samples.length;
      this.numSamples += samples.length;
      return samples.length;
    }

    // How many samples have played by now (the index of the sample playing now).
    playhead() {
      const now = this.context.currentTime;
      for (let i = this.placed.length - 1; i >= 0; i--) {
        const { start, first, samples } = this.placed[i];
        if (start <= now) return first + Math.min(samples, Math.floor((now - start) * this.sampleRate));
      }
      return 0;
    }

    stop() {
      for (const source of this.sources) source.stop();
      this.sources.clear();
      this.context.close();
    }
  }

  let socket = null;
  let player = null;
  let recording = null;
  let downloadUrl = null;
  let voices = null; // a base model's ClonedVoices
  let frames = []; // the stream's binary frames as they came (a G.711 download is these bytes)
  let fileRequest = null; // the AbortController of a whole-file request
  const waveform = new Waveform($("waveform"), report);
  const picker = new FormatPicker(config, $);

  function setState(text) { $("state").textContent = text; }

  function showError(message) { $("error").textContent = message; }

  function authHeaders() {
    const key = $("api-key").value.trim();
    return key ? { Authorization: `Bearer ${key}` } : {};
  }

  function fillPickers() {
    for (const voice of config.voices) $("voice").add(new Option(voice, voice));
    for (const language of config.languages) $("language").add(new Option(language, language));
    $("voice").disabled = config.voices.length === 0;
    $("api-key-field").hidden = !config.api_key_required;
    picker.init();
    if (config.model_type === "base") {
      voices = new ClonedVoices(config, $, authHeaders);
      voices.init();
    }
  }

  function sessionSettings() {
    const settings = JSON.parse($("options").value || "{}");
    if (config.voices.length) settings.voice = $("voice").value;
    settings.language = $("language").value;
    return { type: "session.update", ...settings };
  }

  // Offer `blob` (null: nothing) as `name`, described as `what`.
  function offerDownload(blob, name = "voxmesh.wav", what = "WAV") {
    if (downloadUrl !== null) URL.revokeObjectURL(downloadUrl);
    downloadUrl = blob ? URL.createObjectURL(blob) : null;
    $("download").href = downloadUrl ?? "#";
    $("download").download = name;
    $("download").textContent = `Download the audio (${what})`;
    $("download").hidden = downloadUrl === null;
  }

  function offerRecording() {
    const raw = picker.rawFile(frames);
    if (raw) offerDownload(raw, picker.fileName(), `${picker.format}, ${report.sampleRate} Hz`);
    else offerDownload(recording.wav(), "voxmesh.wav", `WAV, ${report.sampleRate} Hz`);
  }

  function onEvent(event, current) {
    report.events.push({ type: event.type, at: performance.now(), contextTime: current.context.currentTime,
                         event });
    if (event.type === "audio.start") {
      $("request-id").textContent = event.request_id;
      if (event.sample_rate !== report.sampleRate) {
        showError(`asked for ${report.sampleRate} Hz audio, the gateway sends ${event.sample_rate} Hz`);
      }
    } else if (event.type === "audio.done") {
      report.audioDone.push(event);
    } else if (event.type === "error") {
      showError(`${event.code}: ${event.message}`);
    } else if (event.type === "session.done") {
      setState(`done: ${event.duration_s.toFixed(2)} s of audio in ${event.segments} segment(s)`);
      recording.isComplete = true;
      offerRecording();
    }
  }

  function onAudio(frame, sentAt, current) {
    const samples = picker.samples(frame);
    frames.push(frame);
    recording.add(samples);
    if (report.firstPacketMs === null) {
      report.firstPacketMs = performance.now() - sentAt;
      $("first-packet").textContent = `${report.firstPacketMs.toFixed(0)} ms`;
      setState("playing");
    }
    report.scheduledSamples += current.schedule(samples);
    $("samples-scheduled").textContent = String(report.scheduledSamples);
    $("seconds-scheduled").textContent = `${(report.scheduledSamples / report.sampleRate).toFixed(2)} s`;
  }

  async function speak() {
    let settings;
    try {
      settings = sessionSettings();
    } catch (error) {
      showError(`options are not valid JSON: ${error.message}`);
      return;
    }
    stop();
    Object.assign(report, { events: [], buffers: [], scheduledSamples: 0, underruns: 0, firstPacketMs: null,
                            audioDone: [], waveform: null, format: picker.format, sampleRate: picker.sampleRate,
                            file: null });
    showError("");
    offerDownload(null);
    $("first-packet").textContent = "–";
    $("samples-scheduled").textContent = "0";
    $("player").hidden = true;
    if (!picker.isStreamed) {
      await speakFile(settings);
      return;
    }
    Object.assign(settings, picker.streamFields());
    frames = [];
    const current = player = new StreamPlayer(picker.sampleRate); // in the click: a gesture may start audio
    recording = new Recording(picker.sampleRate);
    waveform.start(current, recording);
    if (voices !== null) {
      try { // a saved voice, or the reference file read now
        Object.assign(settings, await voices.sessionFields());
      } catch (error) {
        showError(error.message);
        stop();
        return;
      }
      if (current !== player) return; // stopped or restarted while the file was read
    }
    const url = new URL(config.stream_path, location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    const key = $("api-key").value.trim();
    const ws = socket = new WebSocket(url, key ? ["voxmesh", `bearer.${key}`] : ["voxmesh"]);
    ws.binaryType = "arraybuffer";
    let sentAt = 0;
    ws.onopen = () => {
      setState("waiting for audio");
      sentAt = performance.now();
      ws.send(JSON.stringify(settings));
      ws.send(JSON.stringify({ type: "input.text", text: $("text").value }));
      ws.send(JSON.stringify({ type: "input.done" }));
    };
    ws.onmessage = (message) => {
      if (current !== player) return; // a message of a session that was stopped
      if (typeof message.data === "string") onEvent(JSON.parse(message.data), current);
      else onAudio(message.data, sentAt, current);
    };
    ws.onclose = (close) => {
      if (current === player) recording.isComplete = true;
      $("stop").disabled = true;
      if (close.code !== 1000) showError(`connection closed (${close.code}) ${close.reason}`);
    };
    $("stop").disabled = false;
  }

  // A whole file of the picked format from POST /v1/audio/speech, played by the browser's own decoder.
  async function speakFile(settings) {
    const { type: _type, format: _format, ...speech } = settings;
    const body = { model: config.model, input: $("text").value, ...speech, ...picker.fileFields() };
    const controller = fileRequest = new AbortController();
    setState("waiting for audio");
    $("stop").disabled = false;
    try {
      if (voices !== null) Object.assign(body, await voices.sessionFields());
      const file = await fetchSpeech(config.speech_path, body, authHeaders(), controller.signal);
      if (controller !== fileRequest) return; // stopped or restarted meanwhile
      report.file = { bytes: file.blob.size, type: file.blob.type, sampleRate: file.sampleRate };
      report.firstPacketMs = file.headersMs;
      $("first-packet").textContent = `${file.headersMs.toFixed(0)} ms`;
      $("request-id").textContent = file.requestId ?? "–";
      if (file.sampleRate !== picker.sampleRate) {
        showError(`asked for ${picker.sampleRate} Hz audio, the gateway sent ${file.sampleRate} Hz`);
      }
      offerDownload(file.blob, picker.fileName(), `${picker.format}, ${file.sampleRate} Hz`);
      const audio = $("player");
      audio.src = $("download").href;
      audio.hidden = false;
      setState("playing");
      await audio.play();
    } catch (error) {
      if (controller === fileRequest && error.name !== "AbortError") showError(error.message);
      if (controller === fileRequest) setState("failed");
    } finally {
      if (controller === fileRequest) $("stop").disabled = true;
    }
  }

  function onFileEnded() {
    setState(`done: ${$("player").duration.toFixed(2)} s of ${picker.format} audio`);
    report.file = { ...report.file, durationS: $("player").duration };
  }

  function stop() {
    if (fileRequest) fileRequest.abort();
    fileRequest = null;
    $("player").pause();
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify({ type: "cancel" }));
      socket.close(1000);
      setState("stopped");
    }
    if (player) player.stop();
    waveform.stop();
    socket = null;
    player = null;
    $("stop").disabled = true;
  }

  fillPickers();
  $("speak").addEventListener("click", speak);
  $("stop").addEventListener("click", stop);
  $("player").addEventListener("ended", onFileEnded);
})();
