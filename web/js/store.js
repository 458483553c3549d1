// Persistent client state in localStorage: settings, conversations, API key, theme.
// Every read tolerates missing or corrupt data (falls back to defaults), every write
// tolerates a full or disabled storage (the page keeps working in memory).

const K = {
  settings: 'quarrel.settings.v1',
  conversations: 'quarrel.conversations.v1',
  current: 'quarrel.current.v1',
  apiKey: 'quarrel.apiKey',
  theme: 'quarrel.theme',
  model: 'quarrel.model',
};

export const DEFAULT_SETTINGS = Object.freeze({
  temperature: 0.8,
  topk: 40,
  topp: 0.95,
  max_tokens: 512,
  system: '',
});

// Ranges the settings panel enforces (issue 8: temperature 0-2, top-k 1-100, top-p 0-1).
export const LIMITS = Object.freeze({
  temperature: { min: 0, max: 2, step: 0.05 },
  topk: { min: 1, max: 100, step: 1 },
  topp: { min: 0, max: 1, step: 0.01 },
  max_tokens: { min: 1, max: 32768, step: 1 },
});

function readJson(key, fallback) {
  try {
    const raw = localStorage.getItem(key);
    return raw === null ? fallback : JSON.parse(raw);
  } catch {
    return fallback;
  }
}

function writeJson(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
    return true;
  } catch {
    return false;
  }
}

function readString(key) {
  try { return localStorage.getItem(key) || ''; } catch { return ''; }
}

function writeString(key, value) {
  try {
    if (value) localStorage.setItem(key, value); else localStorage.removeItem(key);
  } catch { /* storage disabled: keep in memory only */ }
}

/** Clamp a numeric setting into its range; non-numbers give the default. */
export function clampSetting(name, value) {
  const lim = LIMITS[name];
  const n = Number(value);
  if (!lim || !Number.isFinite(n)) return DEFAULT_SETTINGS[name];
  const v = Math.min(lim.max, Math.max(lim.min, n));
  return lim.step >= 1 ? Math.round(v) : v;
}

export function loadSettings() {
  const s = readJson(K.settings, {});
  const out = { ...DEFAULT_SETTINGS };
  if (s && typeof s === 'object') {
    for (const name of Object.keys(LIMITS)) if (name in s) out[name] = clampSetting(name, s[name]);
    if (typeof s.system === 'string') out.system = s.system;
  }
  return out;
}

export function saveSettings(s) { writeJson(K.settings, s); }

export const apiKey = {
  get: () => readString(K.apiKey),
  set: (v) => writeString(K.apiKey, v.trim()),
};

export const theme = {
  get: () => { const t = readString(K.theme); return t === 'dark' || t === 'light' ? t : 'auto'; },
  set: (t) => writeString(K.theme, t === 'auto' ? '' : t),
};

export const preferredModel = {
  get: () => readString(K.model),
  set: (m) => writeString(K.model, m),
};

function newId() {
  if (globalThis.crypto?.randomUUID) return crypto.randomUUID();
  return `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 10)}`;
}

function validConversation(c) {
  return c && typeof c === 'object' && typeof c.id === 'string' && Array.isArray(c.messages);
}

/** Conversations, newest first, kept in one localStorage entry. */
export class Conversations {
  constructor() {
    const list = readJson(K.conversations, []);
    this.items = Array.isArray(list) ? list.filter(validConversation) : [];
    this.sort();
  }

  sort() { this.items.sort((a, b) => (b.updated || 0) - (a.updated || 0)); }

  persist() { return writeJson(K.conversations, this.items); }

  create(model) {
    const now = Date.now();
    const c = { id: newId(), title: '', model: model || '', created: now, updated: now, messages: [] };
    this.items.unshift(c);
    return c;
  }

  get(id) { return this.items.find((c) => c.id === id) || null; }

  /** Save a conversation (new or changed); empty ones are not stored. */
  save(c) {
    c.updated = Date.now();
    if (!c.title) {
      const first = c.messages.find((m) => m.role === 'user');
      if (first) c.title = titleFrom(first.content);
    }
    if (!this.items.includes(c)) this.items.unshift(c);
    this.sort();
    const stored = this.items.filter((x) => x.messages.length > 0);
    return writeJson(K.conversations, stored);
  }

  remove(id) {
    this.items = this.items.filter((c) => c.id !== id);
    this.persist();
  }

  clear() {
    this.items = [];
    this.persist();
  }

  /**
   * Add conversations from an export (`toJson`'s shape, or a bare list). Invalid entries are
   * skipped; an id already present gets a new one. Returns how many were added.
   */
  importData(data) {
    const list = Array.isArray(data) ? data : data?.conversations;
    if (!Array.isArray(list)) throw new Error('not a Quarrel conversations export');
    let added = 0;
    for (const c of list) {
      if (!validConversation(c)) continue;
      const messages = c.messages
        .filter((m) => m && typeof m.content === 'string' && ['user', 'assistant', 'system'].includes(m.role))
        .map((m) => ({ role: m.role, content: m.content, ...(m.stats && typeof m.stats === 'object' ? { stats: { ...m.stats, done: true } } : {}) }));
      if (!messages.length) continue;
      const conv = {
        id: this.get(c.id) ? newId() : c.id,
        title: typeof c.title === 'string' ? c.title : '',
        model: typeof c.model === 'string' ? c.model : '',
        created: Number(c.created) || Date.now(),
        updated: Number(c.updated) || Date.now(),
        messages,
      };
      if (typeof c.system === 'string') conv.system = c.system;
      this.items.push(conv);
      added++;
    }
    this.sort();
    if (!this.persist()) throw new Error('browser storage is full or disabled');
    return added;
  }

  /** Conversations whose title or any message contains every word of `query` (case-insensitive). */
  search(query) {
    const words = query.toLowerCase().split(/\s+/).filter(Boolean);
    const withMessages = this.items.filter((c) => c.messages.length > 0);
    if (!words.length) return withMessages;
    return withMessages.filter((c) => {
      const hay = (c.title + '\n' + c.messages.map((m) => m.content).join('\n')).toLowerCase();
      return words.every((w) => hay.includes(w));
    });
  }

  get currentId() { return readString(K.current); }
  set currentId(id) { writeString(K.current, id); }
}

export function titleFrom(text) {
  const line = text.trim().split('\n')[0].replace(/\s+/g, ' ');
  return line.length > 60 ? line.slice(0, 57) + '...' : line || 'New chat';
}
