// An ACP client built on the official TypeScript SDK (@agentclientprotocol/sdk), driving
// `agentd acp` over its stdio, for tests/suite/acp.rs. Every frame agentd writes is checked to
// be one JSON line and validated against the schema.json the SDK package ships: the whole
// frame against the root schema, and its params or result against the definition of its
// method. Prints one JSON summary on stdout; the Rust test asserts on it.
//
// Usage: node sdk_client.mjs NODE_MODULES AGENTD CONFIG CWD [ARGS]
// ARGS, a JSON array, replaces `acp --config CONFIG` as agentd's arguments (a bridge's).
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const [modules, agentdBin, config, cwd, args] = process.argv.slice(2);
const agentdArgs = args ? JSON.parse(args) : ["acp", "--config", config];
const require = createRequire(join(modules, "noop.js"));
const acp = await import(pathToFileURL(require.resolve("@agentclientprotocol/sdk")).href);
const Ajv2020 = require("ajv/dist/2020").default;
const schemaPath = join(modules, "@agentclientprotocol/sdk/schema/v1/schema.json");
const schema = JSON.parse(readFileSync(schemaPath, "utf8"));

// The schema's integer formats (int32, uint16, …) are not JSON Schema formats; its
// `discriminator` keywords repeat what the oneOf branches say.
const ajv = new Ajv2020({ strict: false, validateFormats: false, allErrors: true });
ajv.addSchema(schema, "acp");
const root = ajv.compile({ $ref: "acp" });
const defs = {};
const def = (name) => (defs[name] ??= ajv.compile({ $ref: `acp#/$defs/${name}` }));
const resultDefs = {
  initialize: "InitializeResponse",
  "session/new": "NewSessionResponse",
  "session/load": "LoadSessionResponse",
  "session/prompt": "PromptResponse",
  "session/set_mode": "SetSessionModeResponse",
};
const paramDefs = {
  "session/update": "SessionNotification",
  "session/request_permission": "RequestPermissionRequest",
};

const summary = { frames: 0, schemaErrors: [], nonJsonLines: [], exitCodes: [] };

function check(frame, sentMethods) {
  summary.frames += 1;
  const problems = [];
  if (!root(frame)) problems.push({ against: "root", errors: root.errors });
  let name;
  if (frame.method) {
    name = paramDefs[frame.method];
    if (!name) problems.push({ unexpectedMethod: frame.method });
    else if (!def(name)(frame.params)) problems.push({ against: name, errors: def(name).errors });
  } else if (frame.error) {
    if (!def("Error")(frame.error)) problems.push({ against: "Error", errors: def("Error").errors });
  } else {
    name = resultDefs[sentMethods.get(frame.id)];
    if (!name) problems.push({ unexpectedAnswer: frame.id });
    else if (!def(name)(frame.result)) problems.push({ against: name, errors: def(name).errors });
  }
  if (problems.length) summary.schemaErrors.push({ frame, problems });
}

/** Starts `agentd acp` and an SDK client app on its stdio; `op` runs with the context. */
async function withAgent(handlers, op) {
  const child = spawn(agentdBin, agentdArgs, {
    stdio: ["pipe", "pipe", "inherit"],
  });
  const exited = new Promise((resolve) => child.on("exit", (code) => resolve(code)));
  const [raw, forSdk] = Readable.toWeb(child.stdout).tee();
  // Every byte on stdout must belong to a JSON line.
  const lines = (async () => {
    const decoder = new TextDecoder();
    let buffered = "";
    for await (const chunk of raw) {
      buffered += decoder.decode(chunk, { stream: true });
      let at;
      while ((at = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, at);
        buffered = buffered.slice(at + 1);
        try {
          JSON.parse(line);
        } catch {
          summary.nonJsonLines.push(line);
        }
      }
    }
    if (buffered.length) summary.nonJsonLines.push(buffered);
  })();
  const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), forSdk);
  const sentMethods = new Map();
  const outgoing = new TransformStream({
    transform(frame, controller) {
      if (frame.method && frame.id !== undefined) sentMethods.set(frame.id, frame.method);
      controller.enqueue(frame);
    },
  });
  outgoing.readable.pipeTo(stream.writable).catch(() => {});
  const incoming = stream.readable.pipeThrough(
    new TransformStream({
      transform(frame, controller) {
        check(frame, sentMethods);
        controller.enqueue(frame);
      },
    }),
  );
  let app = acp.client({ name: "agentd-acp-test" });
  for (const [method, handler] of Object.entries(handlers.requests ?? {})) {
    app = app.onRequest(method, handler);
  }
  for (const [method, handler] of Object.entries(handlers.notifications ?? {})) {
    app = app.onNotification(method, handler);
  }
  let result;
  try {
    result = await app.connectWith({ readable: incoming, writable: outgoing.writable }, op);
  } finally {
    child.stdin.end();
  }
  summary.exitCodes.push(await exited);
  await lines;
  return result;
}

const initialize = (ctx) =>
  ctx.request(acp.methods.agent.initialize, {
    protocolVersion: acp.PROTOCOL_VERSION,
    clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
    clientInfo: { name: "agentd-acp-test", version: "1.0.0" },
  });

// First connection: a prompt with tools and an approval, then a cancelled prompt.
const updates = [];
const permissions = [];
let onUpdate = () => {};
const first = await withAgent(
  {
    requests: {
      [acp.methods.client.session.requestPermission]: ({ params }) => {
        permissions.push(params);
        return { outcome: { outcome: "selected", optionId: "allow_once" } };
      },
    },
    notifications: {
      [acp.methods.client.session.update]: ({ params }) => {
        updates.push(params.update);
        onUpdate(params);
      },
    },
  },
  async (ctx) => {
    const init = await initialize(ctx);
    const session = await ctx.request(acp.methods.agent.session.new, { cwd, mcpServers: [] });
    const badCwd = await ctx
      .request(acp.methods.agent.session.new, { cwd: "/", mcpServers: [] })
      .then(() => null, (err) => ({ code: err.code, message: err.message }));
    const badMode = await ctx
      .request(acp.methods.agent.session.setMode, { sessionId: session.sessionId, modeId: "yolo" })
      .then(() => null, (err) => ({ code: err.code, message: err.message }));
    const prompt = await ctx.request(acp.methods.agent.session.prompt, {
      sessionId: session.sessionId,
      prompt: [{ type: "text", text: "read notes.txt and say hi" }],
    });
    const promptUpdates = updates.splice(0);
    // The next answer holds after "waiting": cancel once it shows.
    onUpdate = (params) => {
      const update = params.update;
      if (update.sessionUpdate === "agent_message_chunk" && update.content.text === "waiting") {
        onUpdate = () => {};
        ctx.notify(acp.methods.agent.session.cancel, { sessionId: session.sessionId });
      }
    };
    const cancelled = await ctx.request(acp.methods.agent.session.prompt, {
      sessionId: session.sessionId,
      prompt: [{ type: "text", text: "wait for me" }],
    });
    return { init, session, badCwd, badMode, prompt, promptUpdates, cancelled };
  },
);

// Second connection: the stored session, replayed.
const replayed = [];
const load = await withAgent(
  {
    notifications: {
      [acp.methods.client.session.update]: ({ params }) => replayed.push(params.update),
    },
  },
  async (ctx) => {
    await initialize(ctx);
    const loaded = await ctx.request(acp.methods.agent.session.load, {
      sessionId: first.session.sessionId,
      cwd,
      mcpServers: [],
    });
    // Counted at the answer: the replay comes before it.
    return { loaded, updates: replayed.length };
  },
);

const text = (list, kind) =>
  list.filter((u) => u.sessionUpdate === kind).map((u) => u.content.text).join("");
const calls = first.promptUpdates.filter((u) => u.sessionUpdate === "tool_call");
const finalStatus = (id) =>
  first.promptUpdates
    .filter((u) => u.toolCallId === id && u.status)
    .map((u) => u.status)
    .pop();
console.log(
  JSON.stringify({
    ...summary,
    protocolVersion: first.init.protocolVersion,
    agentCapabilities: first.init.agentCapabilities,
    modes: first.session.modes,
    badCwd: first.badCwd,
    badMode: first.badMode,
    stopReason: first.prompt.stopReason,
    updateKinds: [...new Set(first.promptUpdates.map((u) => u.sessionUpdate))],
    agentText: text(first.promptUpdates, "agent_message_chunk"),
    thoughtText: text(first.promptUpdates, "agent_thought_chunk"),
    toolCalls: calls.map((c) => ({ title: c.title, kind: c.kind, status: finalStatus(c.toolCallId) })),
    plan: first.promptUpdates.filter((u) => u.sessionUpdate === "plan").map((u) => u.entries),
    permissions: permissions.map((p) => ({
      title: p.toolCall.title,
      kind: p.toolCall.kind,
      options: p.options.map((o) => o.kind),
    })),
    cancelledStopReason: first.cancelled.stopReason,
    load: {
      answer: load.loaded,
      updatesBeforeAnswer: load.updates,
      userText: text(replayed, "user_message_chunk"),
      agentText: text(replayed, "agent_message_chunk"),
      toolCalls: replayed.filter((u) => u.sessionUpdate === "tool_call").map((u) => u.kind),
    },
  }),
);
