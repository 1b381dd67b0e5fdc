// The PCM a request streamed, kept as it arrives, and offered as a WAV file once the request is done.
"use strict";

(() => {
  const HEADER_BYTES = 44;

  // A 16-bit mono PCM WAV of `chunks` (Int16Arrays), as a Blob.
  function wavBlob(chunks, sampleRate) {
    const numSamples = chunks.reduce((sum, chunk) => sum + chunk.length, 0);
    const header = new DataView(new ArrayBuffer(HEADER_BYTES));
    const text = (offset, value) => [...value].forEach((c, i) => header.setUint8(offset + i, c.charCodeAt(0)));
    text(0, "RIFF");
    header.setUint32(4, 36 + numSamples * 2, true);
    text(8, "WAVE");
    text(12, "fmt ");
    header.setUint32(16, 16, true); // the fmt chunk's size
    header.setUint16(20, 1, true); // PCM
    header.setUint16(22, 1, true); // mono
    header.setUint32(24, sampleRate, true);
    header.setUint32(28, sampleRate * 2, true); // bytes per second
    header.setUint16(32, 2, true); // bytes per sample frame
    header.setUint16(34, 16, true); // bits per sample
    text(36, "data");
    header.setUint32(40, numSamples * 2, true);
    // Int16Array views are little-endian on every platform browsers run on, as WAV wants.
    return new Blob([header, ...chunks], { type: "audio/wav" });
  }

  class Recording {
    constructor(sampleRate) {
      this.sampleRate = sampleRate;
      this.chunks = [];
      this.numSamples = 0;
      this.isComplete = false; // no more audio will come
    }

    add(samples) {
      this.chunks.push(samples);
      this.numSamples += samples.length;
    }

    // The samples [from, to) as one Int16Array (for the waveform).
    slice(from, to) {
      const out = new Int16Array(Math.max(0, to - from));
      let start = 0;
      for (const chunk of this.chunks) {
        const end = start + chunk.length;
        if (end > from && start < to) {
          const lo = Math.max(from, start), hi = Math.min(to, end);
          out.set(chunk.subarray(lo - start, hi - start), lo - from);
        }
        start = end;
      }
      return out;
    }

    wav() { return wavBlob(this.chunks, this.sampleRate); }
  }

  window.voxmeshParts = { ...window.voxmeshParts, Recording };
})();
