// Sidebar views: the conversation list (search, open, delete) and the model list
// (status, parameters, quantization, memory; load / unload).

import { formatBytes, formatCount } from './api.js';

function relTime(ms) {
  if (!ms) return '';
  const d = (Date.now() - ms) / 1000;
  if (d < 60) return 'just now';
  if (d < 3600) return `${Math.floor(d / 60)} min ago`;
  if (d < 86400) return `${Math.floor(d / 3600)} h ago`;
  return new Date(ms).toLocaleDateString();
}

// `ul` redrawn with one `<li>` per item from `fill(li, item)`, or the one muted line
// `emptyText` where there are no items.
function renderList(ul, items, emptyText, fill) {
  ul.replaceChildren();
  if (!items.length) {
    const li = document.createElement('li');
    li.className = 'muted';
    li.textContent = emptyText;
    ul.append(li);
    return;
  }
  for (const item of items) {
    const li = document.createElement('li');
    fill(li, item);
    ul.append(li);
  }
}

export function renderConversationList(ul, items, currentId, { onOpen, onDelete }) {
  renderList(ul, items, 'No conversations', (li, c) => {
    li.className = 'conv' + (c.id === currentId ? ' current' : '');
    li.dataset.id = c.id;
    const open = document.createElement('button');
    open.type = 'button';
    open.className = 'conv-open';
    const title = document.createElement('span');
    title.className = 'conv-title';
    title.textContent = c.title || 'New chat';
    const when = document.createElement('span');
    when.className = 'conv-when';
    when.textContent = `${relTime(c.updated)} · ${c.messages.length} msg`;
    open.append(title, when);
    open.addEventListener('click', () => onOpen(c.id));
    const del = document.createElement('button');
    del.type = 'button';
    del.className = 'icon-btn conv-del';
    del.title = 'Delete conversation';
    del.setAttribute('aria-label', `Delete ${c.title || 'conversation'}`);
    del.textContent = '✕';
    del.addEventListener('click', () => onDelete(c.id));
    li.append(open, del);
  });
}

export function renderModelList(ul, models, busy, { onLoad, onUnload }) {
  renderList(ul, models, 'No models', (li, m) => {
    li.className = 'model' + (m.loaded ? ' loaded' : '');
    li.dataset.name = m.name;
    const head = document.createElement('div');
    head.className = 'model-head';
    const name = document.createElement('span');
    name.className = 'model-name';
    name.textContent = m.name;
    const badge = document.createElement('span');
    badge.className = 'badge' + (m.loaded ? ' ok' : '');
    badge.textContent = m.loaded ? 'loaded' : 'not loaded';
    head.append(name, badge);
    const facts = document.createElement('div');
    facts.className = 'model-facts';
    const bits = [];
    if (m.arch) bits.push(m.arch);
    if (m.parameters != null) bits.push(`${formatCount(m.parameters)} params`);
    if (m.quantization) bits.push(String(m.quantization));
    if (m.weights != null && m.kv != null) bits.push(`${formatBytes(m.weights)} + ${formatBytes(m.kv)} KV`);
    else if (m.memory != null) bits.push(formatBytes(m.memory));
    if (m.context) bits.push(`ctx ${m.context}`);
    facts.textContent = bits.join(' · ');
    const btn = document.createElement('button');
    btn.type = 'button';
    btn.className = 'btn small';
    btn.disabled = busy.has(m.name);
    btn.textContent = busy.has(m.name) ? '…' : m.loaded ? 'Unload' : 'Load';
    btn.addEventListener('click', () => (m.loaded ? onUnload(m.name) : onLoad(m.name)));
    li.append(head, facts, btn);
  });
}
