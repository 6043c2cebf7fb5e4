// What each turn changed in the workspace, and putting it back: a "Changed files" block under
// a turn with a `turn/diff` (each file's part of the diff on a click), a Revert button that
// first previews what `session/revert` would do (and what it would overwrite that changed
// since the turn ended), and a line where the workspace was reverted (`session/reverted`)
// with a button that undoes that revert.

import { h } from './dom.js';
import { diffView, splitDiff } from './diff.js';

/** The badge's words for a file's change. */
const CHANGE = { added: 'added', modified: 'modified', deleted: 'deleted' };

/** "1 file", "3 files". */
function fileCount(count) {
  return `${count} file${count === 1 ? '' : 's'}`;
}

/** A file's path (or `label`, a button naming it) and its change as a small badge. */
function fileLine(file, testid, label = file.path) {
  const change = String(file.change ?? '');
  return h(
    'li',
    { class: 'changed-file', testid, dataset: { path: file.path, change } },
    h('span', { class: 'changed-path' }, label),
    ' ',
    h('span', { class: `badge change-${change}`, testid: 'change-badge', text: CHANGE[change] ?? change }),
  );
}

/** The "Changed files" blocks and revert lines of the shown session's conversation. */
export class Reverts {
  /**
   * @param {import('./state.js').SessionState} state
   * @param {import('./connection.js').Connection} connection
   * @param {object} conversation where the blocks go
   * @param {(turnId: string, node: HTMLElement) => void} conversation.inTurn shows a node in a turn
   * @param {(node: HTMLElement) => void} conversation.entry shows a node as an entry of its own
   * @param {(text: string, kind?: string, code?: string) => void} conversation.notice
   */
  constructor(state, connection, { inTurn, entry, notice }) {
    this.state = state;
    this.connection = connection;
    this.inTurn = inTurn;
    this.entry = entry;
    this.notice = notice;
    this.reset();
    state.on('state/reset', () => this.reset());
    state.on('turn/diff', (p) => this.turnDiff(p));
    state.on('session/reverted', (p) => this.reverted(p));
  }

  reset() {
    /** The "Changed files" block by turn id. */
    this.blocks = new Map();
    /** The revert lines by revert id: the answer and the notification each show it, once. */
    this.lines = new Map();
  }

  /** The "Changed files" block under the turn `p.turn_id`. */
  turnDiff(p) {
    const files = Array.isArray(p.files) ? p.files : [];
    const { sections, cut } = splitDiff(p.diff);
    const view = h('div', { class: 'diff-holder' });
    const preview = h('div', { class: 'revert-holder' });
    let shown = null;
    const items = files.map((file) => {
      const button = h('button', {
        type: 'button',
        class: 'link-button',
        title: 'Show what changed in this file',
        'aria-expanded': 'false',
        text: file.path,
      });
      button.addEventListener('click', () => {
        // One file's diff at a time: clicking the open one again closes it.
        const open = shown !== file.path;
        for (const other of list.querySelectorAll('button[aria-expanded]')) other.setAttribute('aria-expanded', 'false');
        view.replaceChildren(open ? diffView(file.path, sections.get(file.path) ?? null, cut) : '');
        button.setAttribute('aria-expanded', String(open));
        shown = open ? file.path : null;
      });
      return fileLine(file, 'turn-diff-file', button);
    });
    const list = h('ul', { class: 'changed-files', testid: 'turn-diff-files' }, items);
    const revert = h('button', {
      type: 'button',
      class: 'secondary small',
      testid: 'turn-revert',
      title: 'Put the workspace back as it was before this turn',
      text: 'Revert',
    });
    revert.addEventListener('click', () => this.preview(p.turn_id, preview, revert));
    const block = h(
      'section',
      { class: 'turn-diff', testid: 'turn-diff', dataset: { turnId: p.turn_id, seq: String(p.seq ?? '') } },
      h(
        'header',
        {},
        h('span', { class: 'turn-diff-title', text: 'Changed files' }),
        h('span', { class: 'count', text: fileCount(files.length) }),
        cut ? h('span', { class: 'badge', title: 'The diff was cut at its size limit', text: 'diff cut' }) : null,
        revert,
      ),
      list,
      view,
      preview,
    );
    // Shown once per turn, whatever sends it again.
    const before = this.blocks.get(p.turn_id);
    if (before) before.replaceWith(block);
    else this.inTurn(p.turn_id, block);
    this.blocks.set(p.turn_id, block);
  }

  /**
   * Asks the server what reverting to before `turnId` would do (a dry run) and shows it in
   * `holder`, with Confirm and Cancel. `button` (Revert, Undo revert) waits meanwhile.
   */
  async preview(turnId, holder, button) {
    const sessionId = this.state.sessionId;
    button.disabled = true;
    let plan;
    try {
      plan = await this.connection.request('session/revert', { session_id: sessionId, turn_id: turnId, dry_run: true });
    } catch (err) {
      button.disabled = false;
      if (sessionId === this.state.sessionId) this.failed(err);
      return;
    }
    if (sessionId !== this.state.sessionId) return;
    const files = plan.files ?? [];
    const conflicts = plan.conflicts ?? [];
    const close = () => {
      holder.replaceChildren();
      button.disabled = false;
    };
    const confirm = h('button', { type: 'button', class: 'primary small', testid: 'revert-confirm', text: 'Confirm revert' });
    const cancel = h('button', { type: 'button', class: 'secondary small', testid: 'revert-cancel', text: 'Cancel', onclick: close });
    confirm.addEventListener('click', async () => {
      confirm.disabled = true;
      cancel.disabled = true;
      // Force only over what the person saw and accepted: a file changed after the preview
      // makes the server refuse, and the preview is asked for again.
      const done = await this.revert(turnId, conflicts.length > 0);
      close();
      if (done === 'conflict') this.preview(turnId, holder, button);
    });
    const warning = conflicts.length
      ? h(
          'div',
          { class: 'revert-conflicts', testid: 'revert-conflicts', role: 'alert' },
          h('p', {
            text: `${fileCount(conflicts.length)} changed since the last turn ended (by hand, or by something else) and would be overwritten:`,
          }),
          h('ul', { class: 'changed-files' }, conflicts.map((file) => fileLine(file, 'revert-conflict'))),
        )
      : null;
    holder.replaceChildren(
      h(
        'div',
        { class: 'revert-preview', testid: 'revert-preview', dataset: { turnId, conflicts: String(conflicts.length) } },
        h('p', {
          class: 'revert-summary',
          text: files.length
            ? `Reverting puts back ${fileCount(files.length)} as before this point:`
            : 'Nothing to revert: the files are as they were before this point.',
        }),
        files.length ? h('ul', { class: 'changed-files' }, files.map((file) => fileLine(file, 'revert-file'))) : null,
        warning,
        h('div', { class: 'revert-actions' }, files.length ? confirm : null, cancel),
      ),
    );
    (files.length ? confirm : cancel).focus();
  }

  /**
   * Reverts the workspace to before `turnId`; answers 'done', 'conflict' (the server found
   * files changed that the preview did not show) or 'failed'.
   */
  async revert(turnId, force) {
    const sessionId = this.state.sessionId;
    let result;
    try {
      result = await this.connection.request('session/revert', { session_id: sessionId, turn_id: turnId, force });
    } catch (err) {
      if (sessionId !== this.state.sessionId) return 'failed';
      this.failed(err);
      return err.kind === 'revert_conflict' ? 'conflict' : 'failed';
    }
    if (sessionId !== this.state.sessionId) return 'done';
    if (result.revert_id) {
      // The stored `session/reverted` comes too (usually first); the line is shown once.
      this.reverted({ session_id: sessionId, turn_id: turnId, revert_id: result.revert_id, files: result.files ?? [] });
    } else {
      this.notice('Nothing was reverted: the files were as they were before this point already.', 'info');
    }
    return 'done';
  }

  /** Says why a revert (or its preview) was refused, as the page says other refusals. */
  failed(err) {
    if (err.kind === 'method_not_found') {
      this.notice('This server cannot revert turns.', 'error', err.kind);
    } else if (err.kind === 'turn_in_progress') {
      this.notice('The workspace was not reverted: a turn is running. Try again when it has ended.', 'error', err.kind);
    } else {
      this.notice(`The workspace was not reverted: ${err.message}`, 'error', err.kind);
    }
  }

  /** The line where the workspace was reverted, with a button that undoes it; once per revert. */
  reverted(p) {
    if (!p.revert_id) return;
    const known = this.lines.get(p.revert_id);
    if (known) {
      if (typeof p.seq === 'number') known.dataset.seq = String(p.seq);
      return;
    }
    const files = Array.isArray(p.files) ? p.files : [];
    // Reverting to a revert's own checkpoint undoes that revert.
    const undoes = this.lines.get(p.turn_id);
    const text = undoes
      ? `Revert undone: ${fileCount(files.length)} put back as the turn left them.`
      : `Workspace reverted: ${fileCount(files.length)} put back as before the turn.`;
    const holder = h('div', { class: 'revert-holder' });
    const undo = h('button', {
      type: 'button',
      class: 'secondary small',
      testid: 'revert-undo',
      title: 'Put the files back as they were just before this revert',
      text: 'Undo revert',
    });
    undo.addEventListener('click', () => this.preview(p.revert_id, holder, undo));
    const line = h(
      'div',
      {
        class: 'session-reverted',
        testid: 'session-reverted',
        role: 'status',
        dataset: { turnId: p.turn_id, revertId: p.revert_id, seq: String(p.seq ?? ''), files: String(files.length) },
        title: files.map((file) => `${file.path} (${file.change})`).join('\n'),
      },
      h('div', { class: 'session-reverted-line' }, h('span', { testid: 'session-reverted-text', text }), undo),
      holder,
    );
    if (undoes) undoes.dataset.undone = 'true';
    this.lines.set(p.revert_id, line);
    this.entry(line);
  }
}
