// The format and rate picker. pcm, ulaw and alaw come over the WebSocket as they are made and the page plays them
// itself (G.711 expanded to 16-bit samples by table); wav, mp3, aac, flac and opus are asked for as a whole file from
// POST /v1/audio/speech, which the browser decodes and plays in an <audio> element. The formats the gateway serves
// and each one's rates come with the page's config (`response_formats`, `sample_rates`).
"use strict";

(() => {
  const STREAM_FORMATS = { pcm: "pcm_s16le", ulaw: "pcm_mulaw", alaw: "pcm_alaw" };
  const G711_RATE = 8000;
  const EXTENSIONS = { wav: "wav", mp3: "mp3", aac: "aac", flac: "flac", opus: "opus", ulaw: "ulaw", alaw: "alaw" };
  const MEDIA_TYPES = { ulaw: "audio/basic", alaw: "audio/x-alaw-basic" };

  // ITU-T G.711's expansion of every byte to a 16-bit sample.
  function g711Table(law) {
    const table = new Int16Array(256);
    for (let byte = 0; byte < 256; byte++) {
      if (law === "ulaw") {
        const code = ~byte & 0xff, exponent = (code >> 4) & 7, mantissa = code & 0x0f;
        const magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84;
        table[byte] = code & 0x80 ? -magnitude : magnitude;
      } else {
        const code = byte ^ 0x55, exponent = (code >> 4) & 7, mantissa = code & 0x0f;
        const magnitude = exponent === 0 ? (mantissa << 4) + 8 : ((mantissa << 4) + 0x108) << (exponent - 1);
        table[byte] = code & 0x80 ? magnitude : -magnitude;
      }
    }
    return table;
  }

  const G711_TABLES = { ulaw: g711Table("ulaw"), alaw: g711Table("alaw") };

  class FormatPicker {
    constructor(config, $) {
      this.config = config;
      this.$ = $;
    }

    init() {
      const formats = this.config.response_formats ?? ["pcm"];
      for (const format of formats) this.$("format").add(new Option(format, format));
      this.$("format").value = formats.includes("pcm") ? "pcm" : formats[0];
      this.$("format").addEventListener("change", () => this.fillRates());
      this.fillRates();
    }

    fillRates() {
      const select = this.$("sample-rate");
      const rates = (this.config.sample_rates ?? {})[this.format] ?? [this.defaultRate()];
      select.replaceChildren(...rates.map((rate) => new Option(`${rate} Hz`, String(rate))));
      select.value = String(rates.includes(this.defaultRate()) ? this.defaultRate() : rates[0]);
    }

    get format() { return this.$("format").value; }

    get sampleRate() { return Number(this.$("sample-rate").value); }

    // The rate a request that names none gets: G.711's 8 kHz, else the model's.
    defaultRate() { return this.format in MEDIA_TYPES ? G711_RATE : this.config.sample_rate; }

    // Whether the page streams and plays it itself (else: a whole file the browser decodes).
    get isStreamed() { return this.format in STREAM_FORMATS; }

    // The fields that ask for the picked format and rate: none for pcm at its own rate (what the page always sent).
    streamFields() {
      const fields = this.format === "pcm" ? {} : { format: STREAM_FORMATS[this.format] };
      if (this.sampleRate !== this.defaultRate()) fields.sample_rate = this.sampleRate;
      return fields;
    }

    fileFields() {
      const fields = { response_format: this.format };
      if (this.sampleRate !== this.defaultRate()) fields.sample_rate = this.sampleRate;
      return fields;
    }

    // One binary frame of the stream as 16-bit samples.
    samples(frame) {
      const table = G711_TABLES[this.format];
      if (!table) return new Int16Array(frame);
      const bytes = new Uint8Array(frame), out = new Int16Array(bytes.length);
      for (let i = 0; i < bytes.length; i++) out[i] = table[bytes[i]];
      return out;
    }

    // The file to offer for a streamed format's frames: G.711 as it came; pcm: null (the page's WAV of it).
    rawFile(frames) {
      return MEDIA_TYPES[this.format] ? new Blob(frames, { type: MEDIA_TYPES[this.format] }) : null;
    }

    fileName() { return `voxmesh.${EXTENSIONS[this.format] ?? "wav"}`; }
  }

  // POST the speech body and read the whole answer: { blob, requestId, sampleRate, headersMs } or a thrown Error
  // with the gateway's code and message.
  async function fetchSpeech(path, body, headers, signal) {
    const sentAt = performance.now();
    const response = await fetch(path, { method: "POST", headers: { "Content-Type": "application/json", ...headers },
                                         body: JSON.stringify(body), signal });
    const headersMs = performance.now() - sentAt;
    if (!response.ok) {
      const text = await response.text();
      let error;
      try { error = JSON.parse(text).error; } catch { error = { code: `http_${response.status}`, message: text }; }
      throw new Error(`${error.code}: ${error.message}`);
    }
    return { blob: await response.blob(), requestId: response.headers.get("x-request-id"),
             sampleRate: Number(response.headers.get("x-sample-rate")), headersMs };
  }

  window.voxmeshParts = { ...window.voxmeshParts, FormatPicker, fetchSpeech };
})();
