// The AppUI's entry point: reads the token and the session from the URL, connects, opens the
// session (a fresh one when the URL names none) and wires the panels to the session state.
// The session id is kept in the URL (`?session=`), so a reload returns to it. The composer
// starts a turn, or steers the one running; Compact asks the server to summarise the older
// conversation between turns.

import { Approvals } from './approvals.js';
import { storeToken, takeToken, token } from './auth.js';
import { Connection, socketUrl } from './connection.js';
import { Conversation } from './conversation.js';
import { Cost } from './cost.js';
import { ToolConsole } from './console.js';
import { byTestId } from './dom.js';
import { Plan } from './plan.js';
import { Questions } from './questions.js';
import { getJson } from './rest.js';
import { Sessions } from './sessions.js';
import { SessionState } from './state.js';
import { Tasks } from './tasks.js';
import { Tools } from './tools.js';

const SESSION_PARAM = 'session';

function sessionInUrl() {
  return new URL(window.location.href).searchParams.get(SESSION_PARAM);
}

function putSessionInUrl(sessionId, { push }) {
  const url = new URL(window.location.href);
  if (sessionId) url.searchParams.set(SESSION_PARAM, sessionId);
  else url.searchParams.delete(SESSION_PARAM);
  if (push) window.history.pushState({ session: sessionId }, '', url);
  else window.history.replaceState({ session: sessionId }, '', url);
}

/** A turn id made here, so the page knows which turn/started is the one it asked for. */
function newTurnId() {
  const random = crypto.getRandomValues(new Uint8Array(16));
  return `turn_${Array.from(random, (b) => b.toString(16).padStart(2, '0')).join('')}`;
}

/**
 * Asks for the access token when the server wants one. A token is tried before the page
 * starts again, so a wrong one is said to be wrong right here instead of the same form
 * coming back blank; `rejected` says the token the page had (from the URL or this tab) was
 * refused.
 */
function askForToken(rejected) {
  const form = byTestId('token-form');
  const input = byTestId('token-input');
  const submit = byTestId('token-submit');
  const error = byTestId('token-error');
  const showError = (text) => {
    error.textContent = text;
    error.hidden = !text;
    input.setAttribute('aria-invalid', text ? 'true' : 'false');
  };
  form.hidden = false;
  setStatus('offline', 'an access token is needed');
  if (rejected) showError('The server did not accept the access token this page had. Enter the right one.');
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const candidate = String(new FormData(form).get('token') ?? '').trim();
    if (!candidate) return;
    submit.disabled = true;
    showError('');
    storeToken(candidate);
    try {
      await getJson('api/sessions');
    } catch (err) {
      submit.disabled = false;
      if (err.status === 401) {
        storeToken(null);
        showError('The server did not accept this token. Check it and try again.');
      } else {
        showError(`The token could not be checked: ${err.message}`);
      }
      input.select();
      return;
    }
    window.location.reload();
  });
  input.focus();
}

function setStatus(status, detail) {
  const el = byTestId('connection-status');
  el.dataset.status = status;
  el.textContent = status;
  el.title = detail ?? '';
}

async function boot() {
  const given = takeToken();
  try {
    await getJson('api/sessions');
  } catch (err) {
    if (err.status === 401) {
      // A refused token is forgotten, so the next reload asks afresh rather than fails again.
      if (given) storeToken(null);
      askForToken(Boolean(given));
      return;
    }
    // Anything else (a server still starting) is retried by the connection below.
  }

  const state = new SessionState();
  const input = byTestId('composer-input');
  const send = byTestId('send');
  const interrupt = byTestId('interrupt');
  const compact = byTestId('compact');
  const banner = byTestId('no-model-banner');

  const connection = new Connection({
    url: socketUrl(token()),
    onNotification: (message) => state.accept(message),
    onOpen: () =>
      openSession().catch((err) => {
        if (err.kind === 'disconnected') throw err;
        conversation.notice(`Could not open the session: ${err.message}`);
      }),
    onStatus: (status, detail) => {
      setStatus(status, detail);
      send.disabled = status !== 'live';
      showCompactable();
    },
  });

  const tasks = new Tasks(byTestId('tasks-panel'), state, connection);
  const conversation = new Conversation(byTestId('messages'), state, (taskId) => tasks.reveal(taskId), forkAt);
  const approvals = new Approvals(
    state,
    connection,
    (toolCallId, node) => conversation.placeForCall(toolCallId, node),
    () => input.focus(),
  );
  const cost = new Cost(byTestId('cost-panel'), state);
  const plan = new Plan(byTestId('plan-panel'), state);
  const questions = new Questions(byTestId('questions-dialog'), state, connection);
  const toolConsole = new ToolConsole(byTestId('console'), state, connection);
  const tools = new Tools(byTestId('tools-panel'), state, connection, (list) => toolConsole.setTools(list));
  const sessions = new Sessions(byTestId('sessions'), byTestId('session-heading'), state, connection, {
    select: (sessionId) => switchTo(sessionId, { push: true }),
    create: () => switchTo(null, { push: true }),
    notice: (text, kind, code) => conversation.notice(text, kind, code),
  });

  /**
   * Shows whether the server has a model. Every open says so anew, so a server restarted
   * with a model configured takes the banner away on the reconnect, without a reload.
   */
  const showModel = (configured) => {
    state.llmConfigured = configured;
    banner.hidden = configured !== false;
    showCompactable();
  };
  byTestId('banner-console').addEventListener('click', () => toolConsole.focus());

  let runningTurn = null;
  let compacting = false;
  /**
   * Compact is for between turns: the server refuses it while a turn runs
   * (`turn_in_progress`), so the button says so before anyone tries. The summary is written
   * by the model, so without one there is nothing to compact with.
   */
  function showCompactable() {
    compact.disabled =
      runningTurn !== null || compacting || connection.status !== 'live' || state.llmConfigured === false;
  }
  const startPlaceholder = input.placeholder;
  /** While a turn runs, the composer steers it; the button and placeholder say so. */
  const showRunning = (turnId) => {
    runningTurn = turnId;
    interrupt.hidden = turnId === null;
    send.textContent = turnId === null ? 'Send' : 'Steer';
    input.placeholder = turnId === null ? startPlaceholder : 'Steer the running turn — Enter adds this to it';
    showCompactable();
  };
  state.on('turn/started', (p) => showRunning(p.turn_id));
  const turnEnded = (p) => {
    if (p.turn_id === runningTurn) showRunning(null);
  };
  state.on('turn/completed', turnEnded);
  state.on('turn/error', turnEnded);
  state.on('state/reset', () => showRunning(null));

  /** Opens (or resumes, after a reconnect) the session the page shows; creates one if none. */
  async function openSession() {
    const sessionId = state.sessionId;
    let opened;
    if (sessionId) {
      try {
        state.beginOpen();
        try {
          opened = await connection.request('session/open', { session_id: sessionId, after_seq: state.lastSeq });
        } finally {
          if (state.sessionId === sessionId) state.endOpen();
        }
      } catch (err) {
        if (err.kind !== 'unknown_session') throw err;
        state.reset(null);
        conversation.notice(`Session ${sessionId} does not exist; this is a new one.`, 'info');
        return openSession();
      }
    } else {
      opened = await connection.request('session/open', {});
      if (state.sessionId !== null) return;
      state.adopt(opened.session_id);
      putSessionInUrl(opened.session_id, { push: false });
    }
    if (opened.session_id !== state.sessionId) return;
    const configured = opened.llm_configured ?? opened.capabilities?.llm_configured;
    if (typeof configured === 'boolean') showModel(configured);
    // What the server offers may have changed while the page was away (a restart with
    // another configuration): tools, costs and the session's row are read on every open.
    tools.refresh();
    cost.load();
    sessions.opened(opened.session_id);
    conversation.loadUserTexts();
    connection
      .request('task/list', { session_id: opened.session_id })
      .then(({ tasks: list }) => {
        if (opened.session_id === state.sessionId) tasks.load(list);
      })
      .catch(() => {});
    input.focus();
  }

  /** Shows another session, or a fresh one for `null`. */
  function switchTo(sessionId, { push }) {
    if (sessionId === state.sessionId && sessionId !== null) return;
    state.reset(sessionId);
    putSessionInUrl(sessionId, { push });
    document.body.classList.remove('show-sessions');
    if (connection.status === 'live') {
      openSession().catch((err) => conversation.notice(`Could not open the session: ${err.message}`));
    }
  }

  /** Forks the shown session after the event `seq` and shows the fork. */
  async function forkAt(seq) {
    const source = state.sessionId;
    try {
      const forked = await connection.request('session/fork', { session_id: source, up_to_seq: seq });
      if (state.sessionId === source) switchTo(forked.session_id, { push: true });
    } catch (err) {
      conversation.notice(
        err.kind === 'method_not_found' ? 'This server cannot fork sessions.' : `The session was not forked: ${err.message}`,
      );
    }
  }

  /**
   * Asks the server to summarise the older conversation. The divider comes from the
   * `session/compacted` it sends before the answer, as for every other watcher of the session.
   */
  async function compactSession() {
    const sessionId = state.sessionId;
    if (!sessionId) return;
    compacting = true;
    showCompactable();
    try {
      await connection.request('session/compact', { session_id: sessionId });
    } catch (err) {
      if (state.sessionId !== sessionId) return;
      if (err.kind === 'method_not_found') {
        conversation.notice('This server cannot compact sessions.', 'error', err.kind);
      } else {
        // nothing_to_compact is no failure of anything: say it without alarm.
        const kind = err.kind === 'nothing_to_compact' ? 'info' : 'error';
        conversation.notice(`The conversation was not compacted: ${err.message}`, kind, err.kind);
      }
    } finally {
      compacting = false;
      showCompactable();
    }
  }
  compact.addEventListener('click', compactSession);

  window.addEventListener('popstate', () => switchTo(sessionInUrl(), { push: false }));

  /** Adds the text to the running turn; false when that turn is over already. */
  async function steer(turnId, text) {
    const shown = conversation.steered(turnId, text);
    try {
      await connection.request('turn/steer', {
        session_id: state.sessionId,
        turn_id: turnId,
        input: [{ kind: 'text', text }],
      });
      shown.sent();
      return true;
    } catch (err) {
      shown.takeBack();
      if (err.kind === 'no_active_turn') return false;
      throw err;
    }
  }

  byTestId('composer').addEventListener('submit', async (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text || !state.sessionId) return;
    if (runningTurn !== null) {
      input.value = '';
      try {
        if (await steer(runningTurn, text)) return;
      } catch (err) {
        if (!input.value) input.value = text;
        conversation.notice(`The message was not added to the turn: ${err.message}`);
        return;
      }
      // The turn ended just before the steer arrived: the text starts the next one instead.
    }
    const turnId = newTurnId();
    conversation.expectUserText(turnId, text);
    input.value = '';
    try {
      await connection.request('turn/start', {
        session_id: state.sessionId,
        input: [{ kind: 'text', text }],
        turn_id: turnId,
      });
    } catch (err) {
      if (!input.value) input.value = text;
      if (err.kind === 'llm_not_configured') {
        showModel(false);
        conversation.notice('No model is configured, so the message was not sent. Use the tool console instead.');
      } else {
        conversation.notice(`The message was not sent: ${err.message}`);
      }
    }
  });
  input.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      byTestId('composer').requestSubmit();
    }
  });
  interrupt.addEventListener('click', async () => {
    const sessionId = state.sessionId;
    const turnId = runningTurn;
    let answer;
    try {
      answer = await connection.request('turn/interrupt', { session_id: sessionId });
    } catch (err) {
      conversation.notice(`The turn was not stopped: ${err.message}`);
      return;
    }
    // The server runs no turn here, yet the page thinks one runs (its end never reached the
    // log, say): end it on the page too, or Stop would do nothing for ever.
    if (answer?.interrupted === false && sessionId === state.sessionId && turnId !== null && runningTurn === turnId) {
      conversation.endedHere(turnId);
      showRunning(null);
      conversation.notice('No turn was running on the server; the page has ended this one.', 'info', 'no_turn_running');
    }
  });
  byTestId('sessions-toggle').addEventListener('click', (event) => {
    const shown = document.body.classList.toggle('show-sessions');
    event.currentTarget.setAttribute('aria-expanded', String(shown));
  });

  // Exposed for the browser tests and for poking at from the developer console.
  window.agentd = { connection, state, conversation, approvals, tasks, cost, plan, questions, tools, console: toolConsole, sessions };

  state.reset(sessionInUrl());
  connection.start();
}

boot();
