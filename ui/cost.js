// The cost panel: the session's total and tokens, a row per turn (and per background task or
// direct call that paid for model calls), a row per model (a session may use several: its
// own choice, a turn's, a pipeline's nodes) and a row per cost-ledger entry (node). The ledger
// over REST is the source; turn/completed moves the total at once, before the ledger is read.
// A model `model/list` says is unpriced is marked so: its $0.00 means "not counted", not free.
// Prompt tokens show their cached share ("1200 (800 cached)"): those are priced lower, so
// they explain a turn that cost less than its token count suggests. A fork shows apart what
// its parent had spent up to the fork (`inherited_usd`): the copied turns' footers carry
// those costs, but the fork's own spend starts at zero.

import { h, byTestId, coalesce, promptTokens, tokenSummary, usd } from './dom.js';
import { getJson } from './rest.js';

/** The cost panel of one session. */
export class Cost {
  /**
   * @param {HTMLElement} panel the cost panel
   * @param {import('./state.js').SessionState} state
   */
  constructor(panel, state) {
    this.state = state;
    this.total = byTestId('cost-total', panel);
    this.totalLabel = byTestId('cost-total-label', panel);
    this.inheritedRow = byTestId('cost-inherited-row', panel);
    this.inherited = byTestId('cost-inherited', panel);
    this.tokens = byTestId('cost-tokens', panel);
    this.turnRows = byTestId('cost-turns', panel).tBodies[0];
    this.modelRows = byTestId('cost-models', panel).tBodies[0];
    this.nodeRows = byTestId('cost-nodes', panel).tBodies[0];
    /** What `model/list` says of each model, by id; the ledger's rows name models so. */
    this.models = new Map();
    /** The ledger last read, redrawn when the model list arrives after it. */
    this.ledger = null;
    this.refresh = coalesce(() => this.load(), 100);
    this.reset();
    state.on('state/reset', () => this.reset());
    state.on('turn/started', (p) => {
      if (!this.turnNumbers.has(p.turn_id)) this.turnNumbers.set(p.turn_id, this.turnNumbers.size + 1);
    });
    state.on('turn/completed', (p) => {
      this.setTotal(p.session_cost_usd);
      this.refresh();
    });
    state.on('turn/error', () => this.refresh());
    state.on('turn/spawn_complete', () => this.refresh());
    state.on('tool/completed', (p) => {
      // A direct call of a model-calling tool (run_pipeline) adds ledger rows too.
      if (!p.turn_id && p.structured_metadata?.node_costs) this.refresh();
    });
  }

  reset() {
    this.turnNumbers = new Map();
    this.setTotal(0);
    this.setInherited(0);
    this.setTokens({});
    this.ledger = null;
    this.turnRows.replaceChildren();
    this.modelRows.replaceChildren();
    this.nodeRows.replaceChildren();
  }

  /** Takes the server's models (`model/list`), to say which ones are unpriced. */
  setModels(models) {
    this.models = new Map((models ?? []).map((model) => [model.id, model]));
    if (this.ledger) this.showModels(this.ledger.rows);
  }

  setTotal(amount) {
    this.total.dataset.usd = String(amount ?? 0);
    this.total.textContent = usd(amount);
  }

  /** Shows what a fork inherited; a session that inherited nothing shows no such line. */
  setInherited(amount) {
    const value = Number(amount) || 0;
    this.inherited.dataset.usd = String(value);
    this.inherited.textContent = usd(value);
    this.inheritedRow.hidden = value === 0;
    this.totalLabel.textContent = value === 0 ? 'Session total' : 'Spent here';
  }

  /** Shows the session's token totals; the cached count also as `data-cached` for tests. */
  setTokens({ tokens_in: tokensIn, tokens_out: tokensOut, tokens_cached: tokensCached }) {
    this.tokens.dataset.cached = String(tokensCached ?? 0);
    this.tokens.textContent = tokenSummary(tokensIn, tokensOut, tokensCached);
  }

  /** Reads the ledger and redraws the panel. */
  async load() {
    const sessionId = this.state.sessionId;
    if (!sessionId) return;
    let ledger;
    try {
      ledger = await getJson(`api/sessions/${encodeURIComponent(sessionId)}/cost`);
    } catch {
      return;
    }
    if (sessionId !== this.state.sessionId) return;
    this.ledger = ledger;
    this.setTotal(ledger.session_cost_usd);
    this.setInherited(ledger.inherited_usd);
    this.setTokens(ledger);
    const groups = new Map();
    for (const row of ledger.rows) {
      const key = row.turn_id ? `turn:${row.turn_id}` : row.task_id ? `task:${row.task_id}` : 'direct';
      const group = groups.get(key) ?? { row, usd: 0, tokensIn: 0, tokensOut: 0, tokensCached: 0 };
      group.usd += row.actual_usd;
      group.tokensIn += row.tokens_in;
      group.tokensOut += row.tokens_out;
      group.tokensCached += row.tokens_cached ?? 0;
      groups.set(key, group);
    }
    this.turnRows.replaceChildren(
      ...[...groups.entries()].map(([key, group]) =>
        h(
          'tr',
          { testid: 'cost-turn-row', dataset: { key, cached: String(group.tokensCached) } },
          h('td', { text: this.label(group.row), title: key }),
          h('td', { text: `${promptTokens(group.tokensIn, group.tokensCached)} / ${group.tokensOut}` }),
          h('td', { class: 'num', text: usd(group.usd) }),
        ),
      ),
    );
    this.showModels(ledger.rows);
    this.nodeRows.replaceChildren(
      ...ledger.rows.map((row) =>
        h(
          'tr',
          {
            testid: 'cost-node-row',
            class: row.committed ? null : 'uncommitted',
            title: row.committed ? null : `refused by the budget (reserved ${usd(row.reserved_usd)})`,
            dataset: { cached: String(row.tokens_cached ?? 0) },
          },
          h('td', { text: row.node_id }),
          h('td', { text: row.model }),
          h('td', { text: `${promptTokens(row.tokens_in, row.tokens_cached)} / ${row.tokens_out}` }),
          h('td', { class: 'num', text: usd(row.actual_usd) }),
        ),
      ),
    );
  }

  /** A row per model the ledger names, in the order each was first used. */
  showModels(rows) {
    const byModel = new Map();
    for (const row of rows) {
      const model = row.model || 'unknown';
      const group = byModel.get(model) ?? { calls: 0, usd: 0, tokensIn: 0, tokensOut: 0, tokensCached: 0 };
      // A call the budget refused was never made: it spent nothing and counts as no call.
      if (row.committed) group.calls += 1;
      group.usd += row.actual_usd;
      group.tokensIn += row.tokens_in;
      group.tokensOut += row.tokens_out;
      group.tokensCached += row.tokens_cached ?? 0;
      byModel.set(model, group);
    }
    this.modelRows.replaceChildren(
      ...[...byModel.entries()].map(([model, group]) => {
        const unpriced = this.models.get(model)?.priced === false;
        return h(
          'tr',
          {
            testid: 'cost-model-row',
            class: unpriced ? 'unpriced' : null,
            dataset: { model, usd: String(group.usd), calls: String(group.calls), priced: String(!unpriced) },
          },
          h('td', { class: 'cost-model', text: model, title: model }),
          h('td', { class: 'num', text: String(group.calls) }),
          h('td', { text: `${promptTokens(group.tokensIn, group.tokensCached)} / ${group.tokensOut}` }),
          unpriced
            ? h('td', {
                class: 'num',
                testid: 'cost-model-unpriced',
                title: 'This model has no price ([llm.pricing]): its calls are counted as $0 and toward no budget',
                text: 'unpriced',
              })
            : h('td', { class: 'num', text: usd(group.usd) }),
        );
      }),
    );
  }

  label(row) {
    if (row.turn_id) {
      const number = this.turnNumbers.get(row.turn_id);
      return number ? `turn ${number}` : 'turn';
    }
    if (row.task_id) return `task ${row.task_id.slice(0, 8)}`;
    return 'direct calls';
  }
}
