// End-to-end tests of the web chat UI (issue 8) in headless Chromium against a running
// `quarrel serve` with the default model. Run by tests/browser/run.sh (scripts/test.sh).

import { test, before, after, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { readFile, mkdtemp } from 'node:fs/promises';
import { execFileSync } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import {
  Server, freePort, launchBrowser, openPage, waitConnected, cspViolations, sendMessage, waitAnswer,
  GREEDY, OUT, BIN, SECOND_MODEL, secondModelDir,
} from './harness.mjs';

let server;
let browser;
const open = [];

before(async () => {
  server = new Server(await freePort(), ['--models-dir', secondModelDir()]);
  await server.start();
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await server?.kill();
});

async function page(opts = {}) {
  const p = await openPage(browser, server, { settings: GREEDY, ...opts });
  open.push(p);
  await waitConnected(p.page);
  return p;
}

// Every test: no uncaught page error, no CSP violation, no dialog other than the confirm it asked for.
afterEach(async (t) => {
  while (open.length) {
    const { context, page: pg, problems, dialogs } = open.pop();
    const csp = pg.isClosed() ? [] : await cspViolations(pg);
    await context.close();
    assert.deepEqual(problems, [], 'page errors');
    assert.deepEqual(csp, [], 'CSP violations');
    assert.ok(dialogs.every((d) => d.startsWith('confirm')), `unexpected dialogs: ${dialogs}`);
  }
});

test('the page is served with a same-origin Content-Security-Policy', async () => {
  const res = await fetch(server.url + '/');
  assert.equal(res.status, 200);
  const csp = res.headers.get('content-security-policy') || '';
  assert.match(csp, /default-src 'self'/);
  assert.match(csp, /script-src 'self'(;|$)/);
  assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval|\*/);
  assert.equal(res.headers.get('x-content-type-options'), 'nosniff');
});

test('a message gets a streamed answer with live tokens/s', async () => {
  const { page: pg } = await page();
  // Record every distinct text the answer shows while it streams.
  await pg.evaluate(() => {
    window.__seen = [];
    window.__states = new Set();
    new MutationObserver(() => {
      const last = [...document.querySelectorAll('.msg.assistant .body')].pop();
      const t = last ? last.textContent : '';
      if (t && window.__seen[window.__seen.length - 1] !== t) window.__seen.push(t);
      if (document.querySelector('.msg.assistant .typing')) window.__typing = true;
      window.__states.add(document.querySelector('#conn').dataset.state);
    }).observe(document.body, { subtree: true, childList: true, characterData: true, attributes: true });
  });
  // Shift+Enter makes a new line; nothing is sent.
  await pg.locator('#input').fill('line one');
  await pg.locator('#input').press('Shift+Enter');
  await pg.locator('#input').pressSequentially('line two');
  assert.equal(await pg.locator('#input').inputValue(), 'line one\nline two');
  assert.equal(await pg.locator('.msg').count(), 0, 'Shift+Enter sent nothing');
  await sendMessage(pg, 'Write three sentences about the ocean.');
  await pg.waitForFunction(() => document.querySelector('#conn').dataset.state === 'generating');
  assert.ok(await pg.locator('#input').isDisabled(), 'input is disabled while generating');
  assert.ok(await pg.locator('#stop').isVisible(), 'Stop is shown while generating');
  const answer = await waitAnswer(pg);
  const seen = await pg.evaluate(() => window.__seen);
  const states = await pg.evaluate(() => [...window.__states]);
  assert.ok(answer.text.trim().length > 20, `an answer arrived: ${JSON.stringify(answer.text)}`);
  assert.ok(seen.length >= 3, `text arrived in several steps (saw ${seen.length} versions)`);
  for (let i = 1; i < seen.length; i++) {
    assert.ok(seen[i].length >= seen[i - 1].length - 2, 'streamed text grows');
  }
  assert.ok(states.includes('generating'), `header showed generating (${states})`);
  assert.ok(await pg.evaluate(() => window.__typing), 'a typing indicator before the first token');
  assert.match(answer.meta, /\d+ tokens · [\d.]+ tok\/s/, `tokens/s under the answer: ${answer.meta}`);
  assert.ok(await pg.locator('#input').isEnabled(), 'input enabled again');
  assert.equal(await pg.locator('#conn').getAttribute('data-state'), 'connected');
});

test('auto-scroll stops when the reader scrolls up; Stop cancels the generation', async () => {
  const { page: pg } = await page({ settings: { ...GREEDY, max_tokens: 1000 }, viewport: { width: 1000, height: 360 } });
  await sendMessage(pg, 'Write a very long essay about the history of Rome.');
  const scroller = pg.locator('#transcript');
  await pg.waitForFunction(() => {
    const t = document.querySelector('#transcript');
    return t.scrollHeight > t.clientHeight + 150;
  }, null, { timeout: 90_000 });
  // While following, the view is pinned to the bottom.
  const pinned = await scroller.evaluate((t) => t.scrollHeight - t.scrollTop - t.clientHeight);
  assert.ok(pinned < 60, `follows the stream (${pinned}px from the bottom)`);
  await scroller.evaluate((t) => { t.scrollTop = t.scrollTop - 120; t.dispatchEvent(new Event('scroll')); });
  const top = await scroller.evaluate((t) => t.scrollTop);
  const h0 = await scroller.evaluate((t) => t.scrollHeight);
  await pg.waitForFunction((h) => document.querySelector('#transcript').scrollHeight > h + 40, h0, { timeout: 60_000 });
  assert.equal(await scroller.evaluate((t) => t.scrollTop), top, 'the view stays where the reader put it');
  assert.ok(await pg.locator('#jump').isVisible(), 'a "Latest" button is offered');
  await pg.locator('#jump').click();
  const back = await scroller.evaluate((t) => t.scrollHeight - t.scrollTop - t.clientHeight);
  assert.ok(back < 60, 'Latest returns to the bottom');
  await pg.locator('#stop').click();
  await pg.waitForFunction(() => !document.querySelector('.msg.assistant.streaming'));
  const stopped = await pg.evaluate(() => [...document.querySelectorAll('.msg.assistant')].pop().textContent);
  await pg.waitForTimeout(1500);
  const later = await pg.evaluate(() => [...document.querySelectorAll('.msg.assistant')].pop().textContent);
  assert.equal(later, stopped, 'no text arrives after Stop');
  assert.match(later, /stopped/, 'the answer is marked stopped');
  assert.ok(await pg.locator('#banner').isHidden(), 'no error shown for a stopped generation');
  assert.ok(await pg.locator('#input').isEnabled());
  assert.equal(await pg.locator('#conn').getAttribute('data-state'), 'connected');
  // The engine dropped it (nothing running), and the same socket serves the next message.
  let running = -1;
  for (let i = 0; i < 50 && running !== 0; i++) {
    const health = await (await fetch(`${server.url}/api/health`)).json();
    running = health.models.reduce((n, m) => n + m.running + m.queued, 0);
    if (running) await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(running, 0, 'the generation was cancelled on the server');
  await pg.locator('#new-chat').click();
  await sendMessage(pg, 'Say hello.');
  const next = await waitAnswer(pg, 90_000);
  assert.ok(next.text.trim().length > 0, 'next message answered');
});

test('settings are used (max tokens 5 gives a 5-token answer) and persisted', async () => {
  const { page: pg } = await page();
  await pg.locator('#settings-toggle').click();
  await pg.locator('#set-max_tokens').fill('5');
  await pg.locator('#set-max_tokens').blur();
  await pg.locator('#set-temperature').evaluate((el) => {
    el.value = '0';
    el.dispatchEvent(new Event('input', { bubbles: true }));
  });
  await pg.locator('#settings-close').click();
  await sendMessage(pg, 'Write a long story about a dragon who learns to fly.');
  const answer = await waitAnswer(pg);
  assert.match(answer.meta, /^(\S+ · )?5 tokens/, `five tokens generated: ${answer.meta}`);
  assert.ok(answer.text.trim().split(/\s+/).length <= 6, `short answer: ${JSON.stringify(answer.text)}`);
  // Regenerate replaces the answer (greedy: the same text again); Copy copies the Markdown.
  await pg.locator('.msg.assistant').last().hover();
  await pg.locator('.msg.assistant .regenerate').click();
  const again = await waitAnswer(pg);
  assert.equal(await pg.locator('.msg').count(), 2, 'still one question and one answer');
  assert.equal(again.text, answer.text, 'greedy regeneration gives the same answer');
  await pg.context().grantPermissions(['clipboard-read', 'clipboard-write']);
  await pg.locator('.msg.assistant').last().hover();
  await pg.locator('.msg.assistant .copy').click();
  const copied = await pg.evaluate(() => navigator.clipboard.readText());
  assert.equal(copied, await pg.evaluate(() => window.quarrel.current.messages[1].content), 'copied the answer');
  await pg.reload();
  await waitConnected(pg);
  await pg.locator('#settings-toggle').click();
  assert.equal(await pg.locator('#set-max_tokens').inputValue(), '5', 'max tokens kept across reload');
  assert.equal(await pg.locator('#set-temperature').inputValue(), '0');
  await pg.locator('#settings-reset').click();
  assert.equal(await pg.locator('#set-max_tokens').inputValue(), '512', 'reset to defaults');
});

test('the conversation survives a reload, is listed, searched and reopened; Markdown export', async () => {
  const { page: pg } = await page();
  await sendMessage(pg, 'What is the capital of France?');
  const answer = await waitAnswer(pg);
  await pg.reload();
  await waitConnected(pg);
  const texts = await pg.locator('.msg .body').allTextContents();
  assert.equal(texts[0], 'What is the capital of France?');
  assert.equal(texts[1], answer.text, 'answer restored after reload');
  const item = pg.locator('#conv-list .conv', { hasText: 'What is the capital of France?' });
  assert.equal(await item.count(), 1, 'listed in the sidebar');
  await pg.locator('#new-chat').click();
  assert.equal(await pg.locator('.msg').count(), 0, 'new chat is empty');
  await pg.locator('#search').fill('capital france');
  assert.equal(await pg.locator('#conv-list .conv').count(), 1, 'search finds it');
  await pg.locator('#search').fill('zebra-unlikely-word');
  assert.equal(await pg.locator('#conv-list .conv').count(), 0, 'search filters it out');
  await pg.locator('#search').fill('');
  await item.locator('.conv-open').click();
  assert.equal(await pg.locator('.msg').count(), 2, 'reopened');

  const [download] = await Promise.all([pg.waitForEvent('download'), pg.locator('#export-md').click()]);
  assert.match(download.suggestedFilename(), /^what-is-the-capital-of-france\.md$/);
  const md = await readFile(await download.path(), 'utf8');
  assert.match(md, /^# What is the capital of France\?/);
  assert.match(md, /## User\n\nWhat is the capital of France\?\n/);
  assert.ok(md.includes('## Assistant\n\n'), 'assistant section');
  const firstLine = answer.text.trim().split('\n')[0].replace(/[*_`]/g, '').slice(0, 30);
  assert.ok(md.replace(/[*_`]/g, '').includes(firstLine), `answer text in the export (${firstLine})`);

  const [json] = await Promise.all([pg.waitForEvent('download'), pg.locator('#export-json').click()]);
  const data = JSON.parse(await readFile(await json.path(), 'utf8'));
  assert.equal(data.conversations[0].messages[0].content, 'What is the capital of France?');

  await pg.locator('#clear-all').click();
  assert.equal(await pg.locator('#conv-list .conv').count(), 0, 'cleared');
  await pg.reload();
  await waitConnected(pg);
  assert.equal(await pg.locator('#conv-list .conv').count(), 0, 'cleared for good');

  // The JSON export imports back (twice: the second copy gets a new id).
  for (const n of [1, 2]) {
    const [chooser] = await Promise.all([pg.waitForEvent('filechooser'), pg.locator('#import').click()]);
    await chooser.setFiles(await json.path());
    await pg.locator('#banner', { hasText: '1 conversation added' }).waitFor();
    assert.equal(await pg.locator('#conv-list .conv').count(), n, `import ${n}`);
  }
  await pg.locator('#conv-list .conv-open').first().click();
  assert.deepEqual(await pg.locator('.msg .body').allTextContents(), texts, 'imported conversation shows the same messages');
  const [bad] = await Promise.all([pg.waitForEvent('filechooser'), pg.locator('#import').click()]);
  await bad.setFiles({ name: 'bad.json', mimeType: 'application/json', buffer: Buffer.from('{"x": 1}') });
  await pg.locator('#banner', { hasText: 'Import failed' }).waitFor();
});

test('a reply containing <script> renders as text', async () => {
  const { page: pg } = await page();
  const prompt = 'Echo: <b>hi</b> <script>alert(1)</script>';
  await sendMessage(pg, prompt);
  const answer = await waitAnswer(pg);
  assert.ok(answer.text.includes('<script>alert(1)</script>'),
    `the reply shows the tag as text (the model echoes it with greedy sampling): ${JSON.stringify(answer.text)}`);
  assert.ok(answer.text.includes('<b>hi</b>'));
  assert.equal(await pg.locator('#messages script, #messages b').count(), 0, 'no element made from model output');
  const userText = await pg.locator('.msg.user .body').first().textContent();
  assert.equal(userText, prompt, 'the user message is plain text too');
});

test('the page reconnects by itself after the server is killed and restarted', async () => {
  const { page: pg } = await page();
  await server.kill();
  await pg.waitForFunction(() => ['disconnected', 'connecting'].includes(document.querySelector('#conn').dataset.state));
  await pg.waitForTimeout(1000);
  await server.start();
  await waitConnected(pg, 30_000);
  await sendMessage(pg, 'Say hello.');
  const answer = await waitAnswer(pg, 60_000);
  assert.ok(answer.text.trim().length > 0, 'answered after reconnect');
});

test('screenshots: desktop and phone, light and dark', async () => {
  for (const colorScheme of ['light', 'dark']) {
    for (const [name, viewport] of [['desktop', { width: 1280, height: 800 }], ['phone', { width: 390, height: 844 }]]) {
      const { page: pg } = await page({ viewport, colorScheme });
      if (colorScheme === 'light' && name === 'desktop') {
        await sendMessage(pg, 'Write a Python function that adds two numbers, in a code block.');
        await waitAnswer(pg);
        assert.ok(await pg.locator('.msg.assistant .code-block .hljs').count() > 0, 'the answer has a highlighted code block');
      } else {
        // Reuse the first screenshot's conversation via its export, so every shot shows content.
        await pg.evaluate((c) => {
          localStorage.setItem('quarrel.conversations.v1', c);
          localStorage.setItem('quarrel.current.v1', JSON.parse(c)[0].id);
        }, shared.conversations);
        await pg.reload();
        await waitConnected(pg);
      }
      if (!shared.conversations) shared.conversations = await pg.evaluate(() => localStorage.getItem('quarrel.conversations.v1'));
      assert.equal(await brightness(pg) < 200, colorScheme === 'dark', `${colorScheme} theme follows the system`);
      await pg.screenshot({ path: path.join(OUT, `${name}-${colorScheme}.png`) });
      if (name === 'phone') {
        assert.ok(!(await onScreen(pg, '#sidebar')), 'sidebar collapsed on a phone');
        await pg.locator('#sidebar-toggle').click();
        await pg.waitForTimeout(300);
        assert.equal(await pg.locator('.msg').count(), 2, 'the conversation is shown');
        assert.ok(await onScreen(pg, '#sidebar'), 'sidebar opens from the menu button');
        await pg.screenshot({ path: path.join(OUT, `${name}-${colorScheme}-sidebar.png`) });
      } else {
        await pg.locator('#settings-toggle').click();
        await pg.screenshot({ path: path.join(OUT, `${name}-${colorScheme}-settings.png`) });
      }
    }
  }
});
const shared = {};

/** Whether the element's box overlaps the viewport horizontally by more than half its width. */
async function onScreen(pg, sel) {
  return pg.locator(sel).evaluate((el) => {
    const r = el.getBoundingClientRect();
    const visible = Math.min(r.right, innerWidth) - Math.max(r.left, 0);
    return r.width > 0 && visible > r.width / 2;
  });
}

async function brightness(pg) {
  const bg = await pg.evaluate(() => getComputedStyle(document.body).backgroundColor);
  return bg.match(/\d+/g).slice(0, 3).map(Number).reduce((a, b) => a + b, 0);
}

test('the theme toggle overrides the system preference and is remembered', async () => {
  const { page: pg } = await page({ colorScheme: 'light' });
  assert.ok(await brightness(pg) > 600, 'light by system preference');
  await pg.locator('#theme-toggle').click();
  assert.equal(await pg.evaluate(() => document.documentElement.dataset.theme), 'dark');
  assert.ok(await brightness(pg) < 200, 'dark when toggled');
  await pg.reload();
  await waitConnected(pg);
  assert.ok(await brightness(pg) < 200, 'dark kept across reload');
  await pg.locator('#theme-toggle').click();
  assert.equal(await pg.evaluate(() => document.documentElement.dataset.theme), 'light');
  await pg.locator('#theme-toggle').click();
  assert.equal(await pg.evaluate(() => document.documentElement.dataset.theme ?? 'auto'), 'auto', 'back to the system setting');
});

test('the render path keeps hostile model output inert (injected through renderMarkdown)', async () => {
  const { page: pg } = await page();
  const payloads = [
    '<script>window.__pwned = 1</script>',
    '<img src=x onerror="window.__pwned = 2">',
    '<iframe src="javascript:window.__pwned = 3"></iframe>',
    '[click](javascript:window.__pwned=4)',
    '<a href="javascript:window.__pwned=5">x</a>',
    '<svg><script>window.__pwned = 6</script></svg>',
    '<style>body{display:none}</style>',
    '![x](http://example.invalid/track.png)',
    '```html\n<script>window.__pwned = 7</script>\n```',
    '<details open ontoggle="window.__pwned = 8">',
    '<div style="background:url(javascript:alert(1))">styled</div>',
  ];
  const out = await pg.evaluate(async (list) => {
    const { renderMarkdown } = await import('/js/render.js');
    return list.map((text) => {
      const box = document.createElement('div');
      box.append(renderMarkdown(text));
      document.querySelector('#messages').append(box);
      const bad = [...box.querySelectorAll('*')].filter((el) =>
        ['SCRIPT', 'IFRAME', 'IMG', 'STYLE', 'SVG', 'DETAILS', 'OBJECT', 'EMBED'].includes(el.tagName.toUpperCase()) ||
        [...el.attributes].some((a) => a.name.startsWith('on') || a.name === 'style' ||
          (a.name === 'href' && !/^(https?:|mailto:|#)/i.test(a.value))));
      return { text, bad: bad.map((el) => el.outerHTML), shown: box.textContent };
    });
  }, payloads);
  await pg.waitForTimeout(300);
  assert.equal(await pg.evaluate(() => window.__pwned), undefined, 'nothing ran');
  for (const r of out) assert.deepEqual(r.bad, [], `inert: ${r.text}`);
  // Raw HTML is shown as the text it is.
  assert.equal(out[0].shown.trim(), payloads[0]);
  assert.ok(out[8].shown.includes('<script>window.__pwned = 7</script>'), 'code block shows its text');
});

test('a reasoning model\'s <think> section shows collapsed above the answer, inert, open state kept while streaming', async () => {
  const { page: pg } = await page();
  const r = await pg.evaluate(async () => {
    const { renderAnswer } = await import('/js/render.js');
    const box = document.createElement('div');
    document.querySelector('#messages').append(box);
    const look = () => {
      const d = box.querySelector(':scope > details.reasoning');
      return { details: !!d, open: d?.open ?? null, summary: d?.querySelector('summary')?.textContent ?? null,
               reasoning: d?.querySelector('.reasoning-body')?.textContent.trim() ?? null,
               answer: [...box.children].filter((c) => c !== d).map((c) => c.textContent).join('').trim() };
    };
    const out = [];
    renderAnswer(box, '<think>\nLet me **add**: 2+2');
    out.push(look());
    box.querySelector('details').open = true;
    renderAnswer(box, '<think>\nLet me **add**: 2+2 <img src=x onerror="window.__pwned=1"></think>\n\nIt is **4**.');
    out.push(look());
    renderAnswer(box, 'No reasoning here.');
    out.push(look());
    return { out, bad: box.querySelectorAll('img,script').length };
  });
  assert.deepEqual(r.out[0], { details: true, open: false, summary: 'Reasoning…', reasoning: 'Let me add: 2+2', answer: '' });
  assert.equal(r.out[1].open, true, 'the reader opened it: it stays open');
  assert.equal(r.out[1].summary, 'Reasoning');
  assert.equal(r.out[1].answer, 'It is 4.');
  assert.deepEqual(r.out[2], { details: false, open: null, summary: null, reasoning: null, answer: 'No reasoning here.' });
  assert.equal(r.bad, 0);
  assert.equal(await pg.evaluate(() => window.__pwned), undefined, 'nothing ran');
});

test('reconnect delays grow exponentially with jitter, capped at 10 s', async () => {
  const { page: pg } = await page();
  const rows = await pg.evaluate(async () => {
    const { backoffDelay } = await import('/js/ws.js');
    const r = [];
    for (let n = 0; n < 30; n++) r.push([backoffDelay(n, () => 0), backoffDelay(n, () => 0.999999), backoffDelay(n)]);
    return r;
  });
  for (let n = 0; n < rows.length; n++) {
    const [lo, hi, any] = rows[n];
    const cap = Math.min(10_000, 500 * 2 ** n);
    assert.equal(lo, cap / 2, `attempt ${n} low end`);
    assert.equal(hi, cap, `attempt ${n} high end`);
    assert.ok(any >= lo && any <= hi, `attempt ${n} jitter in range`);
  }
});

test('UNAUTHORIZED asks for an API key, which is kept; OVERLOADED is shown', async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'quarrel-keys-'));
  const keys = path.join(dir, 'keys.json');
  const key = execFileSync(BIN, ['keys', 'create', '--keys', keys, 'browser-test']).toString().trim();
  const locked = new Server(await freePort(), ['--keys', keys, '--parallel', '1', '--queue', '1']);
  await locked.start();
  try {
    const p = await openPage(browser, locked, { settings: { ...GREEDY, max_tokens: 400 } });
    open.push(p);
    const pg = p.page;
    await pg.locator('#banner').waitFor({ state: 'visible' });
    assert.match(await pg.locator('#banner-code').textContent(), /UNAUTHORIZED/);
    assert.ok(await pg.locator('#key-input').isVisible(), 'a field for the key');
    assert.notEqual(await pg.locator('#conn').getAttribute('data-state'), 'connected');
    await pg.locator('#key-input').fill('wrong-key');
    await pg.locator('#key-form button[type=submit]').click();
    await pg.locator('#banner').waitFor({ state: 'visible' });
    assert.match(await pg.locator('#banner-code').textContent(), /UNAUTHORIZED/, 'a wrong key is refused');
    await pg.locator('#key-input').fill(key);
    await pg.locator('#key-form button[type=submit]').click();
    await waitConnected(pg);
    assert.ok(await pg.locator('#banner').isHidden(), 'error gone once connected');
    assert.equal(await pg.evaluate(() => localStorage.getItem('quarrel.apiKey')), key, 'key kept in localStorage');
    await pg.locator('#model-list .model.loaded').first().waitFor(); // REST calls carry the key too
    await pg.reload();
    await waitConnected(pg); // the kept key is used after a reload

    // Fill the one running slot and the one queue place from other sockets of this page.
    // Greedy: this prompt runs the whole 2,000 tokens on the default model, where sampled runs
    // can meet the end token within a second (a CI run saw the slot free again before the
    // page's message, so no OVERLOADED).
    await pg.evaluate(async (k) => {
      window.__hogs = [];
      for (let i = 0; i < 3; i++) {
        const ws = new WebSocket(`ws://${location.host}/ws?api_key=${encodeURIComponent(k)}`);
        await new Promise((r) => { ws.onopen = r; });
        ws.send(JSON.stringify({ type: 'inference', id: `hog${i}`,
          payload: { prompt: 'Once upon a time', max_tokens: 2000, temperature: 0 } }));
        window.__hogs.push(ws);
      }
    }, key);
    await pg.waitForTimeout(500);
    await sendMessage(pg, 'Hello?');
    await pg.locator('#banner').waitFor({ state: 'visible', timeout: 30_000 });
    assert.match(await pg.locator('#banner-code').textContent(), /OVERLOADED/);
    const answer = await waitAnswer(pg);
    assert.match(answer.meta, /OVERLOADED/, 'the failed answer says why');
    assert.ok(await pg.locator('#input').isEnabled(), 'the page is usable again');
    await pg.evaluate(() => window.__hogs.forEach((w) => w.close()));
  } finally {
    await locked.kill();
  }
});

test('models: load and unload from the sidebar; each conversation keeps its model', async () => {
  const { page: pg } = await page();
  const name = SECOND_MODEL;
  const other = pg.locator(`#model-list .model[data-name="${name}"]`);
  await other.waitFor();
  assert.equal(await other.locator('.badge').textContent(), 'not loaded');
  await other.locator('button', { hasText: 'Load' }).click();
  await other.locator('.badge', { hasText: /^loaded$/ }).waitFor({ timeout: 60_000 });
  assert.match(await other.locator('.model-facts').textContent(), /^llama · 1\.4M params · \S+ · .* \+ .* KV · ctx \d+$/,
    'architecture, parameters, quantization, memory, context');

  await pg.locator('#model-select').selectOption(name);
  await sendMessage(pg, 'Say hi.');
  const a1 = await waitAnswer(pg);
  assert.ok(a1.meta.startsWith(name), `answered by ${name}: ${a1.meta}`);

  await pg.locator('#new-chat').click();
  await pg.locator('#model-select').selectOption('');
  await sendMessage(pg, 'Say hi.');
  const a2 = await waitAnswer(pg);
  assert.ok(a2.meta.startsWith('smollm2'), `answered by the default model: ${a2.meta}`);

  await pg.locator('#conv-list .conv').nth(1).locator('.conv-open').click();
  assert.equal(await pg.locator('#model-select').inputValue(), name, 'the first conversation keeps its model');

  await other.locator('button', { hasText: 'Unload' }).click();
  await other.locator('.badge', { hasText: 'not loaded' }).waitFor({ timeout: 60_000 });
});

test('presets fill the input; one conversation can be deleted', async () => {
  const { page: pg } = await page({ settings: { ...GREEDY, max_tokens: 4 } });
  await pg.locator('#input').fill('Le chat est noir.');
  await pg.locator('[data-preset=translate]').click();
  assert.equal(await pg.locator('#input').inputValue(), 'Translate the following text into English:\n\nLe chat est noir.');
  await pg.locator('#input').fill('');
  for (const preset of ['summarize', 'code', 'explain']) {
    await pg.locator(`[data-preset=${preset}]`).click();
    assert.ok((await pg.locator('#input').inputValue()).length > 5, `${preset} preset`);
    await pg.locator('#input').fill('');
  }
  await sendMessage(pg, 'first conversation');
  await waitAnswer(pg);
  await pg.locator('#new-chat').click();
  await sendMessage(pg, 'second conversation');
  await waitAnswer(pg);
  assert.equal(await pg.locator('#conv-list .conv').count(), 2);
  await pg.locator('#conv-list .conv', { hasText: 'first conversation' }).locator('.conv-del').click();
  assert.deepEqual(await pg.locator('#conv-list .conv-title').allTextContents(), ['second conversation']);
  await pg.reload();
  await waitConnected(pg);
  assert.deepEqual(await pg.locator('#conv-list .conv-title').allTextContents(), ['second conversation'], 'deletion persisted');
});

test('heartbeat: pings while idle; a frozen server is detected and the page reconnects after it thaws', async () => {
  const frames = [];
  const { page: pg } = await page({
    beforeGoto: async (p) => {
      await p.clock.install();
      p.on('websocket', (ws) => ws.on('framesent', (f) => frames.push(String(f.payload))));
    },
  });
  await pg.clock.runFor(16_000);
  await pg.waitForFunction(() => true);
  assert.ok(frames.some((f) => JSON.parse(f).type === 'ping'), `a ping after 15 s idle (${frames})`);
  await pg.waitForTimeout(500); // the pong arrives
  await pg.clock.runFor(11_000);
  assert.equal(await pg.locator('#conn').getAttribute('data-state'), 'connected', 'answered pings keep the connection');

  server.freeze();
  try {
    await pg.clock.runFor(15_000); // next ping, unanswered
    await pg.clock.runFor(10_500); // heartbeat deadline
    const state = await pg.locator('#conn').getAttribute('data-state');
    assert.ok(['disconnected', 'connecting'].includes(state), `frozen server detected (${state})`);
  } finally {
    server.thaw();
  }
  for (let i = 0; i < 40; i++) {
    if ((await pg.locator('#conn').getAttribute('data-state')) === 'connected') break;
    await pg.clock.runFor(1_000);
    await pg.waitForTimeout(100);
  }
  assert.equal(await pg.locator('#conn').getAttribute('data-state'), 'connected', 'reconnected after the thaw');
});
