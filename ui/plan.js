// The plan panel: the steps of the latest `plan/updated`, each with its status.

import { h, byTestId } from './dom.js';

const MARKS = { completed: '✓', in_progress: '▶', pending: '○' };

/** The plan panel of one session. */
export class Plan {
  /**
   * @param {HTMLElement} panel the plan panel
   * @param {import('./state.js').SessionState} state
   */
  constructor(panel, state) {
    this.list = byTestId('plan', panel);
    this.empty = byTestId('plan-empty', panel);
    this.explanation = byTestId('plan-explanation', panel);
    state.on('state/reset', () => this.show({ plan: [] }));
    state.on('plan/updated', (p) => this.show(p));
  }

  show({ explanation, plan }) {
    const steps = Array.isArray(plan) ? plan : [];
    this.empty.hidden = steps.length > 0;
    this.explanation.hidden = !explanation;
    this.explanation.textContent = explanation ?? '';
    this.list.replaceChildren(
      ...steps.map((step) =>
        h(
          'li',
          { testid: 'plan-step', dataset: { status: step.status } },
          h('span', { class: 'mark', 'aria-hidden': 'true', text: MARKS[step.status] ?? '•' }),
          h('span', { testid: 'plan-step-text', text: step.step }),
          h('span', { class: 'visually-hidden', text: ` (${String(step.status).replace('_', ' ')})` }),
        ),
      ),
    );
  }
}
