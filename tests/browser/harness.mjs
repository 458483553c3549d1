// Test harness: a real `quarrel serve` (default model, loopback, free port) that the tests can
// kill and restart, and headless Chromium from Debian's package driven by playwright-core.
//
// Environment: QUARREL_BIN (default ../../target/release/quarrel), QUARREL_TEST_MODEL (a .gguf;
// default: the server's default model), CHROMIUM (default /usr/bin/chromium),
// BROWSER_TEST_OUT (screenshots, default ./out).

import { spawn, execFileSync } from 'node:child_process';
import os from 'node:os';
import { createServer } from 'node:net';
import { mkdirSync, mkdtempSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
export const OUT = process.env.BROWSER_TEST_OUT || path.join(here, 'out');
mkdirSync(OUT, { recursive: true });

export const BIN = process.env.QUARREL_BIN || path.join(here, '..', '..', 'target', 'release', 'quarrel');
const MODEL = process.env.QUARREL_TEST_MODEL || '';

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * A models directory holding a second, tiny model (random weights, `quarrel synth`), so the
 * sidebar has a model to load, use and unload next to the default one.
 */
export function secondModelDir() {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'quarrel-models-'));
  execFileSync(BIN, ['synth', '-p', 'tiny', '-q', 'q8_0', path.join(dir, `${SECOND_MODEL}.gguf`)], { stdio: 'ignore' });
  return dir;
}
export const SECOND_MODEL = 'tiny-synth';

export class Server {
  /** `extraArgs` for `quarrel serve`; without `--keys` the server runs with `--no-auth`, so a
   *  keys.json in $QUARREL_HOME cannot change what is tested. */
  constructor(port, extraArgs = []) {
    this.port = port;
    this.extraArgs = extraArgs;
    this.proc = null;
    this.log = [];
  }

  get url() { return `http://127.0.0.1:${this.port}`; }

  async start(timeoutMs = 120_000) {
    const args = ['serve', '--host', '127.0.0.1', '--port', String(this.port), '-t', '2'];
    if (MODEL) args.push('-m', MODEL);
    if (!this.extraArgs.includes('--keys')) args.push('--no-auth');
    args.push(...this.extraArgs);
    const proc = spawn(BIN, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    this.proc = proc;
    const keep = (d) => { this.log.push(d.toString()); if (this.log.length > 400) this.log.shift(); };
    proc.stdout.on('data', keep);
    proc.stderr.on('data', keep);
    const exited = new Promise((resolve) => proc.once('exit', (code) => resolve(code)));
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const done = await Promise.race([exited.then((c) => ({ c })), sleep(200).then(() => null)]);
      if (done) throw new Error(`quarrel serve exited (${done.c}) during start:\n${this.tail()}`);
      try {
        const r = await fetch(`${this.url}/readyz`);
        if (r.ok) return;
      } catch { /* not listening yet */ }
    }
    throw new Error(`quarrel serve did not answer within ${timeoutMs} ms:\n${this.tail()}`);
  }

  /** SIGSTOP / SIGCONT: a frozen server keeps its sockets open but answers nothing. */
  freeze() { this.proc.kill('SIGSTOP'); }
  thaw() { this.proc.kill('SIGCONT'); }

  /** SIGKILL: the page sees the socket drop as after a crash. */
  async kill() {
    const p = this.proc;
    if (!p || p.exitCode !== null) return;
    const exited = new Promise((resolve) => p.once('exit', resolve));
    p.kill('SIGKILL');
    await exited;
    this.proc = null;
  }

  tail(n = 40) { return this.log.join('').split('\n').slice(-n).join('\n'); }
}

export async function launchBrowser() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu'],
  });
}

/**
 * A fresh browser context and page on the server, with every page error and CSP violation
 * collected (tests assert there are none) and downloads accepted.
 */
export async function openPage(browser, server, { viewport = { width: 1280, height: 800 }, colorScheme = 'light', settings, beforeGoto } = {}) {
  const context = await browser.newContext({ viewport, colorScheme, acceptDownloads: true });
  const problems = [];
  const dialogs = [];
  await context.addInitScript(() => {
    window.__cspViolations = [];
    document.addEventListener('securitypolicyviolation', (e) => {
      window.__cspViolations.push(`${e.violatedDirective} ${e.blockedURI}`);
    });
  });
  if (settings) {
    await context.addInitScript((s) => {
      if (!localStorage.getItem('quarrel.settings.v1')) localStorage.setItem('quarrel.settings.v1', JSON.stringify(s));
    }, settings);
  }
  const page = await context.newPage();
  page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
  page.on('dialog', async (d) => {
    dialogs.push(`${d.type()}: ${d.message()}`);
    // confirm() of "Clear all" is the only dialog the page opens on purpose.
    if (d.type() === 'confirm') await d.accept(); else await d.dismiss();
  });
  if (beforeGoto) await beforeGoto(page);
  await page.goto(server.url + '/');
  return { context, page, problems, dialogs };
}

export async function waitConnected(page, timeout = 30_000) {
  await page.waitForFunction(() => document.querySelector('#conn')?.dataset.state === 'connected', null, { timeout });
}

export async function cspViolations(page) {
  return page.evaluate(() => window.__cspViolations || []);
}

/** Type a message and send it with Enter. */
export async function sendMessage(page, text) {
  await page.locator('#input').fill(text);
  await page.locator('#input').press('Enter');
}

/** Wait until the page is idle again (the answer done) and return the last assistant message. */
export async function waitAnswer(page, timeout = 120_000) {
  await page.waitForFunction(() => {
    const last = [...document.querySelectorAll('.msg.assistant')].pop();
    return last && !last.classList.contains('streaming') && document.querySelector('#conn').dataset.state !== 'generating';
  }, null, { timeout });
  return page.evaluate(() => {
    const last = [...document.querySelectorAll('.msg.assistant')].pop();
    return { text: last.querySelector('.body').textContent, meta: last.querySelector('.meta').textContent, html: last.querySelector('.body').innerHTML };
  });
}

/** Greedy settings for reproducible answers. */
export const GREEDY = { temperature: 0, topk: 40, topp: 0.95, max_tokens: 48, system: '' };
