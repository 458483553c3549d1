// Conversation export: JSON (lossless, re-importable data) and Markdown (for reading),
// handed to the browser as a file download.

const ROLE_TITLE = { user: 'User', assistant: 'Assistant', system: 'System' };

export function toJson(conversations) {
  return JSON.stringify({ format: 'quarrel.conversations', version: 1, conversations }, null, 2) + '\n';
}

function stamp(ms) {
  return ms ? new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC') : '';
}

export function toMarkdown(c) {
  const out = [`# ${c.title || 'Conversation'}`, ''];
  const meta = [];
  if (c.model) meta.push(`- Model: ${c.model}`);
  if (c.created) meta.push(`- Started: ${stamp(c.created)}`);
  if (c.system) meta.push(`- System prompt: ${c.system.replace(/\n/g, ' ')}`);
  if (meta.length) out.push(...meta, '');
  for (const m of c.messages) {
    out.push(`## ${ROLE_TITLE[m.role] || m.role}`, '', m.content.trimEnd(), '');
    const s = m.stats;
    if (m.role === 'assistant' && s) {
      const bits = [];
      if (s.tokens != null) bits.push(`${s.tokens} tokens`);
      if (s.tps) bits.push(`${s.tps.toFixed(1)} tokens/s`);
      if (s.stopped) bits.push('stopped');
      if (s.error) bits.push(`error: ${s.error}`);
      if (bits.length) out.push(`*${bits.join(' · ')}*`, '');
    }
  }
  return out.join('\n');
}

export function fileName(c, ext) {
  const base = (c.title || 'conversation').toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '');
  return `${base.slice(0, 40) || 'conversation'}.${ext}`;
}

export function download(name, text, mime) {
  const url = URL.createObjectURL(new Blob([text], { type: mime }));
  const a = document.createElement('a');
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}
