// Building DOM nodes. Text always goes in as text nodes, never as markup, so nothing a model
// or a tool writes can become an element.

/**
 * Creates an element. `attrs` keys: `class`, `text` (text content), `testid`
 * (data-testid), `on<event>` (listeners), `dataset` (object), anything else as an attribute
 * (skipped when null, undefined or false).
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === 'class') el.className = value;
    else if (key === 'text') el.textContent = String(value);
    else if (key === 'testid') el.dataset.testid = value;
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2), value);
    } else el.setAttribute(key, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

/** Appends children: nodes as they are, strings as text, arrays flattened, nullish skipped. */
export function append(parent, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return parent;
}

/** The one element with this data-testid under `root`. */
export function byTestId(id, root = document) {
  return root.querySelector(`[data-testid="${id}"]`);
}

/** Replaces the children of `el`, skipping nullish ones as {@link append} does. */
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

/** Removes every child of `el`. */
export function clear(el) {
  el.replaceChildren();
  return el;
}

/** Formats a USD amount: more decimals for small amounts, so a cheap turn is not "$0.00". */
export function usd(amount) {
  const value = Number(amount) || 0;
  if (value === 0) return '$0.00';
  if (Math.abs(value) < 0.01) return `$${value.toFixed(6)}`;
  return `$${value.toFixed(4)}`;
}

/** " (800 cached)" for prompt tokens served from the provider's cache; "" when none were. */
function cachedNote(tokensCached) {
  const cached = Number(tokensCached) || 0;
  return cached > 0 ? ` (${cached} cached)` : '';
}

/** Formats a prompt token count with its cached share: "1200 (800 cached)". */
export function promptTokens(tokensIn, tokensCached) {
  return `${Number(tokensIn) || 0}${cachedNote(tokensCached)}`;
}

/** Formats a turn's or a session's tokens: "1200 in (800 cached) · 40 out". */
export function tokenSummary(tokensIn, tokensOut, tokensCached) {
  return `${Number(tokensIn) || 0} in${cachedNote(tokensCached)} · ${Number(tokensOut) || 0} out`;
}

/** Formats a byte count. */
export function bytes(count) {
  const n = Number(count) || 0;
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

/** Formats a duration in milliseconds. */
export function duration(ms) {
  const n = Number(ms) || 0;
  if (n < 1000) return `${n} ms`;
  if (n < 60_000) return `${(n / 1000).toFixed(1)} s`;
  return `${Math.floor(n / 60_000)} min ${Math.round((n % 60_000) / 1000)} s`;
}

/** A short local time for an RFC 3339 timestamp. */
export function when(timestamp) {
  const at = new Date(timestamp);
  if (Number.isNaN(at.getTime())) return '';
  const today = new Date();
  const sameDay = at.toDateString() === today.toDateString();
  return sameDay
    ? at.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' })
    : at.toLocaleDateString([], { month: 'short', day: 'numeric' });
}

/** Pretty JSON for display. */
export function pretty(value) {
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

/** Runs `fn` once soon, however often it is asked for before then. */
export function coalesce(fn, delayMs = 16) {
  let timer = null;
  return () => {
    if (timer !== null) return;
    timer = setTimeout(() => {
      timer = null;
      fn();
    }, delayMs);
  };
}
