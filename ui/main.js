// The AppUI's entry point: reads the token and the session from the URL, connects, opens the
// session (a fresh one when the URL names none) and wires the panels to the session state.
// The session id is kept in the URL (`?session=`), so a reload returns to it. The composer
// starts a turn with the images pasted, dropped or picked into it (or steers the one running,
// with its text only); the next turn may use another model or reasoning effort than the
// session's. Compact
// asks the server to summarise the older conversation between turns. "+ New session" may open
// the session as one of the server's agent profiles (`agent/list`). A turn that changed files
// shows them, and can be reverted (revert.js).

import { Approvals } from './approvals.js';
import { storeToken, takeToken, token } from './auth.js';
import { Connection, socketUrl } from './connection.js';
import { Conversation } from './conversation.js';
import { Cost } from './cost.js';
import { ToolConsole } from './console.js';
import { h, byTestId, bytes } from './dom.js';
import { Plan } from './plan.js';
import { Questions } from './questions.js';
import { getJson } from './rest.js';
import { Reverts } from './revert.js';
import { Sessions, effortOptions, modelOptions } from './sessions.js';
import { SessionState } from './state.js';
import { Tasks } from './tasks.js';
import { Tools } from './tools.js';

const SESSION_PARAM = 'session';

/** The image types the server takes as `{kind: "image", mime, data}` input items. */
const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/gif', 'image/webp'];
/** The largest image the composer takes. */
const MAX_IMAGE_BYTES = 5 * 1024 * 1024;
/**
 * The server closes the connection on a message over 4 MiB (close code 1009). Images go in
 * base64, a third larger than their files, so together they must stay under that, with room
 * left for the text.
 */
const MAX_MESSAGE_BYTES = 4 * 1024 * 1024;
const ROOM_FOR_TEXT = 64 * 1024;

/** A file's content in base64, without the `data:…;base64,` prefix a data URL has. */
function readBase64(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.addEventListener('load', () => {
      const url = String(reader.result);
      resolve(url.slice(url.indexOf(',') + 1));
    });
    reader.addEventListener('error', () => reject(reader.error ?? new Error('unreadable')));
    reader.readAsDataURL(file);
  });
}

/** Bytes a JSON-RPC request takes on the wire, in UTF-8 as the socket sends it. */
function wireBytes(method, params) {
  return new Blob([JSON.stringify({ jsonrpc: '2.0', id: 0, method, params })]).size;
}

/**
 * The images waiting in the composer, shown as thumbnails with a remove button. A file that
 * is not an image of a type the server takes, or is too large, is refused with a message
 * that says why, and never read.
 */
class Attachments {
  /**
   * @param {HTMLElement} composer the composer form
   * @param {() => void} changed called after every addition and removal
   */
  constructor(composer, changed) {
    this.list = byTestId('attachments', composer);
    this.refusal = byTestId('attach-refused', composer);
    this.changed = changed;
    /** `{name, mime, data, size, url}`: `data` in base64, `url` the thumbnail's blob URL. */
    this.images = [];
    /** The additions under way: each waits for the one before, so images keep their order. */
    this.adding = Promise.resolve();
  }

  /** Base64 bytes the images add to a message. */
  encodedBytes() {
    return this.images.reduce((sum, image) => sum + image.data.length, 0);
  }

  /** Reads and attaches `files`, after those given before; says which were refused and why. */
  add(files) {
    this.adding = this.adding.then(() => this.read(files));
    return this.adding;
  }

  async read(files) {
    const refused = [];
    for (const file of files) {
      const name = file.name || 'the pasted file';
      if (!IMAGE_TYPES.includes(file.type)) {
        refused.push(`${name} is not a PNG, JPEG, GIF or WebP image`);
        continue;
      }
      if (file.size > MAX_IMAGE_BYTES) {
        refused.push(`${name} is larger than the 5 MiB an image may be (${bytes(file.size)})`);
        continue;
      }
      if (this.encodedBytes() + Math.ceil(file.size / 3) * 4 > MAX_MESSAGE_BYTES - ROOM_FOR_TEXT) {
        refused.push(`${name} (${bytes(file.size)}) would make the message larger than the 4 MiB the server takes at once`);
        continue;
      }
      let data;
      try {
        data = await readBase64(file);
      } catch (err) {
        refused.push(`${name} could not be read (${err.message})`);
        continue;
      }
      this.images.push({ name, mime: file.type, data, size: file.size, url: URL.createObjectURL(file) });
    }
    this.refuse(refused.length ? `Not attached: ${refused.join('; ')}.` : '');
    this.render();
  }

  /** Shows why something was not attached or sent; '' hides it. */
  refuse(text) {
    this.refusal.textContent = text;
    this.refusal.hidden = !text;
  }

  remove(image) {
    URL.revokeObjectURL(image.url);
    this.images = this.images.filter((other) => other !== image);
    this.render();
  }

  /** Empties the composer's images (they were sent). */
  clear() {
    for (const image of this.images) URL.revokeObjectURL(image.url);
    this.images = [];
    this.refuse('');
    this.render();
  }

  /** The images as they are sent and shown in the conversation: `{mime, data}`. */
  forSending() {
    return this.images.map(({ mime, data }) => ({ mime, data }));
  }

  render() {
    this.list.replaceChildren(
      ...this.images.map((image) =>
        h(
          'li',
          { class: 'attachment', testid: 'attachment', dataset: { name: image.name, mime: image.mime, bytes: String(image.size) } },
          h('img', { class: 'thumbnail', src: image.url, alt: image.name, title: `${image.name} · ${bytes(image.size)}` }),
          h('button', {
            type: 'button',
            class: 'attachment-remove',
            testid: 'attachment-remove',
            'aria-label': `Remove ${image.name}`,
            title: 'Remove this image',
            text: '×',
            onclick: () => this.remove(image),
          }),
        ),
      ),
    );
    this.list.hidden = this.images.length === 0;
    this.changed();
  }
}

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
  const composer = byTestId('composer');
  const turnChoice = byTestId('turn-choice');
  const turnModel = byTestId('turn-model');
  const turnEffort = byTestId('turn-effort');
  const imageWarning = byTestId('image-warning');
  const attachments = new Attachments(composer, () => showImageWarning());

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
  const reverts = new Reverts(state, connection, {
    inTurn: (turnId, node) => conversation.place(turnId, node),
    entry: (node) => conversation.appendEntry(node),
    notice: (text, kind, code) => conversation.notice(text, kind, code),
  });
  const cost = new Cost(byTestId('cost-panel'), state);
  const plan = new Plan(byTestId('plan-panel'), state);
  const questions = new Questions(byTestId('questions-dialog'), state, connection);
  const toolConsole = new ToolConsole(byTestId('console'), state, connection);
  const tools = new Tools(byTestId('tools-panel'), state, connection, (list) => toolConsole.setTools(list));
  const sessions = new Sessions(byTestId('sessions'), byTestId('session-heading'), state, connection, {
    select: (sessionId) => switchTo(sessionId, { push: true }),
    create: (agent) => (agent ? createAs(agent) : switchTo(null, { push: true })),
    notice: (text, kind, code) => conversation.notice(text, kind, code),
    chooseModel: (choice) => chooseModel(choice),
  });

  /** `model/list`'s answer while the server has models; null otherwise. */
  let modelList = null;
  /**
   * The model and effort last chosen for a session on this page: "+ New session" opens the
   * next one with them, so a choice made once holds for the sessions that follow.
   */
  let chosenForNewSessions = null;

  /** Reads the server's models anew (a restart may have changed them) and shows them. */
  async function loadModels() {
    let list = null;
    if (state.llmConfigured !== false) {
      try {
        list = await connection.request('model/list', {});
      } catch {
        // A server without model/list offers no choice; the pickers stay hidden.
      }
    }
    modelList = list?.models?.length ? list : null;
    sessions.showModels(modelList);
    cost.setModels(modelList?.models ?? []);
    showTurnChoice();
  }

  /** Reads the server's agent profiles anew (a restart may have changed them) and shows them. */
  async function loadAgents() {
    let agents = [];
    try {
      ({ agents = [] } = await connection.request('agent/list', {}));
    } catch {
      // A server without agent/list has no profiles: "+ New session" stays as it is.
    }
    sessions.showAgents(agents);
  }

  /**
   * The composer's choice for the next turn: "the session's" (not sent) or a model, and an
   * effort or "unchanged" (not sent). What was chosen stays while the list still offers it.
   */
  function showTurnChoice() {
    turnChoice.hidden = !modelList;
    if (!modelList) return;
    const model = turnModel.value;
    const sessionModel = sessions.sessionModel?.model;
    // Rebuilt only when they change, like the session's picker.
    const offered = JSON.stringify([modelList, sessionModel]);
    if (turnModel.dataset.offered !== offered) {
      turnModel.replaceChildren(
        h('option', { value: '', text: `this message: the session's model${sessionModel ? ` (${sessionModel})` : ''}` }),
        ...modelOptions(modelList),
      );
      turnModel.dataset.offered = offered;
      turnModel.value = modelList.models.some((m) => m.id === model) ? model : '';
    }
    if (!turnEffort.options.length) turnEffort.replaceChildren(...effortOptions('effort: unchanged'));
    showImageWarning();
  }

  /** The turn choice's params: only what differs from the session's. */
  function chosenForTurn() {
    return { model: turnModel.value || undefined, reasoning_effort: turnEffort.value || undefined };
  }

  /**
   * Says, before anything is sent, when the model the next turn would use takes no images
   * while some are attached: the server would refuse the message.
   */
  function showImageWarning() {
    const id = turnModel.value || sessions.sessionModel?.model || modelList?.default;
    const model = modelList?.models.find((m) => m.id === id);
    const refuses = attachments.images.length > 0 && model?.images === false;
    imageWarning.hidden = !refuses;
    imageWarning.dataset.model = refuses ? id : '';
    imageWarning.textContent = refuses
      ? `${id} takes no images: the server will refuse this message. Remove the images, or choose a model that takes them.`
      : '';
  }
  turnModel.addEventListener('change', showImageWarning);

  /** Makes `choice` the shown session's model and effort (a new session's, before it exists). */
  async function chooseModel(choice) {
    if (!state.sessionId) {
      chosenForNewSessions = choice;
      return;
    }
    try {
      await openSession(choice);
      chosenForNewSessions = choice;
    } catch (err) {
      conversation.notice(`The model was not changed: ${err.message}`, 'error', err.kind);
    }
  }

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

  /**
   * Opens (or resumes, after a reconnect) the session the page shows; creates one if none.
   * `choice` (`{model, reasoning_effort}`) sets the session's model as it opens.
   */
  async function openSession(choice = null) {
    const sessionId = state.sessionId;
    let opened;
    if (sessionId) {
      try {
        state.beginOpen();
        try {
          opened = await connection.request('session/open', { session_id: sessionId, after_seq: state.lastSeq, ...choice });
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
      const creating = choice ?? chosenForNewSessions;
      try {
        opened = await connection.request('session/open', { ...creating });
      } catch (err) {
        // A remembered model the server no longer offers (it restarted with another
        // configuration) must not keep the page from opening a session.
        if (!creating || choice || !['invalid_params', 'llm_not_configured'].includes(err.kind)) throw err;
        chosenForNewSessions = null;
        opened = await connection.request('session/open', {});
      }
      if (state.sessionId !== null) return;
      state.adopt(opened.session_id);
      putSessionInUrl(opened.session_id, { push: false });
    }
    if (opened.session_id !== state.sessionId) return;
    const configured = opened.llm_configured ?? opened.capabilities?.llm_configured;
    if (typeof configured === 'boolean') showModel(configured);
    sessions.showSessionModel(opened.model ?? null, opened.reasoning_effort ?? null);
    loadModels();
    loadAgents();
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

  /**
   * Opens a new session as the agent profile `agent`, then shows it. A session's agent is
   * chosen only when it is created, so the session is created first, while the page still
   * shows the one it had: a name the server refuses (a profile a restart removed) leaves the
   * page where it was, with the server's reason. The profile brings its own model (else the
   * server's default), so the model last chosen on the page does not go with it.
   */
  async function createAs(agent) {
    let opened;
    try {
      opened = await connection.request('session/open', { agent });
    } catch (err) {
      conversation.notice(`The session was not created as ${agent}: ${err.message}`, 'error', err.kind);
      return;
    }
    switchTo(opened.session_id, { push: true });
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

  /** Adds the input to the running turn; false when that turn is over already. */
  async function steer(turnId, text, input) {
    const shown = conversation.steered(turnId, text);
    try {
      await connection.request('turn/steer', {
        session_id: state.sessionId,
        turn_id: turnId,
        input,
      });
      shown.sent();
      return true;
    } catch (err) {
      shown.takeBack();
      if (err.kind === 'no_active_turn') return false;
      throw err;
    }
  }

  composer.addEventListener('submit', async (event) => {
    event.preventDefault();
    const text = input.value.trim();
    const images = attachments.forSending();
    if (!state.sessionId) return;
    if (!text) {
      if (images.length) attachments.refuse('Write a message to go with the images.');
      return;
    }
    const items = [{ kind: 'text', text }, ...images.map((image) => ({ kind: 'image', ...image }))];
    // Sent, a message over the limit would close the connection: refuse it here instead.
    const size = wireBytes('turn/start', { session_id: state.sessionId, input: items, turn_id: newTurnId(), ...chosenForTurn() });
    if (size > MAX_MESSAGE_BYTES) {
      attachments.refuse(`Not sent: the message is ${bytes(size)}, more than the 4 MiB the server takes at once. Remove an image or shorten the text.`);
      return;
    }
    if (runningTurn !== null) {
      input.value = '';
      try {
        // Steering takes text only: images stay attached and go with the next message.
        if (await steer(runningTurn, text, [{ kind: 'text', text }])) {
          if (images.length) {
            attachments.refuse('The text went to the running turn; the images stay attached for your next message.');
          }
          return;
        }
      } catch (err) {
        if (!input.value) input.value = text;
        conversation.notice(`The message was not added to the turn: ${err.message}`);
        return;
      }
      // The turn ended just before the steer arrived: the text starts the next one instead.
    }
    const turnId = newTurnId();
    conversation.expectUserText(turnId, text, images);
    input.value = '';
    try {
      await connection.request('turn/start', {
        session_id: state.sessionId,
        input: items,
        turn_id: turnId,
        ...chosenForTurn(),
      });
      // The images went with the turn, and the choice was for this turn only.
      attachments.clear();
      turnModel.value = '';
      turnEffort.value = '';
      showImageWarning();
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
  // Images come in by paste, by drop onto the composer, or by the Attach button.
  input.addEventListener('paste', (event) => {
    const files = [...(event.clipboardData?.files ?? [])];
    if (!files.length) return;
    // What holds text too (a spreadsheet's cells come with a picture of them) pastes both;
    // an image alone must not paste its file name as well.
    if (!Array.from(event.clipboardData.types).includes('text/plain')) event.preventDefault();
    attachments.add(files);
  });
  const carriesFiles = (event) => Array.from(event.dataTransfer?.types ?? []).includes('Files');
  composer.addEventListener('dragover', (event) => {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    event.dataTransfer.dropEffect = 'copy';
    composer.classList.add('dropping');
  });
  composer.addEventListener('dragleave', (event) => {
    if (!composer.contains(event.relatedTarget)) composer.classList.remove('dropping');
  });
  composer.addEventListener('drop', (event) => {
    composer.classList.remove('dropping');
    const files = [...(event.dataTransfer?.files ?? [])];
    if (!files.length) return;
    event.preventDefault();
    attachments.add(files);
  });
  // A file dropped beside the composer would make the browser leave the page to show it.
  for (const type of ['dragover', 'drop']) {
    window.addEventListener(type, (event) => {
      if (carriesFiles(event) && !composer.contains(event.target)) event.preventDefault();
    });
  }
  const attachInput = byTestId('attach-input');
  byTestId('attach-image').addEventListener('click', () => attachInput.click());
  attachInput.addEventListener('change', () => {
    attachments.add([...attachInput.files]);
    attachInput.value = '';
  });

  input.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      composer.requestSubmit();
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
  window.agentd = {
    connection,
    state,
    conversation,
    approvals,
    reverts,
    tasks,
    cost,
    plan,
    questions,
    tools,
    console: toolConsole,
    sessions,
    attachments,
    models: () => modelList,
  };

  state.reset(sessionInUrl());
  connection.start();
}

boot();
