// JSON-RPC 2.0 over the WebSocket at api/ws: requests matched to answers by id,
// notifications handed on, and reconnection after a drop. Resuming (session/open with
// after_seq) is the caller's `onOpen`; dropping repeated events is the session state's job.

/** An error answer, or a request that could not be answered because the socket closed. */
export class RpcError extends Error {
  constructor(code, kind, message) {
    super(message);
    this.code = code;
    this.kind = kind;
  }
}

/** Delay before reconnect attempt `n` (0-based): at once, then doubling up to 5 s, varied. */
function backoff(attempt) {
  if (attempt === 0) return 0;
  const base = Math.min(5000, 250 * 2 ** attempt);
  return Math.round(base * (0.8 + Math.random() * 0.4));
}

/** The WebSocket URL beside the page, with the token as `?token=` (browsers cannot set headers). */
export function socketUrl(token) {
  const url = new URL('api/ws', document.baseURI);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  if (token) url.searchParams.set('token', token);
  return url.toString();
}

/** One JSON-RPC connection that keeps itself open. */
export class Connection {
  /**
   * @param {object} options
   * @param {string} options.url the WebSocket URL
   * @param {(message: object) => void} options.onNotification every notification, in order
   * @param {() => Promise<void>} options.onOpen runs on every (re)connect before the
   *   connection counts as live; it re-opens the session
   * @param {(status: string, detail?: string) => void} options.onStatus `connecting`, `live`,
   *   `reconnecting`
   */
  constructor({ url, onNotification, onOpen, onStatus }) {
    this.url = url;
    this.onNotification = onNotification;
    this.onOpen = onOpen;
    this.onStatus = onStatus;
    this.socket = null;
    this.pending = new Map();
    this.nextId = 1;
    this.attempt = 0;
    this.opened = false;
    this.held = false;
    this.timer = null;
    this.status = 'connecting';
    /** Every status this connection went through, oldest first. */
    this.statusLog = [];
  }

  /** Connects for the first time. */
  start() {
    this.connect();
  }

  setStatus(status, detail) {
    this.status = status;
    this.statusLog.push(status);
    if (this.statusLog.length > 100) this.statusLog.shift();
    this.onStatus(status, detail);
  }

  connect() {
    this.timer = null;
    this.setStatus(this.opened ? 'reconnecting' : 'connecting');
    const socket = new WebSocket(this.url);
    this.socket = socket;
    socket.addEventListener('open', () => this.whenOpen(socket));
    socket.addEventListener('message', (event) => {
      if (this.socket === socket) this.receive(event.data);
    });
    socket.addEventListener('close', (event) => {
      if (this.socket === socket) this.whenClosed(event);
    });
  }

  async whenOpen(socket) {
    try {
      await this.onOpen();
    } catch (err) {
      // The socket dropped during the resume: the close handler reconnects.
      if (err instanceof RpcError && err.kind === 'disconnected') return;
      if (this.socket !== socket) return;
      this.attempt = 0;
      this.opened = true;
      this.setStatus('live', err.message);
      return;
    }
    if (this.socket !== socket) return;
    this.attempt = 0;
    this.opened = true;
    this.setStatus('live');
  }

  whenClosed(event) {
    this.socket = null;
    for (const { reject } of this.pending.values()) {
      reject(new RpcError(0, 'disconnected', 'the connection to the server was lost'));
    }
    this.pending.clear();
    const delay = backoff(this.attempt);
    this.attempt += 1;
    const why = event.reason ? `closed: ${event.reason}` : `closed (${event.code})`;
    this.setStatus('reconnecting', delay > 0 ? `${why}; retrying in ${Math.ceil(delay / 1000)} s` : why);
    if (this.held) return;
    this.timer = setTimeout(() => this.connect(), delay);
  }

  receive(text) {
    let message;
    try {
      message = JSON.parse(text);
    } catch {
      return;
    }
    if (message.id !== undefined && message.id !== null && !message.method) {
      const waiting = this.pending.get(message.id);
      if (!waiting) return;
      this.pending.delete(message.id);
      if (message.error) {
        const { code, message: why, data } = message.error;
        waiting.reject(new RpcError(code, data?.kind ?? 'error', why));
      } else {
        waiting.resolve(message.result);
      }
    } else if (typeof message.method === 'string') {
      this.onNotification(message);
    }
  }

  /** Sends a request; resolves with its result, rejects with an {@link RpcError}. */
  request(method, params) {
    const socket = this.socket;
    if (!socket || socket.readyState !== WebSocket.OPEN) {
      return Promise.reject(new RpcError(0, 'disconnected', 'not connected to the server'));
    }
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      socket.send(JSON.stringify({ jsonrpc: '2.0', id, method, params }));
    });
  }

  /**
   * Closes the socket as a network drop would. With `hold`, no reconnect happens until
   * {@link resumeForTest}, so a test can make the server emit events while the page is away.
   */
  dropForTest({ hold = false } = {}) {
    this.held = hold;
    if (this.timer !== null) {
      clearTimeout(this.timer);
      this.timer = null;
    }
    this.socket?.close(4000, 'dropped on purpose');
  }

  /** Ends a hold started by {@link dropForTest}. */
  resumeForTest() {
    this.held = false;
    if (!this.socket && this.timer === null) this.connect();
  }
}
