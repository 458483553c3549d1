// Quarrel web chat: wiring of the page.
//
//   composer ──► send() ──► Connection.infer(messages + settings) ──► /ws
//                                   │ tokens
//   Transcript ◄── MessageView.update ◄┘ ──► Conversations.save (localStorage)
//
// | module      | role                                                      |
// |-------------|-----------------------------------------------------------|
// | ws.js       | WebSocket protocol client, reconnect, heartbeat           |
// | api.js      | REST: model list, load / unload                           |
// | store.js    | localStorage: settings, conversations, key, theme         |
// | render.js   | Markdown + highlighting + sanitizing (untrusted output)   |
// | chat.js     | transcript view, streaming, auto-scroll                   |
// | sidebar.js  | conversation and model lists                              |
// | settings.js | settings panel, presets                                   |
// | export.js   | JSON / Markdown export                                    |

import { Connection } from './ws.js';
import { listModels, loadModel, unloadModel } from './api.js';
import { Conversations, apiKey, theme, preferredModel } from './store.js';
import { Transcript } from './chat.js';
import { copyText, wireCodeCopy } from './render.js';
import { renderConversationList, renderModelList } from './sidebar.js';
import { SettingsPanel, PRESETS } from './settings.js';
import { toJson, toMarkdown, fileName, download } from './export.js';

const $ = (sel) => document.querySelector(sel);

const ui = {
  conn: $('#conn'), connLabel: $('#conn .conn-label'), modelSelect: $('#model-select'),
  input: $('#input'), send: $('#send'), stop: $('#stop'), composer: $('#composer'),
  banner: $('#banner'), bannerCode: $('#banner-code'), bannerMsg: $('#banner-msg'),
  keyForm: $('#key-form'), keyInput: $('#key-input'),
  convList: $('#conv-list'), search: $('#search'), modelList: $('#model-list'),
  sidebar: $('#sidebar'), scrim: $('#scrim'), settings: $('#settings'),
};

const store = new Conversations();
let current = store.get(store.currentId) || store.create(preferredModel.get());
let models = [];
const busyModels = new Set();
let serverDefaultModel = '';
let generating = null; // { id, msg, view, t0, tFirst }

const transcript = new Transcript({
  scroller: $('#transcript'), list: $('#messages'), empty: $('#empty'), jump: $('#jump'),
});
wireCodeCopy($('#messages'));

const settings = new SettingsPanel(ui.settings, { onApiKey: () => { conn.restart(); refreshModels(); } });
const conn = new Connection(() => apiKey.get());

// ---------- theme ----------
function applyTheme() {
  const t = theme.get();
  if (t === 'auto') delete document.documentElement.dataset.theme;
  else document.documentElement.dataset.theme = t;
  $('#theme-toggle').title = `Theme: ${t} (click to change)`;
}
$('#theme-toggle').addEventListener('click', () => {
  const order = ['auto', 'dark', 'light'];
  theme.set(order[(order.indexOf(theme.get()) + 1) % order.length]);
  applyTheme();
});
applyTheme();

// ---------- connection state ----------
function showState() {
  const state = generating && conn.state === 'connected' ? 'generating' : conn.state;
  if (conn.state === 'connected') ui.conn.title = 'Connected to the server';
  ui.conn.dataset.state = state;
  ui.connLabel.textContent = state;
}
conn.addEventListener('state', () => {
  showState();
  if (conn.state === 'connected') {
    if (ui.banner.dataset.kind === 'connection') hideBanner();
    refreshModels();
  }
});
conn.addEventListener('retry', async (ev) => {
  ui.conn.title = `Reconnecting in ${(ev.detail.delay / 1000).toFixed(1)} s (attempt ${ev.detail.attempt})`;
  // Repeated failures: the REST side tells whether a key is missing (a browser cannot see the
  // HTTP status of a refused WebSocket upgrade).
  if (ev.detail.attempt === 2 || ev.detail.attempt % 5 === 0) {
    try { await listModels(); } catch (e) {
      if (e.code === 'UNAUTHORIZED' || e.status === 401) showBanner(e.code, e.message, 'auth');
    }
  }
});
conn.addEventListener('status', (ev) => {
  const p = ev.detail || {};
  const def = p.default_model || p.model || (Array.isArray(p.models) && p.models.length ? (p.models[0].name || p.models[0]) : '');
  if (typeof def === 'string' && def && def !== serverDefaultModel) {
    serverDefaultModel = def;
    fillModelSelect();
  }
});
conn.addEventListener('server-error', (ev) => showBanner(ev.detail.code, ev.detail.message));

// ---------- banner ----------
function showBanner(code, message, kind = '') {
  ui.bannerCode.textContent = code || 'Error';
  ui.bannerMsg.textContent = message || '';
  const auth = kind === 'auth' || code === 'UNAUTHORIZED';
  ui.keyForm.hidden = !auth;
  ui.banner.dataset.kind = auth ? 'auth' : kind;
  ui.banner.hidden = false;
  if (auth) ui.keyInput.focus();
}
function hideBanner() { ui.banner.hidden = true; ui.banner.dataset.kind = ''; }
$('#banner-close').addEventListener('click', hideBanner);
ui.keyForm.addEventListener('submit', (ev) => {
  ev.preventDefault();
  apiKey.set(ui.keyInput.value);
  $('#set-apikey').value = apiKey.get();
  ui.keyInput.value = '';
  hideBanner();
  conn.restart();
  refreshModels();
});

// ---------- models ----------
async function refreshModels() {
  try {
    const r = await listModels();
    models = r.models;
    if (r.default) serverDefaultModel = r.default;
  } catch (e) {
    if (e.code === 'UNAUTHORIZED') showBanner(e.code, e.message, 'auth');
    ui.modelList.replaceChildren(Object.assign(document.createElement('li'), { className: 'muted', textContent: e.message }));
    return;
  }
  renderModels();
  fillModelSelect();
}

function renderModels() {
  renderModelList(ui.modelList, models, busyModels, {
    onLoad: (n) => modelAction(n, loadModel),
    onUnload: (n) => modelAction(n, unloadModel),
  });
}

async function modelAction(name, fn) {
  busyModels.add(name);
  renderModels();
  try {
    await fn(name);
  } catch (e) {
    showBanner(e.code, e.message, e.code === 'UNAUTHORIZED' ? 'auth' : '');
  } finally {
    busyModels.delete(name);
    await refreshModels();
  }
}

function fillModelSelect() {
  const sel = ui.modelSelect;
  const want = current.model || '';
  sel.replaceChildren();
  const def = document.createElement('option');
  def.value = '';
  def.textContent = serverDefaultModel ? `${serverDefaultModel} (default)` : '(server default)';
  sel.append(def);
  const names = models.map((m) => m.name);
  if (want && !names.includes(want)) names.push(want);
  for (const n of names) {
    const m = models.find((x) => x.name === n);
    const o = document.createElement('option');
    o.value = n;
    o.textContent = m ? `${n}${m.loaded ? '' : ' (not loaded)'}` : `${n} (unavailable)`;
    sel.append(o);
  }
  sel.value = want;
}

ui.modelSelect.addEventListener('change', () => {
  current.model = ui.modelSelect.value;
  preferredModel.set(current.model);
  if (current.messages.length) store.save(current);
});
$('#refresh-models').addEventListener('click', refreshModels);

// ---------- conversations ----------
function renderConversations() {
  renderConversationList(ui.convList, store.search(ui.search.value), current.id, {
    onOpen: (id) => { openConversation(id); closeSidebarIfNarrow(); },
    onDelete: (id) => {
      store.remove(id);
      if (id === current.id) newConversation(); else renderConversations();
    },
  });
}

function openConversation(id) {
  const c = store.get(id);
  if (!c || generating) return;
  current = c;
  store.currentId = c.id;
  transcript.show(c);
  fillModelSelect();
  renderConversations();
}

function newConversation() {
  if (generating) return;
  current = store.create(preferredModel.get());
  store.currentId = current.id;
  transcript.clear();
  fillModelSelect();
  renderConversations();
  ui.input.focus();
}

$('#new-chat').addEventListener('click', () => { newConversation(); closeSidebarIfNarrow(); });
ui.search.addEventListener('input', renderConversations);
$('#export-md').addEventListener('click', () => download(fileName(current, 'md'), toMarkdown(current), 'text/markdown'));
$('#export-json').addEventListener('click', () => download(fileName(current, 'json'), toJson([current]), 'application/json'));
$('#export-all').addEventListener('click', () => download('quarrel-conversations.json', toJson(store.search('')), 'application/json'));
$('#import').addEventListener('click', () => $('#import-file').click());
$('#import-file').addEventListener('change', async (ev) => {
  const file = ev.target.files?.[0];
  ev.target.value = '';
  if (!file) return;
  try {
    const n = store.importData(JSON.parse(await file.text()));
    renderConversations();
    showBanner('Imported', `${n} conversation${n === 1 ? '' : 's'} added.`, 'info');
  } catch (e) {
    showBanner('Import failed', `${file.name}: ${e.message}`);
  }
});
$('#clear-all').addEventListener('click', () => {
  if (generating || !confirm('Delete all conversations?')) return;
  store.clear();
  newConversation();
});

// ---------- sending ----------
function setGenerating(g) {
  generating = g;
  document.body.classList.toggle('is-generating', !!g);
  ui.input.disabled = !!g;
  ui.send.hidden = !!g;
  ui.stop.hidden = !g;
  showState();
  if (!g) ui.input.focus();
}

function requestMessages() {
  const msgs = [];
  const system = settings.system;
  if (system) msgs.push({ role: 'system', content: system });
  for (const m of current.messages) {
    if (m.role === 'assistant' && !m.content) continue;
    msgs.push({ role: m.role, content: m.content });
  }
  return msgs;
}

function send(text) {
  if (generating || !text.trim()) return;
  if (conn.state !== 'connected') {
    showBanner('Not connected', 'The server is not reachable yet; your message was kept.', 'connection');
    return;
  }
  hideBanner();
  const user = { role: 'user', content: text };
  current.messages.push(user);
  transcript.add(user);
  if (generate()) {
    ui.input.value = '';
    autosize();
  }
}

/** Answer again: drop the last answer and generate a new one for the same history. */
function regenerate() {
  const last = current.messages[current.messages.length - 1];
  if (generating || !last || last.role !== 'assistant') return;
  if (conn.state !== 'connected') {
    showBanner('Not connected', 'The server is not reachable yet.', 'connection');
    return;
  }
  current.messages.pop();
  transcript.list.lastElementChild?.remove();
  generate();
}

/** Stream an answer to the conversation as it stands; false when it could not be sent. */
function generate() {
  if (settings.system) current.system = settings.system;
  const payload = { messages: requestMessages(), ...settings.requestFields() };
  if (current.model) payload.model = current.model;
  const msg = { role: 'assistant', content: '', stats: { model: current.model || serverDefaultModel, tokens: 0 } };
  current.messages.push(msg);
  store.save(current);
  store.currentId = current.id;
  renderConversations();
  const view = transcript.add(msg);
  view.setStreaming(true);
  const g = { id: null, conv: current, msg, view, t0: performance.now(), tFirst: 0 };
  g.id = conn.infer(payload, {
    onToken: (p) => {
      if (generating !== g) return;
      // `token` may be "" (bytes of a character or a possible stop string held back), and
      // `token_id` null for a final flush of held-back text.
      if (p.token_id != null) {
        if (!g.tFirst) { g.tFirst = performance.now(); msg.stats.ttft_ms = g.tFirst - g.t0; }
        msg.stats.tokens += 1;
      }
      if (typeof p.token === 'string') msg.content += p.token;
      msg.stats.tps = Number(p.tokens_per_sec) || clientRate(g);
      if (p.token) view.update(() => transcript.follow());
    },
    onDone: (p) => finish(g, p),
    onError: (e) => finish(g, null, e),
  });
  if (!g.id) { finish(g, null, { code: 'DISCONNECTED', message: 'Not connected.' }); return false; }
  setGenerating(g);
  return true;
}

function clientRate(g) {
  const n = g.msg.stats.tokens;
  const dt = (performance.now() - g.tFirst) / 1000;
  return n > 1 && dt > 0 ? (n - 1) / dt : 0;
}

function finish(g, done, err) {
  if (g.finished) return;
  g.finished = true;
  const s = g.msg.stats;
  if (done) {
    const tps = Number(done.tokens_per_sec);
    if (tps > 0) s.tps = tps;
    const n = done.usage?.completion_tokens;
    if (Number.isInteger(n)) s.tokens = n;
    if (done.finish_reason) s.finish = done.finish_reason;
    if (done.finish_reason === 'cancelled') s.stopped = true;
    if (typeof done.ttft_ms === 'number') s.ttft_ms = done.ttft_ms;
    if (typeof done.model === 'string' && done.model) s.model = done.model;
    // The final message carries the whole answer: it is the reference for what was said.
    if (typeof done.text === 'string') g.msg.content = done.text;
  }
  if (err) {
    s.error = `${err.code}: ${err.message}`;
    if (err.code !== 'DISCONNECTED') showBanner(err.code, err.message);
  }
  s.done = true;
  g.view.setStreaming(false);
  g.view.flush();
  transcript.follow();
  if (!store.save(g.conv)) {
    showBanner('STORAGE', 'Could not save the conversation: this browser\'s storage is full or disabled. Export and clear old conversations.');
  }
  renderConversations();
  if (generating === g) setGenerating(null);
}

function stop() {
  const g = generating;
  if (!g) return;
  conn.cancel(g.id);
  g.msg.stats.stopped = true;
  finish(g, null, null);
}

$('#messages').addEventListener('click', async (ev) => {
  const btn = ev.target.closest('button[data-action]');
  if (!btn) return;
  const article = btn.closest('.msg');
  const index = [...$('#messages').children].indexOf(article);
  const message = current.messages[index];
  if (!message) return;
  if (btn.dataset.action === 'regenerate') regenerate();
  if (btn.dataset.action === 'copy') await copyText(btn, message.content);
});
ui.composer.addEventListener('submit', (ev) => { ev.preventDefault(); send(ui.input.value); });
ui.stop.addEventListener('click', stop);
ui.input.addEventListener('keydown', (ev) => {
  if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
    ev.preventDefault();
    send(ui.input.value);
  }
});
document.addEventListener('keydown', (ev) => {
  if (ev.key === 'Escape' && generating) stop();
});

function autosize() {
  ui.input.style.height = 'auto';
  ui.input.style.height = `${Math.min(ui.input.scrollHeight, 240)}px`;
}
ui.input.addEventListener('input', autosize);

for (const b of document.querySelectorAll('[data-preset]')) {
  b.addEventListener('click', () => {
    if (generating) return;
    const text = PRESETS[b.dataset.preset];
    const rest = ui.input.value.trim();
    ui.input.value = rest ? `${text}${rest}` : text;
    autosize();
    ui.input.focus();
    ui.input.setSelectionRange(ui.input.value.length, ui.input.value.length);
  });
}

// ---------- panels ----------
const narrow = () => matchMedia('(max-width: 899px)').matches;
function setSidebar(open) {
  document.body.classList.toggle('sidebar-open', open);
  $('#sidebar-toggle').setAttribute('aria-expanded', String(open));
  ui.scrim.hidden = !(open && narrow()) && ui.settings.hidden;
}
function closeSidebarIfNarrow() { if (narrow()) setSidebar(false); }
function setSettings(open) {
  ui.settings.hidden = !open;
  $('#settings-toggle').setAttribute('aria-expanded', String(open));
  ui.scrim.hidden = !open && !(document.body.classList.contains('sidebar-open') && narrow());
}
$('#sidebar-toggle').addEventListener('click', () => {
  // Wide screens show the sidebar by default: the toggle hides it there.
  const open = narrow() ? !document.body.classList.contains('sidebar-open') : document.body.classList.contains('sidebar-hidden');
  if (narrow()) setSidebar(open);
  else document.body.classList.toggle('sidebar-hidden', !open);
});
$('#settings-toggle').addEventListener('click', () => setSettings(ui.settings.hidden));
$('#settings-close').addEventListener('click', () => setSettings(false));
ui.scrim.addEventListener('click', () => { setSidebar(false); setSettings(false); });

// ---------- start ----------
// Answers that were streaming when the page went away are marked, not left looking empty.
for (const c of store.items) {
  for (const m of c.messages) {
    if (m.role === 'assistant' && m.stats && !m.stats.done && !m.stats.error) {
      m.stats.error = 'interrupted (the page was closed while generating)';
      m.stats.done = true;
    }
  }
}
store.currentId = current.id;
transcript.show(current);
renderConversations();
fillModelSelect();
showState();
conn.start();
refreshModels();
setInterval(() => { if (conn.state === 'connected') refreshModels(); }, 30_000);
ui.input.focus();

// For the browser tests and for debugging in the console: the same render path the stream uses.
window.quarrel = { conn, store, get current() { return current; } };
