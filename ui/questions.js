// The dialog for `user_input/requested`: the model's questions, answered with
// `user_input/respond`. A question is pending until its request_user_input call completes,
// so a replayed history does not ask again what was already answered.

import { h, byTestId, coalesce } from './dom.js';

/** The questions dialog of one session. */
export class Questions {
  /**
   * @param {HTMLDialogElement} dialog
   * @param {import('./state.js').SessionState} state
   * @param {import('./connection.js').Connection} connection
   */
  constructor(dialog, state, connection) {
    this.dialog = dialog;
    this.form = byTestId('questions-form', dialog);
    this.state = state;
    this.connection = connection;
    // A replayed question and the answer that closed it arrive together: decide after both.
    this.renderSoon = coalesce(() => this.render(), 50);
    this.reset();
    state.on('state/reset', () => this.reset());
    state.on('tool/started', (p) => {
      if (p.tool_name === 'request_user_input') this.openCalls.push(p.tool_call_id);
    });
    state.on('user_input/requested', (p) => {
      // The request belongs to the oldest asking call that has no request yet.
      const call = this.openCalls.find((id) => ![...this.pending.values()].some((r) => r.call === id));
      this.pending.set(p.request_id, { ...p, call });
      this.renderSoon();
    });
    state.on('tool/completed', (p) => {
      if (p.tool_name !== 'request_user_input') return;
      this.openCalls = this.openCalls.filter((id) => id !== p.tool_call_id);
      for (const [id, request] of this.pending) {
        if (request.call === p.tool_call_id) this.pending.delete(id);
      }
      this.renderSoon();
    });
    dialog.addEventListener('cancel', (event) => event.preventDefault());
  }

  reset() {
    this.pending = new Map();
    this.openCalls = [];
    this.shown = null;
    if (this.dialog.open) this.dialog.close();
  }

  render() {
    const next = this.pending.values().next().value;
    if (!next) {
      this.shown = null;
      if (this.dialog.open) this.dialog.close();
      return;
    }
    if (this.shown === next.request_id) return;
    this.shown = next.request_id;
    const fields = (next.questions ?? []).map((q, index) => {
      const name = `q${index}`;
      const options = Array.isArray(q.options) ? q.options : [];
      const input = options.length
        ? h(
            'div',
            { class: 'options', role: 'radiogroup' },
            options.map((option, k) =>
              h(
                'label',
                { class: 'option' },
                h('input', { type: 'radio', name, value: option.label, required: true, checked: k === 0 }),
                h('span', { class: 'option-label', text: option.label }),
                option.description ? h('span', { class: 'option-description', text: option.description }) : null,
              ),
            ),
            h('label', { class: 'option other' }, h('input', { type: 'radio', name, value: '' }), h('input', { type: 'text', name: `${name}-other`, placeholder: 'Something else', 'aria-label': 'Another answer' })),
          )
        : h('textarea', { name, rows: 2, required: true, testid: 'question-answer' });
      return h('fieldset', { testid: 'question', dataset: { questionId: q.id } }, h('legend', { text: q.header ?? q.id }), h('p', { text: q.question ?? '' }), input);
    });
    const status = h('p', { class: 'question-status', testid: 'question-status' });
    const submit = h('button', { type: 'submit', class: 'primary', testid: 'question-submit', text: 'Answer' });
    this.form.replaceChildren(h('h2', {}, 'The agent asks'), ...fields, status, h('div', { class: 'dialog-actions' }, submit));
    this.form.onsubmit = async (event) => {
      event.preventDefault();
      const data = new FormData(this.form);
      const answers = {};
      (next.questions ?? []).forEach((q, index) => {
        const value = data.get(`q${index}`);
        answers[q.id] = value === '' || value === null ? String(data.get(`q${index}-other`) ?? '') : String(value);
      });
      submit.disabled = true;
      try {
        await this.connection.request('user_input/respond', {
          session_id: this.state.sessionId,
          request_id: next.request_id,
          answers,
        });
        this.pending.delete(next.request_id);
        this.render();
      } catch (err) {
        status.textContent = `The answer was not taken: ${err.message}`;
        if (err.kind === 'unknown_request') {
          this.pending.delete(next.request_id);
          this.render();
        }
      } finally {
        submit.disabled = false;
      }
    };
    if (!this.dialog.open) this.dialog.showModal();
  }
}
