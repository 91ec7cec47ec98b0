// A client driven line by line for tests/clients/test_typescript_reconnect.py (compiled with tsc, run by Node 20
// with the `ws` package as its WebSocket): JSON commands on stdin, JSON lines out (states, events, results).
import { createInterface } from "node:readline";
import WebSocket from "ws";
import {
  type CallOptions,
  ConnectionLost,
  HostClient,
  HostRefused,
  RpcError,
  type ConnectOptions,
  type MethodName,
  type ParamsOf,
  type Subscription,
  type Topic,
} from "../src/client.js";

function out(line: { [key: string]: unknown }): void {
  process.stdout.write(JSON.stringify({ t: Date.now(), ...line }) + "\n");
}

type Command =
  | { op: "create"; title: string }
  | { op: "subscribe"; sessionId: string }
  | { op: "append"; sessionId: string; id: string; text: string }
  | { op: "flood"; n: number }
  /** Send any call without waiting for it (with its own `timeoutMs` if given): a `done` line with `tag` says how it
   * ended. */
  | { op: "start"; tag: string; method: MethodName; params: { [key: string]: unknown }; timeoutMs?: number }
  /** Like `start`, with a value JSON lines cannot carry put at `path` inside `params` first (`path`'s parent is in
   * `params`): NaN, a BigInt, a Map..., lists nested `deep`, an object holding itself (`cycle`). */
  | { op: "startWith"; tag: string; method: MethodName; params: { [key: string]: unknown }; path: (string | number)[];
      value: string }
  /** `subscribe` with a value JSON lines cannot carry (named as for `startWith`) as one of its topics, its session
   * id or its cursor: a `done` line with `tag` says how it ended. */
  | { op: "subscribeWith"; tag: string; place: "topic" | "sessionId" | "cursor"; value: string }
  /** Like `start`, with an AbortSignal that `abort` (same `tag`) fires. */
  | { op: "startAbortable"; tag: string; method: MethodName; params: { [key: string]: unknown } }
  /** What `RpcError.retriable` says of an error whose `data` is this. */
  | { op: "retriable"; data: { [key: string]: unknown } }
  | { op: "abort"; tag: string }
  /** Calls waiting for a connection and requests in flight. */
  | { op: "pending" }
  | { op: "settle" }
  | { op: "close" };

/** Calls sent while the host was away ("flood"): how many were refused at once, how many resolved later. */
const flood = { refused: 0, resolved: 0, failed: 0, pending: [] as Promise<void>[] };

/** The AbortControllers of the calls started with `startAbortable`, by tag. */
const aborts = new Map<string, AbortController>();

/** The values `startWith` puts into params, by name. */
function made(name: string): unknown {
  switch (name) {
    case "NaN": return NaN;
    case "Infinity": return Infinity;
    case "-Infinity": return -Infinity;
    case "bigint": return 10n ** 20n;
    case "function": return () => 1;
    case "symbol": return Symbol("s");
    case "undefined": return undefined;
    case "Map": return new Map([["a", 1]]);
    case "Set": return new Set([1]);
    case "Uint8Array": return new Uint8Array([1, 2]);
    case "Date": return new Date(0);
    case "lone": return "a\uD800b";
    case "loneLow": return "\uDFFF";
    case "loneKey": return { ["k\uDC00"]: 1 };
    case "pair": return "a\uD83D\uDE00b"; // a whole pair: 😀
    case "2**63": return 2 ** 63;
    case "-2**63": return -(2 ** 63);
    case "2**62": return 2 ** 62; // in range, 19 digits
    case "deep": {
      let value: unknown = 1;
      for (let i = 0; i < 5000; i++) value = [value];
      return value;
    }
    case "deep70": { // deeper than the host reads (64 containers), not than JSON.stringify writes
      let value: unknown = 1;
      for (let i = 0; i < 70; i++) value = [value];
      return value;
    }
    case "cycle": {
      const value: { [key: string]: unknown } = { a: 1 };
      value.self = value;
      return value;
    }
  }
  throw new Error(`no such value: ${name}`);
}

/** How a call failed, for the test to check: the error's class and what a `HostUnavailable` carries (read by
 * property, so the harness builds against a client without it too). */
function failure(err: unknown, started: number): { [key: string]: unknown } {
  const extra = err as { waitedMs?: unknown; lastError?: unknown; sent?: unknown; mayHaveTakenEffect?: unknown;
    submissionId?: unknown; timeoutMs?: unknown };
  return {
    sent: extra?.sent ?? null,
    mayHaveTakenEffect: extra?.mayHaveTakenEffect ?? null,
    submissionId: extra?.submissionId ?? null,
    timeoutMs: extra?.timeoutMs ?? null,
    dataCode: err instanceof RpcError ? err.dataCode : null,
    data: err instanceof RpcError ? err.data : null,
    error: String(err),
    name: err instanceof Error ? err.name : typeof err,
    connectionLost: err instanceof ConnectionLost,
    waitedMs: extra?.waitedMs ?? null,
    lastError: extra?.lastError instanceof Error ? extra.lastError.message : null,
    elapsedMs: Date.now() - started,
  };
}

async function main(): Promise<void> {
  const [url, token, extra] = process.argv.slice(2);
  if (url === undefined || token === undefined) throw new Error("usage: harness.js URL TOKEN [OPTIONS_JSON]");
  const options: ConnectOptions = {
    url,
    token,
    clientId: "ts-harness",
    clientKind: "test",
    WebSocketImpl: WebSocket,
    onState: (s) => out({ kind: "state", state: s.state, message: s.message, attempt: "attempt" in s ? s.attempt : null,
      delayMs: s.state === "waiting" ? s.delayMs : null,
      resumed: s.state === "reconnected" ? s.resumed.map((r) => r.cursor) : null }),
    onEvent: (ev) => {
      const data = ev.data as { message?: { id?: string } };
      out({ kind: "event", topic: ev.topic, cursor: ev.cursor, messageId: data.message?.id ?? null });
    },
    onResync: (_sub: Subscription, reason: string) => out({ kind: "resync", reason }),
    ...(extra === undefined ? {} : (JSON.parse(extra) as Partial<ConnectOptions>)),
  };
  if ((options as { throwInCallbacks?: boolean }).throwInCallbacks === true) {
    // an app whose callbacks throw after doing their work: the client must go on (and report what was thrown)
    const { onEvent, onState, onResync } = options;
    options.onEvent = (ev, sub) => {
      onEvent?.(ev, sub);
      throw new Error(`app bug in onEvent at cursor ${ev.cursor}`);
    };
    options.onState = (s) => {
      onState?.(s);
      throw new Error(`app bug in onState (${s.state})`);
    };
    options.onResync = (sub, reason) => {
      onResync?.(sub, reason);
      throw new Error("app bug in onResync");
    };
    options.onCallbackError = (err, callback) =>
      out({ kind: "callbackError", callback, message: err instanceof Error ? err.message : String(err) });
  }
  const started = Date.now();
  let client: HostClient;
  try {
    client = await HostClient.connect(options);
  } catch (err) {
    out({
      kind: "error",
      name: err instanceof Error ? err.name : typeof err,
      message: String(err),
      connectionLost: err instanceof ConnectionLost,
      code: err instanceof HostRefused ? err.code : null,
      status: err instanceof HostRefused ? ((err as { status?: unknown }).status ?? null) : null, // by property: see failure()
      elapsedMs: Date.now() - started,
    });
    return;
  }
  out({ kind: "connected", bootId: client.hello?.bootId ?? null });
  const lines = createInterface({ input: process.stdin });
  for await (const line of lines) {
    const cmd = JSON.parse(line) as Command;
    try {
      switch (cmd.op) {
        case "create": {
          const s = await client.call("session.create", { title: cmd.title });
          out({ kind: "result", op: cmd.op, value: s.id });
          break;
        }
        case "subscribe": {
          const sub = await client.subscribe(["session.message"], cmd.sessionId);
          out({ kind: "result", op: cmd.op, value: sub.cursor });
          break;
        }
        case "append": {
          const r = await client.call("session.appendMessage", {
            sessionId: cmd.sessionId,
            message: { id: cmd.id, role: "user", blocks: [{ type: "text", text: cmd.text }] },
          });
          out({ kind: "result", op: cmd.op, value: r.message.seq });
          break;
        }
        case "flood": {
          // not awaited: these wait for the reconnect, bounded by maxWaitingCalls
          for (let i = 0; i < cmd.n; i++) {
            flood.pending.push(client.call("session.list", {}).then(
              () => void (flood.resolved += 1),
              (err: unknown) => void (err instanceof ConnectionLost ? (flood.refused += 1) : (flood.failed += 1)),
            ));
          }
          await new Promise((resolve) => setTimeout(resolve, 100));
          out({ kind: "result", op: cmd.op, value: { refused: flood.refused, resolved: flood.resolved } });
          break;
        }
        case "start": {
          const started = Date.now();
          // a cast, so the harness builds against a client without timeoutMs too (its tests then fail, not the build)
          const options = (cmd.timeoutMs === undefined ? {} : { timeoutMs: cmd.timeoutMs }) as CallOptions;
          client.call(cmd.method, cmd.params as ParamsOf<MethodName>, options).then(
            (value: unknown) => out({ kind: "done", tag: cmd.tag, value, elapsedMs: Date.now() - started }),
            (err: unknown) => out({ kind: "done", tag: cmd.tag, ...failure(err, started) }),
          );
          out({ kind: "result", op: cmd.op, value: cmd.tag });
          break;
        }
        case "startWith": {
          const started = Date.now();
          let parent = cmd.params as { [key: string | number]: unknown };
          for (const part of cmd.path.slice(0, -1)) parent = parent[part] as { [key: string | number]: unknown };
          parent[cmd.path[cmd.path.length - 1] as string | number] = made(cmd.value);
          client.call(cmd.method, cmd.params as ParamsOf<MethodName>).then(
            (value: unknown) => out({ kind: "done", tag: cmd.tag, value, elapsedMs: Date.now() - started }),
            (err: unknown) => out({ kind: "done", tag: cmd.tag, ...failure(err, started) }),
          );
          out({ kind: "result", op: cmd.op, value: cmd.tag });
          break;
        }
        case "subscribeWith": {
          const started = Date.now();
          const value = made(cmd.value);
          const topics = (cmd.place === "topic" ? ["session.message", value] : ["session.message"]) as Topic[];
          client.subscribe(topics, (cmd.place === "sessionId" ? value : undefined) as string | undefined,
            (cmd.place === "cursor" ? value : undefined) as number | undefined).then(
            (sub: Subscription) => out({ kind: "done", tag: cmd.tag, value: sub.cursor, elapsedMs: Date.now() - started }),
            (err: unknown) => out({ kind: "done", tag: cmd.tag, ...failure(err, started) }),
          );
          out({ kind: "result", op: cmd.op, value: cmd.tag });
          break;
        }
        case "startAbortable": {
          const started = Date.now();
          const controller = new AbortController();
          aborts.set(cmd.tag, controller);
          client.call(cmd.method, cmd.params as ParamsOf<MethodName>, { signal: controller.signal }).then(
            (value: unknown) => out({ kind: "done", tag: cmd.tag, value, elapsedMs: Date.now() - started }),
            (err: unknown) => out({ kind: "done", tag: cmd.tag, ...failure(err, started) }),
          );
          out({ kind: "result", op: cmd.op, value: cmd.tag });
          break;
        }
        case "abort": {
          aborts.get(cmd.tag)?.abort();
          out({ kind: "result", op: cmd.op, value: cmd.tag });
          break;
        }
        case "retriable": {
          out({ kind: "result", op: cmd.op, value: new RpcError(-32004, String(cmd.data.code), "m", cmd.data).retriable });
          break;
        }
        case "pending": {
          out({ kind: "result", op: cmd.op, value: client.pendingCalls });
          break;
        }
        case "settle": {
          await Promise.all(flood.pending);
          out({ kind: "result", op: cmd.op, value: { refused: flood.refused, resolved: flood.resolved,
            failed: flood.failed } });
          break;
        }
        case "close":
          client.close();
          out({ kind: "result", op: cmd.op, value: client.attempts });
          // stop reading stdin: the process then exits by itself only if the client left no socket or timer behind
          lines.close();
          process.stdin.destroy();
          return;
      }
    } catch (err) {
      out({ kind: "result", op: cmd.op, error: String(err) });
    }
  }
  client.close();
}

main().catch((err: unknown) => {
  out({ kind: "crash", message: String(err) });
  process.exitCode = 1;
});
