// Type-checked against the generated types by tests/clients/test_typescript.py (tsc --noEmit).
import {
  HostClient, HostRefused, RpcError, isKnownBlock, type AnyBlock, type Block, type AnyEvent, type UiMessage,
} from "../src/client.js";

function render(block: Block): string {
  if (block.type === "text") return block.text;  // narrows to TextBlock
  switch (block.type) {
    case "thinking":
      return block.text;
    case "tool_call":
      return `tool ${block.name} (${block.status ?? "running"})`;
    case "attachment":
      return `${block.kind}: ${block.name} ${block.mimeType ?? ""}`;
    case "hostedSearch":
      return `search: ${block.rounds.length} round(s)`;
    default: {
      const other = block as AnyBlock;  // a type a newer host sent: shown by name
      return isKnownBlock(other) ? "" : `[${other.type}]`;
    }
  }
}

function show(message: UiMessage): string {
  return `${message.role}: ${message.blocks.map(render).join(" ")}`;
}

function onEvent(event: AnyEvent): void {
  switch (event.topic) {
    case "session.message":
      console.log("message", event.data.message.seq, event.data.message.role);
      break;
    case "session.inflight":
      // transient: a coalesced preview whose cursor repeats the newest numbered one (never resume from it)
      console.log("streaming", event.transient === true, event.data.turnId, event.data.savedAt,
        event.data.message.inflight, event.data.message.blocks.map(render).join(""));
      break;
    case "approval.requested":
      console.log("permission?", event.data.request.tool, event.data.request.argsSummary,
        event.data.request.options.map((o) => `${o.id}=${o.decision}/${o.remember}`).join(" "));
      break;
    case "approval.resolved":
      console.log("answered", event.data.request.requestId, event.data.request.status, event.data.rule?.scope);
      break;
    case "session.queue":
      console.log("queue", event.data.entries.length, event.data.held);
      break;
    default:
      console.log(event.topic, event.cursor);
  }
}

export async function example(url: string, token: string): Promise<void> {
  let client: HostClient;
  try {
    client = await HostClient.connect({
      url, token, clientId: "ts-example", clientKind: "ui", onEvent,
      // "waiting for a host on ws://…: …; next try in 800 ms", "reconnected; resumed at cursor 1046"
      onState: (state) => console.log(state.message),
      onResync: (_sub, reason) => console.log("reload everything:", reason),
      backoff: { initialMs: 250, maxMs: 10000 },
    });
  } catch (err) {
    if (err instanceof HostRefused) console.log("check the token:", err.code);  // never retried
    throw err;
  }
  const session = await client.call("session.create", { title: "TypeScript", projectPath: "/tmp/demo" });
  await client.subscribe(["session.message", "session.inflight", "session.queue"], session.id);
  const appended = await client.call("session.appendMessage", {
    sessionId: session.id,
    message: { id: "m1", role: "user", blocks: [{ type: "text", text: "hello" }] },
  });
  const seq: number = appended.message.seq;
  const page = await client.call("session.get", { sessionId: session.id, messageLimit: 20 });
  page.messages.forEach((m) => console.log(show(m)));
  const waiting = await client.call("approvals.pending", { sessionId: session.id });
  for (const request of waiting.pending) {
    const allow = request.options.find((o) => o.decision === "allow" && o.remember === "once");
    if (allow !== undefined) {
      const answered = await client.call("approvals.respond", {
        sessionId: session.id, requestId: request.requestId, optionId: allow.id,
      });
      console.log(answered.request.status, answered.rule?.id);
    }
  }
  const usage = await client.call("usage.session", { sessionId: session.id });
  console.log("usage", usage);
  const hits = await client.call("search.sessions", { query: "hello", limit: 5 });
  for (const hit of hits.results) console.log(hit.sessionId, hit.messageMatches);
  try {
    await client.call("session.get", { sessionId: "no-such-session" });
  } catch (err) {
    if (err instanceof RpcError && err.dataCode === "SESSION_NOT_FOUND") console.log("not found, as expected", seq);
    else throw err;
  }
  client.close();
}
