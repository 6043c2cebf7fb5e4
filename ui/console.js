// The tool console: call any tool of the session directly with `tool/invoke`, the same path
// a model's call takes (policy, argument checks, notifications). With no model configured it
// is how agentd is used.

import { h, byTestId, pretty, replace } from './dom.js';

/** Starting arguments for common tools, so a first call needs little typing. */
const EXAMPLES = {
  list_dir: { path: '.' },
  read_file: { path: 'README.md' },
  write_file: { path: 'notes.txt', content: 'hello\n' },
  glob: { pattern: '**/*.rs' },
  grep: { pattern: 'TODO' },
  shell: { command: 'ls -la' },
  exec_command: { cmd: 'ls -la' },
  update_plan: { plan: [{ step: 'Look around', status: 'in_progress' }] },
  tool_search: { query: 'edit a file' },
  activate_tools: { group: 'web' },
  web_fetch: { url: 'https://example.com' },
  workspace_diff: {},
  check_background_tasks: {},
};

/** The tool console of one session. */
export class ToolConsole {
  /**
   * @param {HTMLDetailsElement} panel the console panel
   * @param {import('./state.js').SessionState} state
   * @param {import('./connection.js').Connection} connection
   */
  constructor(panel, state, connection) {
    this.panel = panel;
    this.state = state;
    this.connection = connection;
    this.form = byTestId('console-form', panel);
    this.select = byTestId('console-tool', panel);
    this.args = byTestId('console-args', panel);
    this.description = byTestId('console-description', panel);
    this.result = byTestId('console-result', panel);
    this.tools = new Map();
    this.touched = false;
    this.args.addEventListener('input', () => {
      this.touched = true;
    });
    this.select.addEventListener('change', () => this.chosen());
    this.form.addEventListener('submit', (event) => {
      event.preventDefault();
      this.invoke();
    });
    state.on('state/reset', () => {
      this.result.hidden = true;
      this.result.replaceChildren();
    });
  }

  /** Offers the session's callable tools (active and deferred; calling a deferred one activates it). */
  setTools(list) {
    const previous = this.select.value;
    this.tools = new Map([...(list.active ?? []), ...(list.deferred ?? [])].map((tool) => [tool.name, tool]));
    const names = [...this.tools.keys()].sort();
    this.select.replaceChildren(...names.map((name) => h('option', { value: name, text: list.deferred?.some((t) => t.name === name) ? `${name} (deferred)` : name })));
    if (names.includes(previous)) this.select.value = previous;
    else if (names.includes('list_dir')) this.select.value = 'list_dir';
    this.chosen(previous === this.select.value);
  }

  chosen(same = false) {
    const tool = this.tools.get(this.select.value);
    this.description.textContent = tool?.description ?? '';
    if (!same && (!this.touched || !this.args.value.trim())) {
      this.args.value = pretty(EXAMPLES[this.select.value] ?? {});
      this.touched = false;
    }
  }

  /** Opens the console and puts the cursor in it. */
  focus() {
    this.panel.open = true;
    this.panel.scrollIntoView({ block: 'start', behavior: 'smooth' });
    this.select.focus();
  }

  async invoke() {
    const name = this.select.value;
    let args;
    try {
      args = this.args.value.trim() ? JSON.parse(this.args.value) : {};
    } catch (err) {
      this.show('error', 'invalid_json', `The arguments are not JSON: ${err.message}`);
      return;
    }
    const button = byTestId('console-invoke', this.panel);
    button.disabled = true;
    this.show('running', null, `Running ${name}…`);
    try {
      // The person at the console is the one an approval would ask: no card for their own call.
      const answer = await this.connection.request('tool/invoke', {
        session_id: this.state.sessionId,
        name,
        arguments: args,
        skip_approval: true,
      });
      this.show(answer.success ? 'success' : 'failure', null, answer.output, answer.structured_metadata);
    } catch (err) {
      this.show('error', err.kind, err.message);
    } finally {
      button.disabled = false;
    }
  }

  show(outcome, kind, text, metadata) {
    this.result.hidden = false;
    this.result.dataset.outcome = outcome;
    const label = { success: 'ok', failure: 'failed', error: `refused${kind ? ` (${kind})` : ''}`, running: 'running' }[outcome];
    replace(
      this.result,
      h('div', { class: `badge state-${outcome}`, testid: 'console-outcome', text: label }),
      h('pre', { class: 'console-output', testid: 'console-output', text: text ?? '' }),
      metadata === undefined || metadata === null
        ? null
        : h('details', {}, h('summary', {}, 'Metadata'), h('pre', { testid: 'console-metadata', text: pretty(metadata) })),
    );
  }
}
