// The REST routes under /api/, with the bearer token when there is one. Paths are relative
// to the page, so the app also works behind a proxy that serves it under a prefix.

import { token } from './auth.js';

/** An error answer in the API's `{"error":{"code","message"}}` shape. */
export class RestError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** The URL of an API path with query parameters (undefined and null ones left out). */
export function apiUrl(path, query = {}) {
  const url = new URL(path, document.baseURI);
  for (const [key, value] of Object.entries(query)) {
    if (value !== undefined && value !== null && value !== '') {
      url.searchParams.set(key, String(value));
    }
  }
  return url;
}

function headers() {
  const t = token();
  return t ? { Authorization: `Bearer ${t}` } : {};
}

async function send(method, path, query) {
  let response;
  try {
    response = await fetch(apiUrl(path, query), { method, headers: headers() });
  } catch (err) {
    throw new RestError(0, 'unreachable', `the server could not be reached (${err.message})`);
  }
  if (!response.ok) {
    let code = 'http_error';
    let message = `${method} ${path} answered ${response.status}`;
    try {
      const body = await response.json();
      code = body.error?.code ?? code;
      message = body.error?.message ?? message;
    } catch {
      // Not our error shape; keep the status line.
    }
    throw new RestError(response.status, code, message);
  }
  return response;
}

/** GET returning JSON. */
export async function getJson(path, query) {
  return (await send('GET', path, query)).json();
}

/** POST without a body, returning JSON. */
export async function postJson(path, query) {
  return (await send('POST', path, query)).json();
}

/** GET returning the body as a Blob (file downloads). */
export async function getBlob(path, query) {
  return (await send('GET', path, query)).blob();
}
