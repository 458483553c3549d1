// Settings panel: sampling parameters, max tokens, system prompt; persisted on every change,
// reset to defaults; plus the API key field. Preset prompts for the composer live here too.

import { DEFAULT_SETTINGS, clampSetting, loadSettings, saveSettings, apiKey } from './store.js';

export const PRESETS = {
  summarize: 'Summarize the following text in a few bullet points:\n\n',
  translate: 'Translate the following text into English:\n\n',
  code: 'Write a function in Python that ',
  explain: 'Explain in simple terms: ',
};

export class SettingsPanel {
  constructor(root, { onApiKey }) {
    this.root = root;
    this.values = loadSettings();
    this.inputs = [...root.querySelectorAll('[data-setting]')];
    for (const input of this.inputs) {
      input.addEventListener('input', () => this.onInput(input));
      input.addEventListener('change', () => this.onChange(input));
    }
    root.querySelector('#settings-reset').addEventListener('click', () => this.reset());
    const key = root.querySelector('#set-apikey');
    key.value = apiKey.get();
    root.querySelector('#apikey-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      apiKey.set(key.value);
      onApiKey?.();
    });
    this.fill();
  }

  fill() {
    for (const input of this.inputs) input.value = String(this.values[input.dataset.setting]);
    this.showOutputs();
  }

  showOutputs() {
    for (const name of ['temperature', 'topk', 'topp']) {
      const out = this.root.querySelector(`#out-${name}`);
      if (out) out.textContent = String(this.values[name]);
    }
  }

  onInput(input) {
    const name = input.dataset.setting;
    if (name === 'system') this.values.system = input.value;
    else if (input.type === 'range') this.values[name] = clampSetting(name, input.value);
    else if (input.value !== '') this.values[name] = clampSetting(name, input.value);
    this.showOutputs();
    saveSettings(this.values);
  }

  onChange(input) {
    // Number fields: show the clamped value once the user leaves the field.
    const name = input.dataset.setting;
    if (name !== 'system') input.value = String(this.values[name]);
  }

  reset() {
    this.values = { ...DEFAULT_SETTINGS };
    saveSettings(this.values);
    this.fill();
  }

  /** The request fields these settings give. */
  requestFields() {
    const v = this.values;
    return { temperature: v.temperature, topk: v.topk, topp: v.topp, max_tokens: v.max_tokens };
  }

  get system() { return this.values.system.trim(); }
}
