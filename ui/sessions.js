// The session list: the caller's sessions from REST, newest first, and a button for a new
// one. Choosing one is the page's job (it changes the URL and re-opens).

import { h, byTestId, coalesce, when } from './dom.js';
import { getJson } from './rest.js';

/** The sessions sidebar. */
export class Sessions {
  /**
   * @param {HTMLElement} nav the sidebar
   * @param {import('./state.js').SessionState} state
   * @param {{select: (id: string) => void, create: () => void}} actions
   */
  constructor(nav, state, actions) {
    this.nav = nav;
    this.list = byTestId('session-list', nav);
    this.state = state;
    this.actions = actions;
    this.sessions = [];
    this.refreshSoon = coalesce(() => this.refresh(), 200);
    byTestId('new-session', nav).addEventListener('click', () => actions.create());
    state.on('state/reset', () => this.render());
    state.on('state/session', () => this.refreshSoon());
    state.on('turn/completed', () => this.refreshSoon());
  }

  async refresh() {
    try {
      ({ sessions: this.sessions } = await getJson('api/sessions'));
    } catch {
      return;
    }
    this.render();
  }

  render() {
    const current = this.state.sessionId;
    const items = this.sessions.map((session) => {
      const title = session.title || `Session ${session.session_id.slice(0, 8)}`;
      const button = h(
        'button',
        {
          type: 'button',
          class: 'session-item',
          testid: 'session-item',
          dataset: { sessionId: session.session_id },
          'aria-current': session.session_id === current ? 'page' : null,
          title: session.session_id,
          onclick: () => this.actions.select(session.session_id),
        },
        h('span', { class: 'session-title', text: title }),
        h('span', { class: 'session-meta', text: `${when(session.updated_at)} · ${session.last_seq} events` }),
      );
      return h('li', {}, button);
    });
    if (!items.length) items.push(h('li', { class: 'empty', text: 'No sessions yet.' }));
    this.list.replaceChildren(...items);
  }
}
