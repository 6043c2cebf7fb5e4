// Approval cards: `approval/requested` shows what a waiting call would do (the command, where,
// why it asks) with Accept / Accept for session / Decline, answered with `approval/respond`;
// `approval/resolved` marks the card with the decision. A request arrives again when a client
// re-attaches while it waits, so cards are keyed by approval_id; one that a replayed history
// also resolves is never shown as waiting.

import { h, coalesce } from './dom.js';

/** The words for a decision on a resolved card. */
const DECIDED = {
  accept: 'Accepted',
  accept_for_session: 'Accepted for this session',
  decline: 'Declined',
};

/** Why the server declined a call itself. */
const DECLINED_BECAUSE = {
  timeout: 'no decision came in time',
  interrupted: 'the turn was stopped',
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
    /** Drawn cards, by approval_id. */
    this.cards = new Map();
    /** Decisions heard, by approval_id: a request arriving after its decision stays closed. */
    this.decided = new Map();
  }

  requested(p) {
    const id = p.approval_id;
    if (this.decided.has(id) || this.waiting.has(id) || this.cards.has(id)) return;
    this.waiting.set(id, p);
    this.renderSoon();
  }

  resolved(p) {
    const id = p.approval_id;
    this.decided.set(id, p);
    if (this.waiting.delete(id)) return;
    const card = this.cards.get(id);
    if (card) this.mark(card, p);
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
    if (card.el.dataset.state !== 'pending') return;
    const hadFocus = card.el.contains(document.activeElement);
    const text = card.message.value.trim();
    const params = { session_id: this.state.sessionId, approval_id: card.p.approval_id, decision };
    if (decision === 'decline' && text) params.message = text;
    for (const b of card.buttons) b.disabled = true;
    card.status.textContent = 'Sending…';
    try {
      await this.connection.request('approval/respond', params);
      card.status.textContent = '';
      // The resolution may already be here; if not, it follows.
      this.mark(card, this.decided.get(card.p.approval_id) ?? { decision });
    } catch (err) {
      if (err.kind === 'unknown_approval') {
        card.status.textContent = 'The call no longer waits for a decision.';
      } else {
        card.status.textContent = `The decision was not taken: ${err.message}`;
        for (const b of card.buttons) b.disabled = false;
        return;
      }
    }
    if (hadFocus) this.focusNext();
  }

  /** Shows a card's decision; the buttons go. */
  mark(card, p) {
    const { el } = card;
    el.dataset.state = p.decision;
    if (p.reason) el.dataset.reason = p.reason;
    const why = p.reason ? ` (${DECLINED_BECAUSE[p.reason] ?? p.reason})` : '';
    const hadFocus = el.contains(document.activeElement);
    el.querySelector('.approval-title').textContent = `${DECIDED[p.decision] ?? p.decision}${why}`;
    el.querySelector('.approval-actions')?.remove();
    card.status.textContent = '';
    el.setAttribute('aria-label', `${card.p.tool_name}: ${DECIDED[p.decision] ?? p.decision}`);
    if (hadFocus) this.focusNext();
  }

  /** Moves focus to the next waiting card's Accept, or back to the composer. */
  focusNext() {
    for (const card of this.cards.values()) {
      if (card.el.dataset.state === 'pending') {
        card.buttons[0].focus();
        return;
      }
    }
    this.onDone();
  }
}
