// The waveform of the audio as it plays: each animation frame draws the samples of the last WINDOW_S seconds up to
// the sample playing now, taken from the PCM the page plays (so it is drawn from the same clock as playback), until
// the last sample of a complete recording has played.
"use strict";

(() => {
  const WINDOW_S = 0.5;

  class Waveform {
    constructor(canvas, report) {
      this.canvas = canvas;
      this.report = report;
      this.frame = null;
    }

    // Follow `player` (its placed buffers and audio clock) over `recording` until `stop()`.
    start(player, recording) {
      this.stop();
      this.clear();
      const tick = () => {
        const playhead = this.draw(player, recording);
        const ended = recording.isComplete && playhead >= recording.numSamples;
        this.frame = ended ? null : requestAnimationFrame(tick);
      };
      this.frame = requestAnimationFrame(tick);
    }

    stop() {
      if (this.frame !== null) cancelAnimationFrame(this.frame);
      this.frame = null;
    }

    clear() {
      this.canvas.getContext("2d").clearRect(0, 0, this.canvas.width, this.canvas.height);
    }

    draw(player, recording) {
      const playhead = player.playhead();
      this.report.waveform = { playhead, draws: (this.report.waveform?.draws ?? 0) + 1 };
      if (playhead <= 0) return playhead;
      const width = this.canvas.width, height = this.canvas.height;
      const span = Math.round(WINDOW_S * recording.sampleRate);
      const samples = recording.slice(Math.max(0, playhead - span), playhead);
      const context = this.canvas.getContext("2d");
      context.clearRect(0, 0, width, height);
      context.fillStyle = "#3060c0";
      const perColumn = span / width;
      const offset = width - samples.length / perColumn; // the start of the audio sits mid-canvas at first
      for (let x = Math.max(0, Math.floor(offset)); x < width; x++) {
        const from = Math.floor((x - offset) * perColumn), to = Math.floor((x + 1 - offset) * perColumn);
        let low = 0, high = 0;
        for (let i = Math.max(0, from); i < Math.min(samples.length, Math.max(to, from + 1)); i++) {
          low = Math.min(low, samples[i]);
          high = Math.max(high, samples[i]);
        }
        const top = height / 2 - (high / 32768) * (height / 2), bottom = height / 2 - (low / 32768) * (height / 2);
        context.fillRect(x, top, 1, Math.max(1, bottom - top));
      }
      return playhead;
    }
  }

  window.voxmeshParts = { ...window.voxmeshParts, Waveform };
})();
