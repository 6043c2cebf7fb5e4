// Approval cards: `approval/requested` shows what a waiting call would do (the command, where,
// why it asks) with Accept / Accept for session / Decline, answered with `approval/respond`.
// Once `approval/resolved` arrives the card gives way to a one-line record in the call's card:
// who decided (you, a person, or the server) and what. A request arrives again when a client
// re-attaches while it waits, so cards are keyed by approval_id; one that a replayed history
// also resolves is drawn as its record at once, never as waiting.

import { h, coalesce } from './dom.js';

/** What a decision did, as a verb. */
const DECIDED = {
  accept: 'accepted this call',
  accept_for_session: 'accepted this call for the rest of the session',
  decline: 'declined this call',
};

/** Who decided, by the record's `data-by`. */
const WHO = { you: 'You', person: 'A person', server: 'The server' };

/** Why the server declined a call itself, by `approval/resolved.reason`. */
const DECLINED_BECAUSE = {
  timeout: 'no decision came in time',
  interrupted: 'the turn was stopped',
  server_restarted: 'the server restarted while the call waited',
};

/** The command a call would run: the shell line for shell tools, else compact JSON. */
export function commandOf(toolName, args) {
  const value = toolName === 'shell' ? args?.command : toolName === 'exec_command' ? args?.cmd : undefined;
  if (typeof value === 'string') return value;
  if (Array.isArray(value)) return value.join(' ');
  try {
    return JSON.stringify(args ?? {});
  } catch {
    return String(args);
  }
}

/** Whether the person is in the middle of writing something focus must not be taken from. */
function typing() {
  const el = document.activeElement;
  if (!el || el === document.body) return false;
  if (el.closest('dialog[open]')) return true;
  const field = el.tagName === 'TEXTAREA' || (el.tagName === 'INPUT' && el.type !== 'button' && el.type !== 'submit');
  return field && el.value !== '';
}

/** The approval cards of one session. */
export class Approvals {
  /**
   * @param {import('./state.js').SessionState} state
   * @param {import('./connection.js').Connection} connection
   * @param {(toolCallId: string, node: HTMLElement) => void} place puts a card beside its
   *   tool call in the conversation
   * @param {() => void} onDone returns focus where typing goes, after the keyboard decided
   */
  constructor(state, connection, place, onDone) {
    this.state = state;
    this.connection = connection;
    this.place = place;
    this.onDone = onDone;
    // A replayed request and its resolution arrive together: draw after both.
    this.renderSoon = coalesce(() => this.render(), 0);
    this.reset();
    state.on('state/reset', () => this.reset());
    state.on('approval/requested', (p) => this.requested(p));
    state.on('approval/resolved', (p) => this.resolved(p));
  }

  reset() {
    /** Requests not drawn yet, by approval_id. */
    this.waiting = new Map();
    /** Drawn cards still waiting, by approval_id. */
    this.cards = new Map();
    /** Decisions heard, by approval_id: a request arriving after its decision stays closed. */
    this.decided = new Map();
    /** Requests this page is deciding: their record says "you". */
    this.mine = new Set();
  }

  requested(p) {
    const id = p.approval_id;
    if (this.decided.has(id) || this.waiting.has(id) || this.cards.has(id)) return;
    this.waiting.set(id, p);
    this.renderSoon();
  }

  resolved(p) {
    const id = p.approval_id;
    if (this.decided.has(id)) return;
    this.decided.set(id, p);
    const request = this.waiting.get(id);
    if (request) {
      // Replayed with its request: the record alone tells the story.
      this.waiting.delete(id);
      this.place(request.tool_call_id, this.record(request, p));
      return;
    }
    const card = this.cards.get(id);
    if (card) this.settle(card, p);
  }

  render() {
    for (const p of this.waiting.values()) this.draw(p);
    this.waiting.clear();
  }

  draw(p) {
    const command = commandOf(p.tool_name, p.arguments);
    const workdir = typeof p.arguments?.workdir === 'string' ? p.arguments.workdir : null;
    const message = h('input', {
      type: 'text',
      class: 'approval-message',
      testid: 'approval-message',
      placeholder: 'Reason to decline (optional; Enter declines)',
      'aria-label': 'Message for the agent, sent with Decline',
    });
    const button = (testid, text, decision, cls) =>
      h('button', { type: 'button', class: cls, testid, text, onclick: () => this.decide(card, decision) });
    const accept = button('approval-accept', 'Accept', 'accept', 'primary');
    const acceptSession = button('approval-accept-session', 'Accept for session', 'accept_for_session', 'secondary');
    const decline = button('approval-decline', 'Decline', 'decline', 'secondary');
    const status = h('p', { class: 'approval-status', testid: 'approval-status', role: 'status' });
    const fact = (label, value, testid) =>
      h('div', { class: 'approval-fact' }, h('dt', { text: label }), h('dd', { testid, text: value }));
    const el = h(
      'section',
      {
        class: 'approval-card',
        testid: 'approval-card',
        dataset: { approvalId: p.approval_id, toolCallId: p.tool_call_id, state: 'pending' },
        role: 'group',
        'aria-label': `Approval for ${p.tool_name}`,
      },
      h(
        'header',
        {},
        h('span', { class: 'approval-title', text: 'Approve this call?' }),
        h('span', { class: 'tool-name', testid: 'approval-tool', text: p.tool_name }),
        p.agent_id ? h('span', { class: 'badge', testid: 'approval-agent', text: `sub-agent ${p.agent_id}` }) : null,
      ),
      h('pre', { class: 'approval-command', testid: 'approval-command', text: command }),
      h(
        'dl',
        { class: 'approval-facts' },
        fact('in', p.cwd ?? '', 'approval-cwd'),
        workdir ? fact('workdir', workdir, 'approval-workdir') : null,
        p.reason ? fact('why', p.reason, 'approval-reason') : null,
      ),
      h('div', { class: 'approval-actions' }, accept, acceptSession, decline, message),
      status,
    );
    el.addEventListener('keydown', (event) => {
      // Escape leaves the card waiting and goes back to the composer; it never decides.
      if (event.key === 'Escape') {
        event.preventDefault();
        this.onDone();
      } else if (event.key === 'Enter' && event.target === message) {
        event.preventDefault();
        this.decide(card, 'decline');
      }
    });
    const card = { el, p, buttons: [accept, acceptSession, decline], message, status };
    this.cards.set(p.approval_id, card);
    this.place(p.tool_call_id, el);
    if (!typing()) accept.focus();
  }

  async decide(card, decision) {
    const id = card.p.approval_id;
    if (!this.cards.has(id)) return;
    // Disabled buttons lose focus: remember now whether the keyboard was here.
    card.hadFocus = card.el.contains(document.activeElement);
    const text = card.message.value.trim();
    const params = { session_id: this.state.sessionId, approval_id: id, decision };
    if (decision === 'decline' && text) params.message = text;
    for (const b of card.buttons) b.disabled = true;
    card.status.textContent = 'Sending…';
    this.mine.add(id);
    try {
      await this.connection.request('approval/respond', params);
      // The resolution came before the answer and settled the card; an older server's may
      // still be on its way.
      if (this.cards.has(id)) this.settle(card, this.decided.get(id) ?? { approval_id: id, decision });
    } catch (err) {
      this.mine.delete(id);
      if (err.kind === 'unknown_approval') {
        card.status.textContent = 'The call no longer waits for a decision.';
      } else {
        card.status.textContent = `The decision was not taken: ${err.message}`;
        for (const b of card.buttons) b.disabled = false;
      }
    }
  }

  /** Replaces a waiting card with the record of its decision. */
  settle(card, p) {
    this.cards.delete(card.p.approval_id);
    const hadFocus = card.hadFocus || card.el.contains(document.activeElement);
    card.el.replaceWith(this.record(card.p, p));
    if (hadFocus) this.focusNext();
  }

  /**
   * The compact record of a decided request: who decided what, and why when the server
   * decided. A decline with a reason was the server's own (a timeout, a stopped turn, a
   * restart); any other decision was a person's: this page's, or someone else watching.
   */
  record(request, p) {
    const id = request.approval_id;
    const by = p.reason ? 'server' : this.mine.has(id) ? 'you' : 'person';
    const what = DECIDED[p.decision] ?? `decided ${p.decision}`;
    const why = p.reason ? `: ${DECLINED_BECAUSE[p.reason] ?? p.reason}` : '';
    const accepted = p.decision === 'accept' || p.decision === 'accept_for_session';
    return h(
      'div',
      {
        class: 'approval-record',
        testid: 'approval-record',
        role: 'note',
        dataset: { approvalId: id, toolCallId: request.tool_call_id, decision: p.decision, by, ...(p.reason ? { reason: p.reason } : {}) },
        title: request.reason ? `It asked because: ${request.reason}` : null,
      },
      h('span', { class: 'approval-record-mark', 'aria-hidden': 'true', text: accepted ? '✓' : '✕' }),
      h('span', { class: 'approval-record-text', testid: 'approval-record-text', text: `${WHO[by]} ${what}${why}` }),
      request.agent_id ? h('span', { class: 'badge', text: `sub-agent ${request.agent_id}` }) : null,
    );
  }

  /** Moves focus to the next waiting card's Accept, or back to the composer. */
  focusNext() {
    const next = this.cards.values().next().value;
    if (next) next.buttons[0].focus();
    else this.onDone();
  }
}
