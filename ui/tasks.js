// The background-task panel: one row per task with its live state and the tail of its
// output, a reader that pages through the stored output over REST (tail, head, grep), and a
// cancel button.

import { h, byTestId, bytes } from './dom.js';
import { getJson } from './rest.js';

/** Most characters of a task's output tail kept in its row. */
const TAIL_CHARS = 8192;
/** Lines per page of the reader, and the most one read returns. */
const PAGE_LINES = 100;
const MAX_LINES = 500;
const PAGE_MATCHES = 20;
const MAX_MATCHES = 100;

/** The tasks panel of one session. */
export class Tasks {
  /**
   * @param {HTMLElement} panel the tasks panel
   * @param {import('./state.js').SessionState} state
   * @param {import('./connection.js').Connection} connection
   */
  constructor(panel, state, connection) {
    this.panel = panel;
    this.list = byTestId('tasks', panel);
    this.empty = byTestId('tasks-empty', panel);
    this.count = byTestId('tasks-count', panel);
    this.state = state;
    this.connection = connection;
    this.rows = new Map();
    state.on('state/reset', () => this.reset());
    state.on('task/updated', (p) => this.update(p));
    state.on('task/output/delta', (p) => this.output(p));
    state.on('turn/spawn_complete', (p) => this.finished(p));
  }

  reset() {
    this.rows.clear();
    this.list.replaceChildren();
    this.refreshCount();
  }

  refreshCount() {
    const running = [...this.rows.values()].filter((r) => r.state === 'running').length;
    this.empty.hidden = this.rows.size > 0;
    this.count.textContent = this.rows.size ? `${running} running · ${this.rows.size}` : '';
  }

  /** Merges a task list (`task/list`), which also knows output sizes. */
  load(tasks) {
    for (const task of tasks) {
      const known = this.rows.has(task.task_id);
      const row = this.row(task.task_id, task.tool_name);
      // The list may be older than a live task/updated: an ended task never runs again here
      // (a sub-agent given more work says so with a new task/updated).
      if (!(known && row.state !== 'running' && task.state === 'running')) {
        this.setState(row, task.state, task.exit_code, task.reason);
      }
      row.totalBytes = Math.max(row.totalBytes, task.total_bytes ?? 0);
      row.size.textContent = bytes(row.totalBytes);
    }
    this.refreshCount();
  }

  row(taskId, toolName) {
    let row = this.rows.get(taskId);
    if (row) return row;
    const el = h('li', { class: 'task', testid: 'task-row', dataset: { taskId, state: 'running' } });
    const stateBadge = h('span', { class: 'badge', testid: 'task-state', text: 'running' });
    const size = h('span', { class: 'task-size', testid: 'task-bytes', text: '0 B' });
    const reason = h('p', { class: 'task-reason', testid: 'task-reason', hidden: true });
    const tail = h('pre', { class: 'task-tail', testid: 'task-output' });
    const result = h('p', { class: 'task-result', testid: 'task-result', hidden: true });
    const cancel = h('button', { type: 'button', class: 'secondary', testid: 'task-cancel', text: 'Cancel' });
    const more = h('button', { type: 'button', class: 'secondary', testid: 'task-show-more', text: 'Show more' });
    const reader = this.reader(taskId);
    el.append(
      h(
        'header',
        {},
        // A sub-agent is a task whose output is its transcript.
        h('span', {
          class: 'task-name',
          testid: 'task-name',
          text: toolName === 'spawn_agent' ? 'sub-agent' : toolName ?? 'task',
          title: toolName ?? '',
        }),
        stateBadge,
        size,
      ),
      h('code', { class: 'task-id', text: taskId, title: 'task handle' }),
      reason,
      tail,
      result,
      h('div', { class: 'task-actions' }, more, cancel),
      reader.el,
    );
    row = { el, stateBadge, size, reason, tail, result, cancel, text: '', state: 'running', totalBytes: 0, reader };
    cancel.addEventListener('click', () => this.cancel(taskId, row));
    more.addEventListener('click', () => {
      reader.el.hidden = !reader.el.hidden;
      more.textContent = reader.el.hidden ? 'Show more' : 'Hide';
      if (!reader.el.hidden) reader.read();
    });
    this.rows.set(taskId, row);
    this.list.append(el);
    this.refreshCount();
    return row;
  }

  setState(row, state, exitCode, reason) {
    row.state = state;
    row.el.dataset.state = state;
    const code = exitCode === null || exitCode === undefined ? '' : ` (exit ${exitCode})`;
    row.stateBadge.textContent = `${state}${code}`;
    row.stateBadge.className = `badge state-${state}`;
    row.cancel.hidden = state !== 'running';
    row.reason.hidden = !reason;
    row.reason.textContent = reason ?? '';
  }

  update(p) {
    const row = this.row(p.task_id, p.tool_name);
    this.setState(row, p.state, p.exit_code, p.reason);
    this.refreshCount();
  }

  output(p) {
    const row = this.row(p.task_id);
    const text = p.text ?? '';
    row.text = (row.text + text).slice(-TAIL_CHARS);
    row.tail.textContent = row.text;
    row.tail.scrollTop = row.tail.scrollHeight;
    const end = (p.offset ?? 0) + new TextEncoder().encode(text).length;
    row.totalBytes = Math.max(row.totalBytes, end);
    row.size.textContent = bytes(row.totalBytes);
  }

  finished(p) {
    const row = this.row(p.task_id, p.tool_name);
    const content = String(p.content ?? '').trim();
    row.result.hidden = !content;
    row.result.textContent = content.length > 400 ? `${content.slice(0, 400)}…` : content;
  }

  async cancel(taskId, row) {
    row.cancel.disabled = true;
    row.cancel.textContent = 'Cancelling…';
    try {
      const answer = await this.connection.request('task/cancel', { session_id: this.state.sessionId, task_id: taskId });
      // The final task/updated normally came first and said more (exit code, reason).
      if (row.state === 'running') this.setState(row, answer.state, null, null);
    } catch (err) {
      row.reason.hidden = false;
      row.reason.textContent = `cancel failed: ${err.message}`;
    } finally {
      row.cancel.disabled = false;
      row.cancel.textContent = 'Cancel';
      this.refreshCount();
    }
  }

  /** The output reader of one task: a mode, a page, and "more" to go on. */
  reader(taskId) {
    const mode = h(
      'select',
      { testid: 'task-viewer-mode', 'aria-label': 'Read mode' },
      h('option', { value: 'tail' }, 'last lines'),
      h('option', { value: 'head' }, 'from the start'),
      h('option', { value: 'grep' }, 'lines containing'),
    );
    const pattern = h('input', { type: 'search', testid: 'task-viewer-pattern', placeholder: 'text to find', hidden: true, 'aria-label': 'Text to find' });
    const readButton = h('button', { type: 'button', class: 'secondary', testid: 'task-viewer-read', text: 'Read' });
    const moreButton = h('button', { type: 'button', class: 'secondary', testid: 'task-viewer-more', text: 'More', hidden: true });
    const info = h('p', { class: 'task-viewer-info', testid: 'task-viewer-info' });
    const out = h('pre', { class: 'task-viewer-output', testid: 'task-viewer-output' });
    const el = h('div', { class: 'task-viewer', testid: 'task-viewer', hidden: true }, h('div', { class: 'task-viewer-controls' }, mode, pattern, readButton, moreButton), info, out);
    const route = `api/tasks/${encodeURIComponent(taskId)}/output`;
    let page = null;

    const show = (answer, text, more, note) => {
      out.textContent = text;
      moreButton.hidden = !more;
      const status = answer.complete ? 'complete' : 'still running';
      info.textContent = `${bytes(answer.total_bytes)} · ${status}${note ? ` · ${note}` : ''}`;
    };

    const read = async (next) => {
      const chosen = mode.value;
      pattern.hidden = chosen !== 'grep';
      if (chosen === 'grep' && !pattern.value) {
        info.textContent = 'Enter the text to find.';
        out.textContent = '';
        moreButton.hidden = true;
        return;
      }
      readButton.disabled = true;
      try {
        if (chosen === 'tail') {
          const lines = next && page?.mode === 'tail' ? Math.min(MAX_LINES, page.lines + PAGE_LINES) : PAGE_LINES;
          const answer = await getJson(route, { mode: 'tail', lines });
          page = { mode: 'tail', lines };
          const capped = answer.truncated && lines >= MAX_LINES;
          show(answer, answer.text, answer.truncated && !capped, capped ? `the last ${MAX_LINES} lines; read from the start for more` : `the last ${lines} lines`);
        } else if (chosen === 'head') {
          if (next && page?.mode === 'head' && page.nextOffset !== null) {
            const answer = await getJson(route, { mode: 'bytes', offset: page.nextOffset, limit_bytes: 65536 });
            page = { mode: 'head', nextOffset: answer.next_offset, text: page.text + answer.text };
            show(answer, page.text, answer.next_offset !== null, null);
          } else {
            const answer = await getJson(route, { mode: 'head', lines: PAGE_LINES });
            page = { mode: 'head', nextOffset: answer.next_offset, text: answer.text };
            show(answer, page.text, answer.next_offset !== null, null);
          }
        } else {
          const matches = next && page?.mode === 'grep' && page.pattern === pattern.value ? Math.min(MAX_MATCHES, page.matches + PAGE_MATCHES) : PAGE_MATCHES;
          const answer = await getJson(route, { mode: 'grep', pattern: pattern.value, max_matches: matches });
          page = { mode: 'grep', pattern: pattern.value, matches };
          const capped = answer.truncated && matches >= MAX_MATCHES;
          show(answer, answer.text || '(no line contains it)', answer.truncated && !capped, capped ? `the first ${MAX_MATCHES} matches` : null);
        }
      } catch (err) {
        info.textContent = `could not read the output: ${err.message}`;
      } finally {
        readButton.disabled = false;
      }
    };

    mode.addEventListener('change', () => {
      pattern.hidden = mode.value !== 'grep';
      if (mode.value !== 'grep') read(false);
    });
    pattern.addEventListener('keydown', (event) => {
      if (event.key === 'Enter') read(false);
    });
    readButton.addEventListener('click', () => read(false));
    moreButton.addEventListener('click', () => read(true));
    return { el, read: () => read(false) };
  }

  /** Opens the panel on one task's row. */
  reveal(taskId) {
    const row = this.rows.get(taskId);
    if (!row) return;
    this.panel.open = true;
    row.el.scrollIntoView({ block: 'nearest', behavior: 'smooth' });
    row.el.classList.remove('flash');
    void row.el.offsetWidth;
    row.el.classList.add('flash');
  }
}
