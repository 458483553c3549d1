// REST calls the page makes: the model list and model load / unload. Errors come back as
// ApiError with the server's `{"error": {"code", "message"}}` fields when it sent them.

import { apiKey } from './store.js';

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function call(method, path) {
  const headers = { Accept: 'application/json' };
  // the server takes POSTs with a JSON content type only (a page elsewhere cannot send one
  // without a CORS preflight)
  if (method === 'POST') headers['Content-Type'] = 'application/json';
  const key = apiKey.get();
  if (key) headers.Authorization = `Bearer ${key}`;
  let res;
  try {
    res = await fetch(path, { method, headers });
  } catch (e) {
    throw new ApiError(0, 'NETWORK', `Server unreachable (${e.message})`);
  }
  const text = await res.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch { /* not JSON */ }
  if (!res.ok) {
    const e = body?.error || {};
    const code = e.code || (res.status === 401 ? 'UNAUTHORIZED' : res.status === 503 ? 'OVERLOADED' : `HTTP_${res.status}`);
    throw new ApiError(res.status, String(code), e.message || text || res.statusText);
  }
  return body;
}

/**
 * The server's models: `{models: [{name, loaded, parameters, quantization, memory, context, arch}],
 * default}` (the model a request without `model` gets).
 */
export async function listModels() {
  const body = await call('GET', '/api/models');
  const list = Array.isArray(body) ? body : body?.models || body?.data || [];
  return {
    models: list.map(normalizeModel).filter((m) => m.name),
    default: typeof body?.default === 'string' ? body.default : '',
  };
}

export function normalizeModel(m) {
  const d = m.details || {};
  const pick = (...xs) => xs.find((x) => x !== undefined && x !== null && x !== '');
  const mem = m.memory && typeof m.memory === 'object' ? m.memory : {};
  return {
    name: String(pick(m.name, m.id, m.model) || ''),
    loaded: m.loaded === true || m.status === 'loaded',
    parameters: pick(d.parameters, m.parameters, d.parameter_size),
    quantization: pick(d.quantization, m.quantization, d.quantization_level),
    // Loaded: weights + KV cache; not loaded: the file's size.
    memory: pick(mem.total_bytes, typeof m.memory === 'number' ? m.memory : undefined, m.size_bytes, m.size),
    weights: mem.weights_bytes,
    kv: mem.kv_cache_bytes,
    context: pick(d.context_length, m.context_length),
    arch: pick(d.arch, m.architecture, d.family),
  };
}

export const loadModel = (name) => call('POST', `/api/models/${encodeURIComponent(name)}/load`);
export const unloadModel = (name) => call('DELETE', `/api/models/${encodeURIComponent(name)}/load`);

export function formatCount(n) {
  if (typeof n === 'string') return n;
  if (typeof n !== 'number' || !Number.isFinite(n)) return '';
  if (n >= 1e9) return `${(n / 1e9).toFixed(n >= 1e10 ? 0 : 1)}B`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(n >= 1e8 ? 0 : 1)}M`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(0)}K`;
  return String(n);
}

export function formatBytes(n) {
  if (typeof n === 'string') return n;
  if (typeof n !== 'number' || !Number.isFinite(n)) return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(n >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
}
