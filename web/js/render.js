// Model output -> safe DOM. One path for streamed and stored answers:
//   text ─► marked (raw HTML tokens escaped: shown as text) ─► highlight.js on code blocks
//        ─► DOMPurify (allow-list, second line of defence) ─► element.replaceChildren(fragment)
// Model output is untrusted: nothing it contains may become markup, a script or a remote fetch.

import { Marked } from '../vendor/marked.esm.js';
import DOMPurify from '../vendor/purify.es.mjs';
import hljs from '../vendor/highlight.min.js';

const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
export const escapeHtml = (s) => String(s).replace(/[&<>"']/g, (c) => ESC[c]);

const MAX_AUTO_HIGHLIGHT = 20_000;

function highlight(code, lang) {
  const language = (lang || '').trim().split(/\s+/)[0].toLowerCase();
  try {
    if (language && hljs.getLanguage(language)) {
      return { html: hljs.highlight(code, { language, ignoreIllegals: true }).value, language };
    }
    if (!language && code.length <= MAX_AUTO_HIGHLIGHT) {
      const r = hljs.highlightAuto(code);
      if (r.relevance >= 5) return { html: r.value, language: r.language || '' };
    }
  } catch { /* fall through to plain text */ }
  return { html: escapeHtml(code), language };
}

const marked = new Marked({
  gfm: true,
  breaks: true,
  renderer: {
    // Raw HTML in the model's Markdown is shown as the text it is.
    html({ text }) { return escapeHtml(text); },
    code({ text, lang }) {
      const { html, language } = highlight(text.replace(/\n$/, ''), lang);
      const label = language ? `<span class="code-lang">${escapeHtml(language)}</span>` : '';
      return `<div class="code-block"><div class="code-head">${label}` +
        `<button type="button" class="copy-code" title="Copy code">Copy</button></div>` +
        `<pre><code class="hljs">${html}</code></pre></div>`;
    },
    // No remote images (the CSP would block them anyway): show a link instead.
    image({ href, text }) {
      return `<a href="${escapeHtml(href || '')}">${escapeHtml(text || href || 'image')}</a>`;
    },
  },
});

const PURIFY = {
  ALLOWED_TAGS: ['a', 'b', 'blockquote', 'br', 'button', 'code', 'del', 'div', 'em', 'h1', 'h2', 'h3',
    'h4', 'h5', 'h6', 'hr', 'i', 'input', 'li', 'ol', 'p', 'pre', 's', 'span', 'strong', 'sub', 'sup',
    'table', 'tbody', 'td', 'th', 'thead', 'tr', 'ul'],
  ALLOWED_ATTR: ['href', 'title', 'class', 'type', 'checked', 'disabled', 'align', 'start'],
  ALLOWED_URI_REGEXP: /^(?:https?:|mailto:|#)/i,
  RETURN_DOM_FRAGMENT: true,
};

DOMPurify.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'A' && node.hasAttribute('href')) {
    node.setAttribute('target', '_blank');
    node.setAttribute('rel', 'noopener noreferrer nofollow');
  }
  if (node.tagName === 'INPUT' && node.getAttribute('type') !== 'checkbox') node.remove();
});

/** Markdown text -> sanitized DocumentFragment. */
export function renderMarkdown(text) {
  let html;
  try {
    html = marked.parse(String(text ?? ''));
  } catch {
    html = `<p>${escapeHtml(text)}</p>`;
  }
  return DOMPurify.sanitize(html, { ...PURIFY, ADD_ATTR: ['target', 'rel'] });
}

/** Render into `el`, replacing its content. */
export function renderInto(el, text) {
  el.replaceChildren(renderMarkdown(text));
}

const THINK_OPEN = '<think>';
const THINK_CLOSE = '</think>';

/**
 * A reasoning model's answer: the `<think>` section it opens with (null when there is none),
 * whether that section is complete, and the answer after it.
 */
export function splitReasoning(text) {
  const t = String(text ?? '');
  const start = t.trimStart();
  if (!start.startsWith(THINK_OPEN)) return { reasoning: null, done: true, answer: t };
  const body = start.slice(THINK_OPEN.length);
  const end = body.indexOf(THINK_CLOSE);
  if (end < 0) return { reasoning: body.trim(), done: false, answer: '' };
  return { reasoning: body.slice(0, end).trim(), done: true, answer: body.slice(end + THINK_CLOSE.length).trimStart() };
}

/**
 * An assistant answer into `el`: reasoning collapsed in a <details> (kept open or closed as
 * the reader left it across re-renders while tokens stream), then the answer.
 */
export function renderAnswer(el, text) {
  const { reasoning, done, answer } = splitReasoning(text);
  if (reasoning === null) {
    renderInto(el, text);
    return;
  }
  const wasOpen = el.querySelector(':scope > details.reasoning')?.open ?? false;
  const details = document.createElement('details');
  details.className = 'reasoning';
  details.dataset.testid = 'reasoning';
  details.open = wasOpen;
  const summary = document.createElement('summary');
  summary.textContent = done ? 'Reasoning' : 'Reasoning…';
  const body = document.createElement('div');
  body.className = 'reasoning-body';
  body.append(renderMarkdown(reasoning));
  details.append(summary, body);
  el.replaceChildren(details, renderMarkdown(answer));
}

/** Plain text (user messages): no Markdown, line breaks kept by CSS. */
export function renderPlain(el, text) {
  el.textContent = text;
}

/** Copy buttons of code blocks, wired once on a container. */
export function wireCodeCopy(container) {
  container.addEventListener('click', async (ev) => {
    const btn = ev.target.closest('button.copy-code');
    if (!btn) return;
    const code = btn.closest('.code-block')?.querySelector('code');
    if (!code) return;
    await copyText(btn, code.textContent);
  });
}

/** Copy `text` to the clipboard; `btn` says whether it worked, then reads 'Copy' again. */
export async function copyText(btn, text) {
  try {
    await navigator.clipboard.writeText(text);
    btn.textContent = 'Copied';
  } catch {
    btn.textContent = 'Copy failed';
  }
  setTimeout(() => { btn.textContent = 'Copy'; }, 1500);
}
