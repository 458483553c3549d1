// WebSocket client for the server's `GET /ws` protocol (crates/server/src/ws.rs documents it):
// every message is `{"type": "inference"|"status"|"error"|"metrics"|"cancel"|"ping"|"pong",
// "id", "payload"}`.
//
//   Connection ── open ──► connected ── heartbeat: `ping` every 15 s; no message back within 10 s
//        ▲                     │        abandons the socket
//        └── backoff ◄── close ┘        reconnect delay: exponential (0.5 s .. 10 s) with jitter;
//                                       none after the server refused the key (close code 1008)
//
// Several generations may run at once; each has an id and its own handlers.

const HEARTBEAT_MS = 15_000;
const HEARTBEAT_TIMEOUT_MS = 10_000;
const BACKOFF_BASE_MS = 500;
const BACKOFF_CAP_MS = 10_000;

/** Delay before reconnect attempt `n` (0-based): exponential with "equal jitter". */
export function backoffDelay(n, rand = Math.random) {
  const cap = Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** Math.min(n, 16));
  return Math.round(cap / 2 + rand() * (cap / 2));
}

export function wsUrl(loc = location, apiKey = '') {
  const proto = loc.protocol === 'https:' ? 'wss:' : 'ws:';
  const q = apiKey ? `?api_key=${encodeURIComponent(apiKey)}` : '';
  return `${proto}//${loc.host}/ws${q}`;
}

let seq = 0;
const newRequestId = () => `r${Date.now().toString(36)}-${(++seq).toString(36)}`;

export class Connection extends EventTarget {
  constructor(getApiKey) {
    super();
    this.getApiKey = getApiKey;
    this.ws = null;
    this.state = 'disconnected';
    this.attempt = 0;
    this.pending = new Map(); // id -> handlers
    this.cancelled = new Set(); // ids stopped by us: late messages for them are dropped
    this.reconnectTimer = 0;
    this.heartbeatTimer = 0;
    this.deadline = 0;
    this.nextRetryAt = 0;
    this.stopped = false;
    addEventListener('online', () => this.reconnectNow());
    document.addEventListener('visibilitychange', () => {
      if (document.visibilityState === 'visible') this.reconnectNow();
    });
  }

  setState(state) {
    if (this.state === state) return;
    this.state = state;
    this.dispatchEvent(new CustomEvent('state', { detail: state }));
  }

  start() {
    this.stopped = false;
    this.open();
  }

  open() {
    clearTimeout(this.reconnectTimer);
    if (this.ws) return;
    this.setState('connecting');
    let ws;
    try {
      ws = new WebSocket(wsUrl(location, this.getApiKey()));
    } catch (e) {
      this.scheduleReconnect();
      return;
    }
    this.ws = ws;
    ws.onopen = () => {
      this.attempt = 0;
      this.setState('connected');
      this.send({ type: 'status', payload: {} });
      this.startHeartbeat();
    };
    ws.onmessage = (ev) => this.onMessage(ev.data);
    ws.onclose = (ev) => this.onClose(ev);
    ws.onerror = () => { /* onclose follows */ };
  }

  /** While waiting to retry: try at once (network back, tab visible again). */
  reconnectNow() {
    if (this.stopped || this.ws) return; // open or opening already
    this.attempt = 0;
    this.open();
  }

  /** Close and reopen (a new API key). */
  restart() {
    this.attempt = 0;
    if (this.ws) this.ws.close(); else this.open();
  }

  onClose(ev) {
    this.ws = null;
    clearInterval(this.heartbeatTimer);
    clearTimeout(this.deadline);
    this.cancelled.clear();
    for (const [id, h] of this.pending) {
      h.onError?.({ code: 'DISCONNECTED', message: 'Connection to the server was lost.' });
      this.pending.delete(id);
    }
    this.setState('disconnected');
    this.dispatchEvent(new CustomEvent('closed', { detail: { code: ev.code, reason: ev.reason } }));
    // 1008: the server refused our key; retrying with the same key cannot help (restart() does).
    if (ev.code === 1008) return;
    if (!this.stopped) this.scheduleReconnect();
  }

  scheduleReconnect() {
    const delay = backoffDelay(this.attempt++);
    this.nextRetryAt = Date.now() + delay;
    this.dispatchEvent(new CustomEvent('retry', { detail: { delay, attempt: this.attempt } }));
    clearTimeout(this.reconnectTimer);
    this.reconnectTimer = setTimeout(() => this.open(), delay);
  }

  startHeartbeat() {
    clearInterval(this.heartbeatTimer);
    this.heartbeatTimer = setInterval(() => {
      if (!this.send({ type: 'ping' })) return;
      clearTimeout(this.deadline);
      this.deadline = setTimeout(() => this.abandon(), HEARTBEAT_TIMEOUT_MS);
    }, HEARTBEAT_MS);
  }

  /**
   * The server stopped answering (frozen process, half-open connection): drop the socket at once
   * rather than wait for a closing handshake that will not come, and start reconnecting.
   */
  abandon() {
    const ws = this.ws;
    if (!ws) return;
    ws.onclose = null;
    ws.onmessage = null;
    try { ws.close(4000, 'heartbeat timeout'); } catch { /* already closing */ }
    this.onClose({ code: 4000, reason: 'heartbeat timeout' });
  }

  send(msg) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(msg));
    return true;
  }

  /**
   * Start a generation. `handlers`: onToken({token, token_id, tokens_per_sec}) per token message,
   * onDone({text, finish_reason, usage, tokens_per_sec, ttft_ms, model}), onError({code, message}).
   * Returns the request id, or null when not connected.
   */
  infer(payload, handlers) {
    const id = newRequestId();
    if (!this.send({ type: 'inference', id, payload: { ...payload, stream: true } })) return null;
    this.pending.set(id, handlers);
    return id;
  }

  /** Cancel a generation; its handlers get nothing more. */
  cancel(id) {
    this.pending.delete(id);
    this.cancelled.add(id);
    this.send({ type: 'cancel', id });
  }

  onMessage(data) {
    clearTimeout(this.deadline);
    let msg;
    try { msg = JSON.parse(data); } catch { return; }
    if (!msg || typeof msg !== 'object') return;
    const p = msg.payload && typeof msg.payload === 'object' ? msg.payload : {};
    const id = msg.id ?? p.id ?? p.request_id ?? null;
    if (id != null && this.cancelled.has(id)) {
      // Tokens in flight, the final `cancelled` message, or "no running request" when it had
      // just finished: none of it matters to the page any more.
      if (msg.type === 'error' || p.complete) this.cancelled.delete(id);
      return;
    }
    const h = id != null ? this.pending.get(id) : null;
    switch (msg.type) {
      case 'inference': {
        if (!h) return;
        if (!p.complete) h.onToken?.(p);
        else {
          this.pending.delete(id);
          h.onDone?.(p);
        }
        return;
      }
      case 'error': {
        const err = { code: p.code || 'ERROR', message: p.message || 'Server error', ...p };
        if (h) {
          this.pending.delete(id);
          h.onError?.(err);
        } else {
          this.dispatchEvent(new CustomEvent('server-error', { detail: err }));
        }
        return;
      }
      case 'cancel': {
        if (!h) return;
        this.pending.delete(id);
        h.onDone?.({ ...p, cancelled: true });
        return;
      }
      case 'pong':
        return;
      case 'status':
      case 'metrics':
        this.dispatchEvent(new CustomEvent(msg.type, { detail: p }));
        return;
      default:
    }
  }
}
