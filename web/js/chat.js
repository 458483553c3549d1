// Transcript view: message elements, streaming updates (one Markdown render per animation
// frame), typing indicator, tokens/s line, and auto-scroll that stops while the reader is
// scrolled up (a "Latest" button brings them back).

import { renderAnswer, renderPlain } from './render.js';

const NEAR_BOTTOM_PX = 48;

export class Transcript {
  constructor({ scroller, list, empty, jump }) {
    this.scroller = scroller;
    this.list = list;
    this.empty = empty;
    this.jump = jump;
    this.stick = true;
    this.lastTop = 0;
    scroller.addEventListener('scroll', () => this.onScroll(), { passive: true });
    jump.addEventListener('click', () => { this.stick = true; this.scrollToEnd(); });
  }

  onScroll() {
    const s = this.scroller;
    const atBottom = s.scrollHeight - s.scrollTop - s.clientHeight <= NEAR_BOTTOM_PX;
    // Moving up always releases the stick; reaching the bottom again restores it.
    if (s.scrollTop < this.lastTop - 2 && !atBottom) this.stick = false;
    if (atBottom) this.stick = true;
    this.lastTop = s.scrollTop;
    this.jump.hidden = this.stick;
  }

  scrollToEnd() {
    this.scroller.scrollTop = this.scroller.scrollHeight;
    this.lastTop = this.scroller.scrollTop;
    this.jump.hidden = true;
  }

  follow() {
    if (this.stick) this.scrollToEnd(); else this.jump.hidden = false;
  }

  clear() {
    this.list.replaceChildren();
    this.empty.hidden = false;
    this.stick = true;
    this.jump.hidden = true;
  }

  /** Show a whole conversation. */
  show(conversation) {
    this.clear();
    for (const m of conversation.messages) this.add(m);
    this.stick = true;
    this.scrollToEnd();
  }

  /** Append one message; returns its view (for streaming updates). */
  add(message) {
    this.empty.hidden = true;
    const view = new MessageView(message);
    this.list.append(view.el);
    this.follow();
    return view;
  }
}

export class MessageView {
  constructor(message) {
    this.message = message;
    this.frame = 0;
    const el = document.createElement('article');
    el.className = `msg ${message.role}`;
    el.dataset.role = message.role;
    const who = document.createElement('div');
    who.className = 'who';
    who.textContent = message.role === 'user' ? 'You' : message.role === 'assistant' ? 'Assistant' : message.role;
    this.body = document.createElement('div');
    this.body.className = message.role === 'assistant' ? 'body markdown' : 'body plain';
    this.meta = document.createElement('div');
    this.meta.className = 'meta';
    this.meta.dataset.testid = 'meta';
    const actions = document.createElement('div');
    actions.className = 'actions';
    actions.append(actionButton('copy', 'Copy', 'Copy this message'));
    if (message.role === 'assistant') actions.append(actionButton('regenerate', 'Regenerate', 'Answer again'));
    el.append(who, this.body, this.meta, actions);
    this.el = el;
    this.render();
    this.renderMeta();
  }

  render() {
    if (this.message.role === 'assistant') renderAnswer(this.body, this.message.content);
    else renderPlain(this.body, this.message.content);
  }

  /** Mark as generating: typing indicator until the first token, cursor while streaming. */
  setStreaming(on) {
    this.el.classList.toggle('streaming', on);
    this.el.setAttribute('aria-busy', on ? 'true' : 'false');
    if (on && !this.message.content) this.body.replaceChildren(typingIndicator());
  }

  /** Re-render at most once per animation frame while tokens arrive. */
  update(onRendered) {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.render();
      this.renderMeta();
      onRendered?.();
    });
  }

  flush() {
    if (this.frame) cancelAnimationFrame(this.frame);
    this.frame = 0;
    this.render();
    this.renderMeta();
  }

  renderMeta() {
    const s = this.message.stats;
    if (this.message.role !== 'assistant' || !s) { this.meta.replaceChildren(); return; }
    const bits = [];
    if (s.model) bits.push(s.model);
    if (s.tokens != null) bits.push(`${s.tokens} token${s.tokens === 1 ? '' : 's'}`);
    if (s.tps) bits.push(`${s.tps.toFixed(1)} tok/s`);
    if (s.ttft_ms != null) bits.push(`first token ${Math.round(s.ttft_ms)} ms`);
    if (s.stopped) bits.push('stopped');
    if (s.finish && s.finish !== 'stop' && !s.stopped) bits.push(`finish: ${s.finish}`);
    this.meta.textContent = bits.join(' · ');
    if (s.error) {
      const err = document.createElement('span');
      err.className = 'msg-error';
      err.textContent = ` — ${s.error}`;
      this.meta.append(err);
    }
  }
}

function actionButton(action, label, title) {
  const b = document.createElement('button');
  b.type = 'button';
  b.className = `msg-action ${action}`;
  b.dataset.action = action;
  b.title = title;
  b.textContent = label;
  return b;
}

function typingIndicator() {
  const t = document.createElement('span');
  t.className = 'typing';
  t.setAttribute('aria-label', 'Assistant is typing');
  t.dataset.testid = 'typing';
  for (let i = 0; i < 3; i++) t.append(document.createElement('i'));
  return t;
}
