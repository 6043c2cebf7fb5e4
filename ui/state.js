// The session the page shows: which one, the highest event seq applied, and who wants which
// notifications. Every notification passes through `accept`, which drops events of other
// sessions and any seq already applied, so a replay after a reconnect never shows an event
// twice.

/** The current session and the notifications applied to it. */
export class SessionState {
  constructor() {
    /** The session shown, or null before the first open. */
    this.sessionId = null;
    /** The highest seq applied; the `after_seq` of the next resume. */
    this.lastSeq = 0;
    /** Events dropped because their seq was applied already (a resume should cause none). */
    this.repeated = 0;
    /** Whether the server has a model (null until known). */
    this.llmConfigured = null;
    this.listeners = new Map();
    /**
     * While a `session/open` is in flight, the session's notifications wait here: frames
     * of an earlier watch of the same session may arrive among the replay, out of order.
     */
    this.held = null;
  }

  /** A `session/open` of the shown session is on its way: hold its notifications. */
  beginOpen() {
    this.held = [];
  }

  /** The open answered (or failed): apply what was held in seq order, repeats dropped. */
  endOpen() {
    const held = this.held ?? [];
    this.held = null;
    held.sort((a, b) => (a.params?.seq ?? 0) - (b.params?.seq ?? 0));
    for (const message of held) this.accept(message);
  }

  /** Calls `fn(params, method)` for each accepted notification `method` ('*' for all). */
  on(method, fn) {
    if (!this.listeners.has(method)) this.listeners.set(method, []);
    this.listeners.get(method).push(fn);
  }

  emit(method, params) {
    for (const fn of this.listeners.get(method) ?? []) fn(params, method);
    for (const fn of this.listeners.get('*') ?? []) fn(params, method);
  }

  /** Shows another session (or none yet, for a fresh one): every panel starts empty. */
  reset(sessionId) {
    this.sessionId = sessionId;
    this.lastSeq = 0;
    this.held = null;
    this.emit('state/reset', { session_id: sessionId });
  }

  /** Names the session a fresh open created, keeping what was applied. */
  adopt(sessionId) {
    this.sessionId = sessionId;
    this.emit('state/session', { session_id: sessionId });
  }

  /** Applies one notification; false when it belongs elsewhere or was applied already. */
  accept(message) {
    const params = message.params ?? {};
    if (params.session_id !== this.sessionId) return false;
    if (this.held !== null) {
      this.held.push(message);
      return false;
    }
    if (typeof params.seq === 'number') {
      if (params.seq <= this.lastSeq && message.method === 'approval/requested') {
        // A request still waiting is sent again on every attach, with its first seq: not a
        // repeat of the replay. Its listener keeps one card per approval_id.
        this.emit(message.method, params);
        return true;
      }
      if (params.seq <= this.lastSeq) {
        this.repeated += 1;
        return false;
      }
      this.lastSeq = params.seq;
    }
    this.emit(message.method, params);
    return true;
  }
}
