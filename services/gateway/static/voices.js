// Voices of a base (voice-cloning) model on the page: its saved voices in the voice picker, a reference audio file
// to clone from (sent as `ref_audio` with the request), and saving that file as a named voice
// (POST /v1/audio/voices), after which it is listed and can be picked.
"use strict";

(() => {
  const FROM_FILE = ""; // the picker's value for "clone the reference file"

  function readDataUri(file) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    });
  }

  class ClonedVoices {
    constructor(config, $, authHeaders) {
      this.config = config;
      this.$ = $;
      this.authHeaders = authHeaders;
    }

    // Shows the cloning controls and lists the saved voices; a model of another type keeps its speakers.
    async init() {
      const $ = this.$;
      $("clone").hidden = false;
      $("voice").disabled = false;
      $("save-voice").addEventListener("click", () => this.save());
      $("api-key").addEventListener("change", () => this.refresh());
      await this.refresh();
    }

    // Lists the saved voices in the picker (and selects `select`); a failure is shown beside the form.
    async refresh(select = null) {
      try {
        await this.list(select);
        this.$("voice-status").textContent = "";
      } catch (error) {
        this.$("voice-status").textContent = error.message;
      }
    }

    async list(select) {
      const picker = this.$("voice");
      const response = await fetch(this.config.voices_path, { headers: this.authHeaders() });
      if (response.status === 401) throw new Error("enter the API key to see the saved voices");
      if (!response.ok) throw new Error(`could not list the saved voices: ${response.status}`);
      const listed = (await response.json()).voices.filter((voice) => voice.saved);
      picker.replaceChildren(new Option("the reference file below", FROM_FILE),
                             ...listed.map((voice) => new Option(`${voice.name} (${voice.mode})`, voice.id)));
      if (select !== null) picker.value = select;
      return listed;
    }

    // The reference fields of a request spoken in the file's voice: ref_audio and its transcript, or the voice
    // alone. Throws a message for a person when the file is missing.
    async referenceFields() {
      const $ = this.$, file = $("ref-audio").files[0];
      if (!file) throw new Error("choose a reference audio file, or a saved voice");
      const fields = { ref_audio: await readDataUri(file) };
      if ($("x-vector-only").checked) fields.x_vector_only_mode = true;
      else fields.ref_text = $("ref-text").value;
      return fields;
    }

    // The session's voice settings: a saved voice by name, or the reference file's fields.
    async sessionFields() {
      const picked = this.$("voice").value;
      return picked === FROM_FILE ? this.referenceFields() : { voice: picked };
    }

    async save() {
      const $ = this.$, status = $("voice-status");
      try {
        const name = $("voice-name").value.trim();
        if (!name) throw new Error("name the voice");
        const body = { name, ...await this.referenceFields() };
        body.audio = body.ref_audio;
        delete body.ref_audio;
        status.textContent = "saving…";
        const response = await fetch(this.config.voices_path, {
          method: "POST", headers: { "Content-Type": "application/json", ...this.authHeaders() },
          body: JSON.stringify(body),
        });
        const answer = await response.json();
        if (response.status !== 201) throw new Error(`${answer.error.code}: ${answer.error.message}`);
        await this.list(answer.id);
        status.textContent = `saved “${answer.id}”`;
      } catch (error) {
        status.textContent = `not saved: ${error.message}`;
      }
    }
  }

  window.voxmeshParts = { ...window.voxmeshParts, ClonedVoices };
})();
