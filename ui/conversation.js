// The conversation: one entry per turn (the user's text, the images sent with it and what
// was steered into it, the model's reasoning folded away at the head of each step, its
// streamed text as Markdown, a card per tool call, how the turn ended — with a notice when
// the server stopped it — and a button that forks the session there), cards for tool calls
// made outside a turn, a note when a background task ends, and a divider where the server
// summarised the older conversation for the model.

import { h, clear, coalesce, duration, pretty, replace, tokenSummary, usd } from './dom.js';
import { renderMarkdown } from './markdown.js';
import { apiUrl, getBlob, getJson } from './rest.js';
import { token } from './auth.js';

/** A user message the server added for a finished background task, not typed by anyone. */
const BACKGROUND_NOTE = /^\[background task \S+ \(.*\) (completed|failed|cancelled)\]/;

/**
 * Why the server ended a turn the model had not finished, by `turn/completed.reason`. The
 * turn completed (its work and cost stand), but the model did not get to answer.
 */
const STOPPED = {
  stuck_in_loop: 'Stopped: the model kept repeating the same call with the same result',
  budget_rate_exceeded: 'Stopped: the session is spending faster than the per-minute budget allows',
  node_lost: 'Stopped: the server node running this turn went away',
  server_restarted: 'Stopped: the server restarted while this turn ran',
};

/** The divider's words for a `session/compacted`: what was summarised, and how much smaller. */
function compactedText(p) {
  const count = Number(p.replaced_messages) || 0;
  const messages = `${count} message${count === 1 ? '' : 's'}`;
  return `Earlier conversation summarised: ${messages}, ~${p.tokens_before ?? 0} → ~${p.tokens_after ?? 0} tokens`;
}

/** "1 character", "27 characters". */
function characters(count) {
  return `${count} character${count === 1 ? '' : 's'}`;
}

/** Most characters of live tool output kept on a card. */
const LIVE_OUTPUT_CHARS = 16_384;

/** A one-line hint of what a call is about: its first short string argument. */
function argumentHint(args) {
  if (!args || typeof args !== 'object') return '';
  for (const value of Object.values(args)) {
    if (typeof value === 'string' && value.trim()) {
      const line = value.trim().split('\n')[0];
      return line.length > 60 ? `${line.slice(0, 60)}…` : line;
    }
  }
  return '';
}

/**
 * The task a call started in the background, when its output is the task_handle envelope
 * (`{"ok":true,"task_handle":…}`: a spawn_only tool, `shell` with `run_in_background`). When
 * the model cannot see read_task_output the envelope is a sentence instead, and the metadata
 * names the task alone.
 */
function startedTask(p) {
  if (!p.success) return null;
  try {
    const envelope = JSON.parse(p.output_preview ?? '');
    if (envelope?.ok === true && typeof envelope.task_handle === 'string') return envelope.task_handle;
  } catch {
    // Not JSON: most outputs are not.
  }
  const meta = p.structured_metadata;
  const onlyTask = meta && typeof meta.task_id === 'string' && Object.keys(meta).length === 1;
  return onlyTask && p.tool_name !== 'read_task_output' ? meta.task_id : null;
}

/** What a result is, for the summary line of its card. */
function resultLabel(p, taskId) {
  if (taskId) return 'Started in the background (task handle)';
  if (!p.success) return 'Error';
  // read_task_output reads a task's stored output: it starts nothing.
  const meta = p.structured_metadata;
  if (p.tool_name === 'read_task_output' && typeof meta?.task_id === 'string') {
    return `Output of task ${meta.task_id.slice(0, 8)}${meta.state ? ` (${meta.state})` : ''}`;
  }
  return 'Result';
}

function basename(path) {
  const parts = String(path).split('/').filter(Boolean);
  return parts[parts.length - 1] || 'download';
}

/** The conversation panel of one session. */
export class Conversation {
  /**
   * @param {HTMLElement} list the message list
   * @param {import('./state.js').SessionState} state
   * @param {(taskId: string) => void} revealTask shows a task in the tasks panel
   * @param {(seq: number) => Promise<void>} forkAt forks the session after the event `seq`
   */
  constructor(list, state, revealTask, forkAt) {
    this.list = list;
    this.state = state;
    this.revealTask = revealTask;
    this.forkAt = forkAt;
    this.dirty = new Set();
    this.flushText = coalesce(() => this.renderDirty(), 30);
    this.followBottom = true;
    this.scrollSoon = coalesce(() => {
      if (this.followBottom) this.list.scrollTop = this.list.scrollHeight;
    }, 0);
    list.addEventListener('scroll', () => {
      this.followBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 80;
    });
    this.refreshUserTexts = coalesce(() => this.loadUserTexts(), 50);
    this.sentTexts = new Map();
    this.sentImages = new Map();
    this.reset();

    state.on('state/reset', () => this.reset());
    state.on('turn/started', (p) => this.turn(p.turn_id));
    state.on('reasoning/delta', (p) => this.reasoning(p));
    state.on('message/delta', (p) => this.delta(p));
    state.on('message/completed', (p) => this.completed(p));
    state.on('tool/started', (p) => this.toolStarted(p));
    state.on('tool/output/delta', (p) => this.toolOutput(p));
    state.on('tool/progress', (p) => this.toolProgress(p));
    state.on('tool/completed', (p) => this.toolCompleted(p));
    state.on('task/updated', (p) => this.taskUpdated(p));
    state.on('turn/completed', (p) => this.turnEnded(p, null));
    state.on('turn/error', (p) => this.turnEnded(p, p));
    state.on('turn/spawn_complete', (p) => this.spawnComplete(p));
    state.on('session/compacted', (p) => this.compacted(p));
    state.on('*', () => this.scrollSoon());
  }

  reset() {
    clear(this.list);
    this.turns = new Map();
    this.turnOrder = [];
    this.cards = new Map();
    this.dirty.clear();
    this.followBottom = true;
    this.list.append(
      h('li', { class: 'placeholder', testid: 'conversation-empty' }, 'Say what you want done, or call a tool from the console.'),
    );
  }

  /**
   * Remembers what was typed for a turn this page starts, before its turn/started arrives,
   * and the images sent with it (`{mime, data}`, shown beside the text).
   */
  expectUserText(turnId, text, images = []) {
    this.sentTexts.set(turnId, text);
    if (images.length) this.sentImages.set(turnId, images);
  }

  /** The entry of a turn, created on first sight. */
  turn(turnId) {
    let entry = this.turns.get(turnId);
    if (entry) return entry;
    this.list.querySelector('.placeholder')?.remove();
    const text = this.sentTexts.get(turnId);
    const user = h('div', { class: 'user-message', testid: 'user-message' });
    if (text !== undefined) user.textContent = text;
    else user.classList.add('unknown');
    const images = this.sentImages.get(turnId) ?? [];
    const gallery = images.length
      ? h(
          'div',
          { class: 'user-images', testid: 'user-images' },
          images.map((image) =>
            h('img', {
              class: 'thumbnail',
              testid: 'user-image',
              alt: 'an image sent with this message',
              src: `data:${image.mime};base64,${image.data}`,
            }),
          ),
        )
      : null;
    const footer = h('footer', { class: 'turn-footer', testid: 'turn-footer' }, h('span', { class: 'working' }, 'working…'));
    const el = h('li', { class: 'turn', testid: 'turn', dataset: { turnId, state: 'running' } }, user, gallery, footer);
    this.list.append(el);
    // `reasoning` holds the reasoning block of the step under way, per agent ('' the turn's
    // own model, else a sub-agent's id); whatever the step shows next closes it.
    entry = { el, user, footer, textBlock: null, reasoning: new Map(), hasText: text !== undefined, steers: [] };
    this.turns.set(turnId, entry);
    this.turnOrder.push(turnId);
    return entry;
  }

  /**
   * Appends to the turn's body, before its footer. Anything but reasoning ends the step's
   * reasoning: what the model reasons next belongs to its next step and gets a block there.
   */
  place(turnId, node) {
    if (!turnId) {
      this.list.querySelector('.placeholder')?.remove();
      this.list.append(h('li', { class: 'direct' }, node));
      return;
    }
    const entry = this.turn(turnId);
    if (!node.classList.contains('reasoning')) this.endReasoning(entry);
    entry.el.insertBefore(node, entry.footer);
  }

  /**
   * The block of reasoning the model (or the sub-agent `agentId`) is writing in this step of
   * the turn, created closed on its first delta: reasoning can be long, and people read the
   * answer first.
   */
  reasoningBlock(turnId, agentId) {
    const entry = this.turn(turnId);
    const key = agentId ?? '';
    let block = entry.reasoning.get(key);
    if (block) return block;
    const body = h('div', { class: 'reasoning-text', testid: 'reasoning-text' });
    const size = h('span', { class: 'reasoning-size', testid: 'reasoning-size' });
    const el = h(
      'details',
      { class: 'reasoning', testid: 'reasoning', dataset: { streaming: 'true', ...(agentId ? { agentId } : {}) } },
      h('summary', {}, agentId ? `Reasoning of sub-agent ${agentId}` : 'Reasoning', ' · ', size),
      body,
    );
    block = { el, body, size, source: '', characters: 0, render: () => this.showReasoning(block) };
    this.place(turnId, el);
    entry.reasoning.set(key, block);
    return block;
  }

  reasoning(p) {
    const block = this.reasoningBlock(p.turn_id, p.agent_id);
    const text = p.text ?? '';
    block.source += text;
    // Counted in code points, as people count characters; kept as it grows, not recounted.
    block.characters += Array.from(text).length;
    this.dirty.add(block);
    this.flushText();
  }

  /** Shows a reasoning block's text and size; as plain text, for it is thinking, not prose. */
  showReasoning(block) {
    block.body.textContent = block.source;
    block.size.textContent = characters(block.characters);
    block.el.dataset.characters = String(block.characters);
  }

  /** The step's reasoning is over: show it whole and start the next step's afresh. */
  endReasoning(entry) {
    for (const block of entry.reasoning.values()) {
      this.dirty.delete(block);
      this.showReasoning(block);
      block.el.dataset.streaming = 'false';
    }
    entry.reasoning.clear();
  }

  /**
   * Shows text steered into a running turn where the turn is now, as sending until `sent`;
   * `takeBack` removes it (the steer was refused).
   */
  steered(turnId, text) {
    const entry = this.turn(turnId);
    // Text still streaming belongs to the model call before the steer: it stays where it is.
    const el = h('div', { class: 'user-message steer', testid: 'steer-message', dataset: { state: 'sending' }, text });
    entry.steers.push(el);
    this.place(turnId, el);
    this.followBottom = true;
    this.scrollSoon();
    return {
      sent: () => {
        el.dataset.state = 'sent';
      },
      takeBack: () => {
        el.remove();
        entry.steers = entry.steers.filter((s) => s !== el);
      },
    };
  }

  /**
   * Shows `node` (an approval) on the card of the tool call `toolCallId`, above the result
   * it came before, or on its own when there is no card.
   */
  placeForCall(toolCallId, node) {
    const entry = this.cards.get(toolCallId);
    if (entry) entry.card.insertBefore(node, entry.result);
    else this.place(null, node);
    this.scrollSoon();
  }

  textBlock(turnId) {
    const entry = this.turn(turnId);
    if (!entry.textBlock) {
      const el = h('div', { class: 'assistant-message markdown', testid: 'assistant-message', dataset: { streaming: 'true' } });
      entry.textBlock = { el, source: '' };
      this.place(turnId, el);
    }
    return entry.textBlock;
  }

  delta(p) {
    const block = this.textBlock(p.turn_id);
    // The model writes its answer: the reasoning before it is complete.
    this.endReasoning(this.turn(p.turn_id));
    block.source += p.text ?? '';
    this.dirty.add(block);
    this.flushText();
  }

  completed(p) {
    const block = this.textBlock(p.turn_id);
    this.endReasoning(this.turn(p.turn_id));
    block.source = p.text ?? block.source;
    // The whole text is known: show it now, so a finished block never shows a partial one.
    this.dirty.delete(block);
    block.el.replaceChildren(renderMarkdown(block.source));
    block.el.dataset.streaming = 'false';
    this.turn(p.turn_id).textBlock = null;
  }

  renderDirty() {
    for (const block of this.dirty) {
      if (block.render) block.render();
      else block.el.replaceChildren(renderMarkdown(block.source));
    }
    this.dirty.clear();
    this.scrollSoon();
  }

  toolStarted(p) {
    if (p.turn_id) this.turn(p.turn_id).textBlock = null;
    const hint = argumentHint(p.arguments);
    const status = h('span', { class: 'tool-status', testid: 'tool-status', text: 'running' });
    const time = h('span', { class: 'tool-duration', testid: 'tool-duration' });
    const live = h('pre', { class: 'tool-live', testid: 'tool-live', hidden: true });
    const progress = h('div', { class: 'tool-progress', testid: 'tool-progress', hidden: true });
    const result = h('div', { class: 'tool-result' });
    const card = h(
      'article',
      { class: 'tool-card', testid: 'tool-card', dataset: { toolName: p.tool_name, callId: p.tool_call_id, state: 'running' } },
      h(
        'header',
        {},
        status,
        h('span', { class: 'tool-name', testid: 'tool-name', text: p.tool_name }),
        h('span', { class: 'tool-hint', text: hint, title: hint }),
        time,
      ),
      h('details', { class: 'tool-args' }, h('summary', {}, 'Arguments'), h('pre', { testid: 'tool-args', text: pretty(p.arguments ?? {}) })),
      progress,
      live,
      result,
    );
    if (!p.turn_id) card.prepend(h('div', { class: 'tool-origin' }, 'Direct call'));
    this.cards.set(p.tool_call_id, { card, status, time, live, progress, result, liveText: '' });
    this.place(p.turn_id, card);
  }

  card(p) {
    if (!this.cards.has(p.tool_call_id)) {
      this.toolStarted({ ...p, arguments: p.arguments ?? {} });
    }
    return this.cards.get(p.tool_call_id);
  }

  toolOutput(p) {
    const entry = this.card(p);
    entry.liveText = (entry.liveText + (p.text ?? '')).slice(-LIVE_OUTPUT_CHARS);
    entry.live.textContent = entry.liveText;
    entry.live.hidden = false;
    entry.live.scrollTop = entry.live.scrollHeight;
  }

  toolProgress(p) {
    const entry = this.card(p);
    entry.progress.hidden = false;
    const fraction = typeof p.fraction === 'number' ? Math.max(0, Math.min(1, p.fraction)) : null;
    const bar = h('progress', { max: '1' });
    if (fraction !== null) bar.value = fraction;
    entry.progress.replaceChildren(bar, h('span', { text: p.message ?? '' }));
  }

  toolCompleted(p) {
    const entry = this.card(p);
    const ok = Boolean(p.success);
    entry.card.dataset.state = ok ? 'success' : 'failure';
    entry.status.textContent = ok ? 'ok' : 'failed';
    entry.time.textContent = duration(p.duration_ms);
    entry.progress.hidden = true;
    const preview = p.output_preview ?? '';
    const lines = preview.split('\n').length;
    // A background call's result is the task envelope; the task chip says it better.
    const taskId = startedTask(p);
    if (taskId) entry.card.dataset.taskId = taskId;
    const details = h(
      'details',
      { open: !taskId && (!ok || lines <= 12) },
      h('summary', { testid: 'tool-result-label' }, resultLabel(p, taskId)),
      h('pre', { class: 'tool-preview', testid: 'tool-preview', text: preview }),
    );
    const files = [];
    if (p.file_modified) {
      files.push(h('li', {}, 'modified ', this.download(p.file_modified)));
    }
    for (const path of p.files_to_send ?? []) {
      files.push(h('li', {}, 'sent ', this.download(path)));
    }
    replace(entry.result, details, files.length ? h('ul', { class: 'tool-files', testid: 'tool-files' }, files) : null);
    // The live stream is now in the result; keep it only when the preview was cut.
    if (!preview.endsWith('…')) entry.live.hidden = true;
  }

  /** A link that downloads a file of the session's workspace. */
  download(path) {
    const sessionId = this.state.sessionId;
    const route = `api/sessions/${encodeURIComponent(sessionId)}/files`;
    const link = h('a', {
      class: 'file-download',
      testid: 'file-download',
      href: apiUrl(route, { path }).toString(),
      download: basename(path),
      text: path,
    });
    link.addEventListener('click', async (event) => {
      // With a token the plain link would be refused: fetch with the header instead.
      if (!token()) return;
      event.preventDefault();
      try {
        const blob = await getBlob(route, { path });
        const url = URL.createObjectURL(blob);
        const temporary = h('a', { href: url, download: basename(path) });
        document.body.append(temporary);
        temporary.click();
        temporary.remove();
        setTimeout(() => URL.revokeObjectURL(url), 60_000);
      } catch (err) {
        link.title = err.message;
        link.classList.add('failed');
      }
    });
    return link;
  }

  taskUpdated(p) {
    const entry = this.cards.get(p.tool_call_id);
    if (!entry) return;
    let chip = entry.card.querySelector('.task-chip');
    if (!chip) {
      chip = h('button', {
        type: 'button',
        class: 'task-chip link-button',
        testid: 'tool-task-link',
        onclick: () => this.revealTask(p.task_id),
      });
      entry.card.append(chip);
    }
    chip.dataset.state = p.state;
    chip.textContent = `background task · ${p.state}`;
  }

  turnEnded(p, error) {
    const entry = this.turn(p.turn_id);
    entry.textBlock = null;
    this.endReasoning(entry);
    this.renderDirty();
    for (const block of entry.el.querySelectorAll('[data-streaming="true"]')) block.dataset.streaming = 'false';
    entry.el.dataset.state = error ? 'error' : 'completed';
    if (error) {
      entry.footer.replaceChildren(
        h('span', { class: 'turn-error', testid: 'turn-error', dataset: { code: p.code } }, `${p.code}: ${p.message ?? ''}`),
      );
    } else {
      entry.footer.replaceChildren(
        h(
          'span',
          { testid: 'turn-tokens', dataset: { cached: String(p.tokens_cached ?? 0) } },
          tokenSummary(p.tokens_in, p.tokens_out, p.tokens_cached),
        ),
        ' · ',
        h('span', { testid: 'turn-cost', dataset: { usd: String(p.cost_usd ?? 0) } }, usd(p.cost_usd)),
      );
      this.showStopped(entry, p.reason);
    }
    if (typeof p.seq === 'number') entry.footer.append(this.forkButton(p.seq));
    if (!entry.hasText) this.refreshUserTexts();
  }

  /**
   * Ends a turn the server says it no longer runs (Stop found nothing to stop), when the log
   * holds no end for it: a server that died mid-turn before it recorded ends on restart.
   * Calls still shown as running in it ended too.
   */
  endedHere(turnId) {
    const entry = this.turns.get(turnId);
    if (!entry || entry.el.dataset.state !== 'running') return;
    entry.textBlock = null;
    this.endReasoning(entry);
    this.renderDirty();
    for (const block of entry.el.querySelectorAll('[data-streaming="true"]')) block.dataset.streaming = 'false';
    for (const { card, status } of this.cards.values()) {
      if (card.dataset.state === 'running' && entry.el.contains(card)) {
        card.dataset.state = 'ended';
        status.textContent = 'ended';
      }
    }
    entry.el.dataset.state = 'ended';
    entry.footer.replaceChildren(
      h('span', { class: 'turn-ended', testid: 'turn-ended', text: 'Ended: no turn was running on the server' }),
    );
  }

  /** Says, above the footer, why the server ended the turn; nothing for a model's own end. */
  showStopped(entry, reason) {
    // A server older than the reason field sends none: that turn simply completed.
    if (!reason || reason === 'completed') return;
    entry.el.dataset.reason = reason;
    const text = STOPPED[reason] ?? `Stopped by the server (${reason})`;
    const notice = h('div', { class: 'turn-stopped', testid: 'turn-stopped', role: 'status', dataset: { reason }, text });
    entry.el.insertBefore(notice, entry.footer);
  }

  /** A button that forks the session with the history up to the event `seq`. */
  forkButton(seq) {
    const button = h('button', {
      type: 'button',
      class: 'secondary small fork-button',
      testid: 'fork-turn',
      dataset: { seq: String(seq) },
      title: 'Start a new session with the history up to here',
      text: 'Fork',
    });
    button.addEventListener('click', async () => {
      button.disabled = true;
      try {
        await this.forkAt(seq);
      } finally {
        button.disabled = false;
      }
    });
    return button;
  }

  spawnComplete(p) {
    const first = String(p.content ?? '').trim().split('\n')[0] ?? '';
    this.list.querySelector('.placeholder')?.remove();
    this.list.append(
      h(
        'li',
        { class: `note ${p.success ? 'ok' : 'failed'}`, testid: 'spawn-complete', dataset: { taskId: p.task_id } },
        h('button', { type: 'button', class: 'link-button', onclick: () => this.revealTask(p.task_id) }, `Background ${p.tool_name}`),
        p.success ? ' finished' : ' ended without success',
        first ? `: ${first.length > 120 ? `${first.slice(0, 120)}…` : first}` : '',
      ),
    );
  }

  /**
   * A divider where the server summarised the older conversation. It changed only what the
   * model is sent: everything above stays shown and stored. Compaction the server starts by
   * itself happens inside a running turn, before a model call, so its divider goes into that
   * turn; one asked for between turns goes after the last turn.
   */
  compacted(p) {
    const text = compactedText(p);
    const attrs = {
      class: 'compacted',
      testid: 'compacted',
      role: 'separator',
      dataset: { seq: String(p.seq ?? ''), replacedMessages: String(p.replaced_messages ?? 0) },
      title: `From here on the model sees a summary of ~${p.summary_tokens ?? 0} tokens instead of the messages above; the history itself is unchanged.`,
    };
    const last = this.turns.get(this.turnOrder[this.turnOrder.length - 1]);
    if (last?.el.dataset.state === 'running') {
      last.textBlock = null;
      this.place(last.el.dataset.turnId, h('div', attrs, h('span', { text })));
    } else {
      this.list.querySelector('.placeholder')?.remove();
      this.list.append(h('li', attrs, h('span', { text })));
    }
  }

  /** An entry of its own at the end of the conversation, between turns (a revert's line). */
  appendEntry(node) {
    this.list.querySelector('.placeholder')?.remove();
    this.list.append(h('li', { class: 'entry' }, node));
    this.scrollSoon();
  }

  /**
   * A note in the conversation from the page itself (a refused send, a lost connection);
   * `code` is the error's kind, kept as `data-code`.
   */
  notice(text, kind = 'error', code = null) {
    this.list.querySelector('.placeholder')?.remove();
    this.list.append(h('li', { class: `note ${kind}`, testid: 'conversation-notice', dataset: code ? { code } : null, text }));
    this.scrollSoon();
  }

  /** A steer read from the stored history, after the card of the call it followed. */
  showStoredSteer(entry, item) {
    // Turns this page started show their steers already.
    if (!entry?.storedText) return;
    if (entry.steers.some((el) => el.dataset.steerAfter === item.afterCall)) return;
    const card = this.cards.get(item.afterCall)?.card;
    const el = h('div', {
      class: 'user-message steer',
      testid: 'steer-message',
      dataset: { state: 'sent', steerAfter: item.afterCall },
      text: item.text,
    });
    if (card?.parentElement === entry.el) card.after(el);
    else entry.el.insertBefore(el, entry.footer);
    entry.steers.push(el);
  }

  /** Whether some turn still lacks the user's text. */
  missingUserTexts() {
    return this.turnOrder.some((id) => !this.turns.get(id).hasText);
  }

  /** Fills in the user's text of turns this page did not start, from the stored history. */
  async loadUserTexts() {
    const sessionId = this.state.sessionId;
    if (!sessionId || !this.missingUserTexts()) return;
    let messages;
    try {
      ({ messages } = await getJson(`api/sessions/${encodeURIComponent(sessionId)}/messages`));
    } catch {
      return;
    }
    if (sessionId !== this.state.sessionId) return;
    // Each turn stores its input as one user message when it starts, in turn order. A steer
    // is a user message too, stored after the tool results of the batch it waited for: while
    // there are more user messages than turns, one right after a tool result is a steer.
    const items = [];
    let previous = null;
    for (const m of messages) {
      if (m.role === 'user' && typeof m.content === 'string' && !BACKGROUND_NOTE.test(m.content)) {
        items.push({ text: m.content, afterCall: previous?.role === 'tool' ? previous.tool_call_id : null });
      }
      previous = m;
    }
    let excess = items.length - this.turnOrder.length;
    let index = -1;
    for (const item of items) {
      if (item.afterCall && excess > 0 && index >= 0) {
        excess -= 1;
        this.showStoredSteer(this.turns.get(this.turnOrder[index]), item);
        continue;
      }
      index += 1;
      const entry = this.turns.get(this.turnOrder[index]);
      if (!entry || entry.hasText) continue;
      entry.user.textContent = item.text;
      entry.user.classList.remove('unknown');
      entry.hasText = true;
      entry.storedText = true;
    }
  }
}
