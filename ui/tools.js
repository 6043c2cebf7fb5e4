// The tools panel: the session's active, deferred and hidden tools (with the reason each is
// hidden), redrawn from `tool/list` whenever `tools/changed` arrives. A deferred tool can be
// activated from here, the way the model would: by calling `activate_tools`.

import { h, byTestId, coalesce } from './dom.js';

const REASONS = {
  policy_deny: 'denied by the server policy',
  provider_policy: "denied for this model's provider",
  require_tags: 'lacks the tags the policy requires',
  context_filter: "outside this server's context tags",
};

/** The tools panel of one session. */
export class Tools {
  /**
   * @param {HTMLElement} panel the tools panel
   * @param {import('./state.js').SessionState} state
   * @param {import('./connection.js').Connection} connection
   * @param {(list: object) => void} onList called with every `tool/list` answer
   */
  constructor(panel, state, connection, onList) {
    this.state = state;
    this.connection = connection;
    this.onList = onList;
    this.sections = {
      active: byTestId('tools-active', panel),
      deferred: byTestId('tools-deferred', panel),
      hidden: byTestId('tools-hidden', panel),
    };
    this.counts = {
      active: byTestId('tools-active-count', panel),
      deferred: byTestId('tools-deferred-count', panel),
      hidden: byTestId('tools-hidden-count', panel),
    };
    this.refreshSoon = coalesce(() => this.refresh(), 50);
    state.on('state/reset', () => this.render({ active: [], deferred: [], hidden: [] }));
    state.on('tools/changed', () => this.refreshSoon());
  }

  /** Reads `tool/list` and redraws. */
  async refresh() {
    const sessionId = this.state.sessionId;
    if (!sessionId) return;
    try {
      const list = await this.connection.request('tool/list', { session_id: sessionId });
      if (sessionId !== this.state.sessionId) return;
      this.render(list);
      this.onList(list);
    } catch {
      // Disconnected: the next open refreshes again.
    }
  }

  render(list) {
    const info = (tool, state, extra) =>
      h(
        'li',
        { testid: 'tool-item', dataset: { toolName: tool.name, state }, title: tool.description ?? '' },
        h('span', { class: 'tool-item-name', text: tool.name }),
        tool.group ? h('span', { class: 'badge', text: tool.group }) : null,
        tool.spawn_only ? h('span', { class: 'badge background', text: 'background' }) : null,
        extra,
      );
    this.sections.active.replaceChildren(...(list.active ?? []).map((tool) => info(tool, 'active')));
    this.sections.deferred.replaceChildren(
      ...(list.deferred ?? []).map((tool) =>
        info(
          tool,
          'deferred',
          h('button', {
            type: 'button',
            class: 'secondary small',
            testid: 'tool-activate',
            text: 'Activate',
            onclick: (event) => this.activate(tool.name, event.currentTarget),
          }),
        ),
      ),
    );
    this.sections.hidden.replaceChildren(
      ...(list.hidden ?? []).map((tool) =>
        h(
          'li',
          { testid: 'tool-item', dataset: { toolName: tool.name, state: 'hidden', reason: tool.reason } },
          h('span', { class: 'tool-item-name', text: tool.name }),
          h('span', { class: 'reason', testid: 'tool-hidden-reason', text: REASONS[tool.reason] ?? tool.reason }),
        ),
      ),
    );
    for (const key of Object.keys(this.counts)) this.counts[key].textContent = String((list[key] ?? []).length);
  }

  async activate(name, button) {
    button.disabled = true;
    try {
      await this.connection.request('tool/invoke', {
        session_id: this.state.sessionId,
        name: 'activate_tools',
        arguments: { tools: [name] },
      });
    } catch (err) {
      button.title = err.message;
    } finally {
      button.disabled = false;
    }
    this.refreshSoon();
  }
}
