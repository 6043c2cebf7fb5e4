// The sessions: the caller's sessions from REST, newest first, with a button for a new one,
// and the heading of the session shown — its title, which a click makes editable
// (`session/update`), the session it was forked from, and the model and reasoning effort its
// turns use (from `model/list`; a change is a `session/open` with `model`, which the server
// stores). A fork is marked in the list and links to its parent. With agent profiles
// configured (`agent/list`), a select beside "+ New session" picks the profile the next new
// session opens as — the only moment a session's agent can be chosen — and a session opened
// as one carries its name as a badge in the list and the heading. Choosing a session is the
// page's job (it changes the URL and re-opens). The shown session's event count follows its
// notifications' `seq`, so the list never lags behind the conversation.

import { h, byTestId, coalesce, when } from './dom.js';
import { getJson } from './rest.js';

/** The reasoning efforts the server takes (`REASONING_EFFORTS` in src/session/). */
export const REASONING_EFFORTS = ['none', 'minimal', 'low', 'medium', 'high', 'xhigh'];

/** What an option says of a model beyond its id: its provider's API, window, prices. */
function modelDetails(model) {
  const parts = [model.kind, `${model.context_window}-token context`];
  const prices = model.prices;
  if (model.priced && prices) {
    parts.push(`$${prices.input_per_mtok} in / $${prices.output_per_mtok} out per million tokens`);
  } else {
    parts.push('unpriced: its calls count as $0 and toward no budget');
  }
  parts.push(model.images ? 'takes images' : 'takes no images');
  return parts.join(' · ');
}

/**
 * The options of a model select: one per model of `model/list`, the default marked, an
 * unpriced one said to be so; `current` is added when the list lacks it (a model the
 * session chose that the configuration no longer lists), so the select never shows a lie.
 */
export function modelOptions(list, current = null) {
  const models = [...(list?.models ?? [])];
  if (current && !models.some((m) => m.id === current)) models.push({ id: current, unknown: true });
  return models.map((model) => {
    const marks = [];
    if (model.id === list?.default) marks.push('default');
    if (model.unknown) marks.push('not listed');
    else if (!model.priced) marks.push('unpriced');
    return h('option', {
      value: model.id,
      title: model.unknown ? 'This server does not list this model' : modelDetails(model),
      dataset: { priced: String(Boolean(model.priced)), images: String(model.images !== false) },
      text: marks.length ? `${model.id} (${marks.join(', ')})` : model.id,
    });
  });
}

/** The options of a reasoning-effort select, after one meaning "none chosen" (value ''). */
export function effortOptions(unchosen) {
  return [
    h('option', { value: '', text: unchosen }),
    ...REASONING_EFFORTS.map((effort) => h('option', { value: effort, text: `effort: ${effort}` })),
  ];
}

/** What an agent profile's option and note say beside its name: its description and model. */
function agentDetails(profile) {
  return [profile.description, profile.model ? `model ${profile.model}` : null].filter(Boolean).join(' · ');
}

/** The name a session goes by before it has a title. */
function untitled(sessionId) {
  return `Session ${sessionId.slice(0, 8)}`;
}

/** The sessions sidebar and the shown session's heading. */
export class Sessions {
  /**
   * @param {HTMLElement} nav the sidebar
   * @param {HTMLElement} heading the top bar's session heading
   * @param {import('./state.js').SessionState} state
   * @param {import('./connection.js').Connection} connection
   * @param {{select: (id: string) => void, create: (agent: string | null) => void,
   *   notice: (text: string, kind: string, code?: string) => void,
   *   chooseModel: (choice: {model: string, reasoning_effort?: string}) => Promise<void>}} actions
   */
  constructor(nav, heading, state, connection, actions) {
    this.list = byTestId('session-list', nav);
    this.state = state;
    this.connection = connection;
    this.actions = actions;
    this.sessions = [];
    /** Rows read one by one (the shown session, parents not on the list's page), by id. */
    this.rows = new Map();
    /** The highest seq heard per session, ahead of what the list last read. */
    this.seen = new Map();
    /** Each listed session's meta line, for updating its event count in place. */
    this.metas = new Map();
    this.heading = {
      title: byTestId('session-title', heading),
      input: byTestId('session-title-input', heading),
      forkOf: byTestId('session-fork-of', heading),
      label: byTestId('session-label', heading),
      agent: byTestId('session-agent-badge', heading),
    };
    /** The session whose title is being edited, or null. */
    this.editing = null;
    this.picker = {
      root: byTestId('session-model-picker'),
      model: byTestId('session-model'),
      effort: byTestId('session-effort'),
    };
    /** `model/list`'s answer, or null while unknown (or without a model). */
    this.modelList = null;
    /** The shown session's model and effort, as its last open said; null until then. */
    this.sessionModel = null;
    this.wireModelPicker();
    this.agentPicker = {
      root: byTestId('new-session-agent-picker', nav),
      select: byTestId('new-session-agent', nav),
      about: byTestId('new-session-agent-about', nav),
    };
    /** `agent/list`'s profiles; empty when the server has none (or no agent/list). */
    this.agents = [];
    this.agentPicker.select.addEventListener('change', () => this.showAgentAbout());
    this.refreshSoon = coalesce(() => this.refresh(), 200);
    byTestId('new-session', nav).addEventListener('click', () => actions.create(this.chosenAgent()));
    this.wireTitleEditor();
    state.on('state/reset', () => {
      this.stopEditing();
      this.sessionModel = null;
      this.render();
      this.renderHeading();
      this.renderModelPicker();
    });
    state.on('state/session', () => this.refreshSoon());
    // The server titles a session from its first message.
    state.on('turn/started', () => this.refreshSoon());
    state.on('turn/completed', () => this.refreshSoon());
    state.on('*', (p) => this.heard(p));
  }

  /** The row of a session, from the list or read alone; undefined when unknown. */
  row(sessionId) {
    return this.sessions.find((s) => s.session_id === sessionId) ?? this.rows.get(sessionId);
  }

  titleOf(sessionId) {
    return this.row(sessionId)?.title || untitled(sessionId);
  }

  /** The session shown was opened: read its row (title, parent) and the list. */
  async opened(sessionId) {
    this.renderHeading();
    this.refreshSoon();
    try {
      const row = await getJson(`api/sessions/${encodeURIComponent(sessionId)}`);
      this.rows.set(sessionId, row);
      const parent = row.parent_session_id;
      if (parent && !this.row(parent)) {
        // A deleted parent is 404: the link then names it by its id.
        this.rows.set(parent, await getJson(`api/sessions/${encodeURIComponent(parent)}`).catch(() => ({ session_id: parent })));
      }
    } catch {
      return;
    }
    if (sessionId !== this.state.sessionId) return;
    this.renderHeading();
    this.render();
  }

  async refresh() {
    try {
      ({ sessions: this.sessions } = await getJson('api/sessions'));
    } catch {
      return;
    }
    // The list is newer than a row read alone.
    for (const session of this.sessions) this.rows.delete(session.session_id);
    this.render();
    this.renderHeading();
  }

  /** A notification of the shown session: its seq is the session's event count now. */
  heard(p) {
    if (typeof p.seq !== 'number' || !p.session_id) return;
    if (p.seq <= (this.seen.get(p.session_id) ?? 0)) return;
    this.seen.set(p.session_id, p.seq);
    const meta = this.metas.get(p.session_id);
    const session = this.row(p.session_id);
    if (meta && session) this.showMeta(meta, session);
  }

  /** The event count of a session: what the list read, or more when more was heard since. */
  lastSeq(session) {
    return Math.max(Number(session.last_seq) || 0, this.seen.get(session.session_id) ?? 0);
  }

  showMeta(meta, session) {
    const count = this.lastSeq(session);
    meta.dataset.lastSeq = String(count);
    meta.textContent = `${when(session.updated_at)} · ${count} event${count === 1 ? '' : 's'}`;
  }

  /** A badge naming the agent profile a session was opened as; null for a plain session. */
  agentBadge(agent, testid) {
    if (!agent) return null;
    return h('span', { class: 'badge agent', testid, dataset: { agent }, title: this.agentTitle(agent), text: agent });
  }

  /** A badge's tooltip: the profile and, while the server still lists it, what it is. */
  agentTitle(agent) {
    const profile = this.agents.find((p) => p.name === agent);
    const details = profile ? agentDetails(profile) : '';
    return `Opened as the agent profile ${agent}${details ? `: ${details}` : ''}`;
  }

  render() {
    const current = this.state.sessionId;
    this.metas.clear();
    const items = this.sessions.map((session) => {
      const id = session.session_id;
      const parent = session.parent_session_id;
      const meta = h('span', { class: 'session-meta', testid: 'session-meta' });
      this.showMeta(meta, session);
      this.metas.set(id, meta);
      const button = h(
        'button',
        {
          type: 'button',
          class: 'session-item',
          testid: 'session-item',
          dataset: { sessionId: id, ...(parent ? { parentSessionId: parent } : {}) },
          'aria-current': id === current ? 'page' : null,
          title: id,
          onclick: () => this.actions.select(id),
        },
        h(
          'span',
          { class: 'session-title-line' },
          parent ? h('span', { class: 'badge fork', testid: 'session-fork-mark', title: 'A fork of another session', text: '⑂ fork' }) : null,
          h('span', { class: 'session-title', testid: 'session-item-title', text: session.title || untitled(id) }),
          this.agentBadge(session.agent, 'session-agent'),
        ),
        meta,
      );
      return h('li', { class: parent ? 'fork' : null }, button, parent ? this.parentLink(parent, 'session-parent-link') : null);
    });
    if (!items.length) items.push(h('li', { class: 'empty', text: 'No sessions yet.' }));
    this.list.replaceChildren(...items);
  }

  /** A link that shows a fork's parent session. */
  parentLink(parentId, testid) {
    return h('button', {
      type: 'button',
      class: 'link-button parent-link',
      testid,
      dataset: { parentId },
      title: `Show the session this was forked from (${parentId})`,
      text: `from ${this.titleOf(parentId)}`,
      onclick: () => this.actions.select(parentId),
    });
  }

  /** The top bar: the shown session's title, where it was forked from, its short id. */
  renderHeading() {
    const id = this.state.sessionId;
    const { title, forkOf, label, agent } = this.heading;
    title.hidden = !id || this.editing;
    forkOf.hidden = true;
    agent.hidden = true;
    label.textContent = id ? `session ${id.slice(0, 8)}` : '';
    label.title = id ?? '';
    if (!id) return;
    const row = this.row(id);
    title.textContent = row?.title || untitled(id);
    title.classList.toggle('untitled', !row?.title);
    // An untitled session's name is its short id already.
    label.hidden = !row?.title;
    if (row?.parent_session_id) {
      forkOf.replaceChildren('⑂ forked ', this.parentLink(row.parent_session_id, 'session-parent'));
      forkOf.hidden = false;
    }
    if (row?.agent) {
      agent.textContent = row.agent;
      agent.dataset.agent = row.agent;
      agent.title = this.agentTitle(row.agent);
      agent.hidden = false;
    }
  }

  /**
   * Takes `agent/list`'s profiles. Without any the picker stays hidden and "+ New session"
   * opens a plain session, as on a server that has no profiles at all.
   */
  showAgents(agents) {
    this.agents = Array.isArray(agents) ? agents : [];
    const { root, select } = this.agentPicker;
    root.hidden = this.agents.length === 0;
    // Rebuilt only when the list changes (a reconnect reads it anew), keeping the choice
    // while the server still offers it.
    const offered = JSON.stringify(this.agents);
    if (select.dataset.offered !== offered) {
      const chosen = select.value;
      select.replaceChildren(
        h('option', { value: '', text: 'plain agent', title: `No profile: the server's own instructions, model and tools` }),
        ...this.agents.map((profile) => {
          const details = agentDetails(profile);
          return h('option', {
            value: profile.name,
            title: details || null,
            dataset: profile.model ? { model: profile.model } : null,
            text: details ? `${profile.name} — ${details}` : profile.name,
          });
        }),
      );
      select.dataset.offered = offered;
      select.value = this.agents.some((p) => p.name === chosen) ? chosen : '';
      // Badges' tooltips say what their profile is.
      this.render();
      this.renderHeading();
    }
    this.showAgentAbout();
  }

  /** The chosen profile's description and model, in full, under the picker. */
  showAgentAbout() {
    const profile = this.agents.find((p) => p.name === this.agentPicker.select.value);
    const about = this.agentPicker.about;
    about.textContent = profile ? agentDetails(profile) : '';
    about.hidden = !about.textContent;
  }

  /** The profile the next new session opens as, or null for a plain session. */
  chosenAgent() {
    if (this.agentPicker.root.hidden) return null;
    return this.agentPicker.select.value || null;
  }

  /** Takes `model/list`'s answer (null: the server has no model, or no model/list). */
  showModels(list) {
    this.modelList = list?.models?.length ? list : null;
    this.renderModelPicker();
  }

  /** Takes the model and effort the session's open answered with. */
  showSessionModel(model, reasoningEffort) {
    this.sessionModel = model ? { model, reasoning_effort: reasoningEffort ?? null } : null;
    this.renderModelPicker();
  }

  /**
   * The session's model and effort in the top bar; hidden until both the list and the
   * session's choice are known.
   */
  renderModelPicker() {
    const { root, model, effort } = this.picker;
    const current = this.sessionModel;
    root.hidden = !this.modelList || !current;
    if (root.hidden) return;
    // Options are rebuilt only when they change: a reconnect must not close a list someone
    // has open.
    const offered = JSON.stringify([this.modelList, current.model]);
    if (model.dataset.offered !== offered) {
      model.replaceChildren(...modelOptions(this.modelList, current.model));
      model.dataset.offered = offered;
    }
    if (!effort.options.length) effort.replaceChildren(...effortOptions('effort: model default'));
    model.value = current.model;
    effort.value = current.reasoning_effort ?? '';
    model.disabled = false;
    effort.disabled = false;
  }

  wireModelPicker() {
    const { model, effort } = this.picker;
    const choose = async () => {
      // The server stores model and effort together (a choice without an effort clears it),
      // so both always go.
      const choice = { model: model.value, reasoning_effort: effort.value || undefined };
      model.disabled = true;
      effort.disabled = true;
      try {
        await this.actions.chooseModel(choice);
      } finally {
        // Shows what the session uses now: the new choice, or the old one when refused.
        this.renderModelPicker();
      }
    };
    model.addEventListener('change', choose);
    effort.addEventListener('change', choose);
  }

  wireTitleEditor() {
    const { title, input } = this.heading;
    title.addEventListener('click', () => this.startEditing());
    input.addEventListener('keydown', (event) => {
      if (event.key === 'Enter') {
        event.preventDefault();
        this.save();
      } else if (event.key === 'Escape') {
        event.preventDefault();
        this.stopEditing();
      }
    });
    // Leaving the field keeps what was typed, as most title fields do.
    input.addEventListener('blur', () => {
      if (this.editing) this.save();
    });
  }

  startEditing() {
    const id = this.state.sessionId;
    if (!id) return;
    const { title, input } = this.heading;
    this.editing = id;
    input.value = this.row(id)?.title ?? '';
    input.placeholder = untitled(id);
    title.hidden = true;
    input.hidden = false;
    input.focus();
    input.select();
  }

  stopEditing() {
    const { title, input } = this.heading;
    const hadFocus = document.activeElement === input;
    this.editing = null;
    input.hidden = true;
    this.renderHeading();
    // Enter or Escape hand the keyboard back to the title, not to the page's start.
    if (hadFocus && !title.hidden) title.focus();
  }

  /** Sends the typed title; an unchanged or empty one changes nothing. */
  async save() {
    const id = this.editing;
    const text = this.heading.input.value.trim();
    this.stopEditing();
    if (!id || !text || text === (this.row(id)?.title ?? '')) return;
    try {
      const answer = await this.connection.request('session/update', { session_id: id, title: text });
      const row = this.row(id) ?? { session_id: id };
      row.title = answer?.title ?? text;
      if (!this.row(id)) this.rows.set(id, row);
    } catch (err) {
      const why = err.kind === 'method_not_found' ? 'this server cannot rename sessions' : err.message;
      this.actions.notice(`The session was not renamed: ${why}`, 'error', err.kind);
      return;
    }
    if (id === this.state.sessionId) this.renderHeading();
    this.render();
  }
}
