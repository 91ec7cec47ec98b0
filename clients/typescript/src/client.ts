// A small typed JSON-RPC client for pi-host over a WebSocket (browser, Deno, Node 22+, or Node 20 with an
// implementation passed in such as the `ws` package). Hand-written; the types come from the generated
// ./protocol.ts.
//
// Reconnection is done once, in one place (`HostClient.run`): a single retry chain with exponential backoff,
// jitter and a cap; a visible state (`onState`: "waiting for a host on …", "reconnected; resumed at cursor …");
// bad token and protocol mismatch fail at once with `HostRefused` (a `ConnectionLost`); a call is bounded by its
// `timeoutMs` or `callTimeoutMs` (`CallTimeout`) and a silent host found by a keepalive ping; the memory held while
// the host is away is bounded (one socket, one backoff timer, at most `maxWaitingCalls` calls waiting), and so is
// the time a call waits for it (`reconnectTimeoutMs`, then `HostUnavailable`; the client goes on reconnecting);
// subscriptions are re-established after a reconnect from the last cursor they delivered (or resynced when the
// host restarted).
import {
  MAX_JSON_DEPTH,
  MUTATING_METHODS,
  PROTOCOL_VERSION,
  RETRIABLE_CODES,
  type AnyEvent,
  type ErrorCode,
  type HelloResult,
  type MethodName,
  type ParamsOf,
  type ResultOf,
  type SubscribeResult,
  type Topic,
} from "./protocol.js";

export * from "./protocol.js";

/** The host answered with a JSON-RPC error. Branch on `dataCode`, never on the message. */
export class RpcError extends Error {
  constructor(
    readonly code: number,
    readonly dataCode: ErrorCode | string,
    message: string,
    readonly data: { [key: string]: unknown },
  ) {
    super(`${dataCode} (${code}): ${message}`);
    this.name = "RpcError";
  }
  /** Whether the same request may succeed if sent again: what the host says (`data.retriable`, sent with every
   * error, e.g. true for a `PAYLOAD_TOO_LARGE` batch entry that ran), else the code table (`RETRIABLE_CODES`).
   * The Python client's `RpcError.retriable` reads it the same way. */
  get retriable(): boolean {
    const said = this.data.retriable;
    return typeof said === "boolean" ? said : (RETRIABLE_CODES as readonly string[]).includes(this.dataCode);
  }
}

/** A call got no answer within its bound (`timeoutMs` of the call, else the client's `callTimeoutMs`). The call
 * gives up; the connection and the client go on. `sent`: the request was written to a connection (by this try or an
 * earlier one whose connection was lost), so the host may have it. `mayHaveTakenEffect`: it was sent and it is a
 * mutating method; then send it again with the same `submissionId` (`call` always gives a mutating call one): the
 * host applies it at most once and answers a request it already applied from its receipt. A call never sent, and a
 * read, changed nothing. The Python client raises `CallTimeout` the same way. */
export class CallTimeout extends Error {
  constructor(
    readonly method: string,
    readonly timeoutMs: number,
    readonly sent: boolean,
    readonly mutating: boolean,
    readonly submissionId: string | null,
  ) {
    let outcome: string;
    if (!sent) outcome = "it was never sent (no connection): nothing took effect";
    else if (!mutating) outcome = "it was sent; a read changes nothing: call it again";
    else if (submissionId !== null) {
      outcome = `it was sent and may have taken effect: send it again with the same submissionId ('${submissionId}') and the host applies it at most once`;
    } else outcome = "it was sent and may have taken effect; it carried no submissionId, so sending it again may apply it twice";
    super(`${method}: no answer within ${timeoutMs} ms; ${outcome}`);
    this.name = "CallTimeout";
  }
  get mayHaveTakenEffect(): boolean {
    return this.sent && this.mutating;
  }
}

/** The connection is gone and the client does not (or may no longer) reconnect; or, as {@link HostUnavailable},
 * a call could not wait any longer for it to come back. */
export class ConnectionLost extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ConnectionLost";
  }
}

/** `host.hello` errors no retry can fix: the client stops at once with {@link HostRefused}. */
export const REFUSED_HELLO_CODES = ["UNAUTHENTICATED", "UNSUPPORTED_PROTOCOL"] as const;

/** The server refused this client in a way retrying cannot fix; the client stops at once. `code`: `UNAUTHENTICATED`
 * (a bad token) or `UNSUPPORTED_PROTOCOL` from `host.hello`, on any connection; on the first connection also any
 * other error `host.hello` answers that is not retriable (e.g. `INVALID_PARAMS`), and `HANDSHAKE_REFUSED` when the
 * server answered the WebSocket handshake with an HTTP status other than 101 and 503 (`status`: 403 for an Origin or
 * Host the host refuses; 200 or 404 from a web server that is no host) or not in HTTP (`status` null). Only a
 * WebSocket implementation that says why a handshake failed (the `ws` package does; browsers do not) lets the
 * client see a refused handshake: elsewhere it is a failure like any other ({@link HostNotRunning}). */
export class HostRefused extends ConnectionLost {
  constructor(
    readonly code: string,
    detail: string,
    readonly status: number | null = null,
  ) {
    super(`the host refused this client: ${code}: ${detail}`);
    this.name = "HostRefused";
  }
}

/** No host answered at the url (the first connection, without `waitForHost`, or not within `connectTimeoutMs`). */
export class HostNotRunning extends ConnectionLost {
  constructor(message: string) {
    super(message);
    this.name = "HostNotRunning";
  }
}

/** A call waited `waitedMs` (the client's `reconnectTimeoutMs`) for the client to reconnect, and no host
 * answered (`lastError`: why the last attempt failed, or why the connection was lost). The call gives up; the
 * client keeps reconnecting in the background, so a later call works once the host is back. A mutating call that
 * failed with this may or may not have taken effect: send it again with the same `submissionId` and the host
 * answers from its receipt instead of applying it twice. */
export class HostUnavailable extends ConnectionLost {
  constructor(
    readonly waitedMs: number,
    readonly lastError: Error | null,
  ) {
    super(`no connection to the host within ${waitedMs} ms (${lastError?.message ?? "not connected"})`);
    this.name = "HostUnavailable";
  }
}

/** The part of a WHATWG WebSocket the client uses (the global one and the `ws` package's both fit). */
export interface WebSocketLike {
  readonly readyState: number;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- implementations type their events differently
  onopen: ((event: any) => void) | null;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  onerror: ((event: any) => void) | null;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  onclose: ((event: any) => void) | null;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  onmessage: ((event: any) => void) | null;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  /** Send a WebSocket ping (the `ws` package has it; the WHATWG WebSocket has none, so no keepalive there). */
  ping?: () => void;
  /** Drop the connection at once, without a closing handshake (the `ws` package). */
  terminate?: () => void;
  /** Listen for a pong (the `ws` package's EventEmitter `on("pong", …)`). */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  on?: (event: string, listener: (...args: any[]) => void) => unknown;
}
export type WebSocketConstructor = new (url: string) => WebSocketLike;

/** Where the connection stands; `message` is one line for a status bar or a log. */
export type ConnectionState =
  | { state: "connecting"; attempt: number; message: string }
  | { state: "connected"; attempt: number; hello: HelloResult; message: string }
  /** `attempt`: failed attempts since the last connection (0: the connection was just lost). */
  | { state: "waiting"; attempt: number; delayMs: number; reason: string; message: string }
  | {
      state: "reconnected";
      attempt: number;
      hello: HelloResult;
      /** The host restarted (a new bootId): cursors of the old boot do not resume, subscriptions were resynced. */
      restarted: boolean;
      /** The cursor each subscription resumed at (`null`: resubscribed without one, see `onResync`). */
      resumed: { subscription: Subscription; cursor: number | null }[];
      message: string;
    }
  | { state: "closed"; error: ConnectionLost | null; message: string };

export interface Backoff {
  /** First delay before a retry (ms); doubled after every failed attempt. Default 250. */
  initialMs?: number;
  /** The cap (ms). Default 10000. */
  maxMs?: number;
  /** Each delay is drawn uniformly from [delay × (1 − jitter), delay]. Default 0.5. */
  jitter?: number;
}

/** The app's callbacks among the {@link ConnectOptions}. */
export type CallbackName = "onEvent" | "onResync" | "onState" | "onClose";

export interface ConnectOptions {
  url: string;
  /** The contents of host.token with the trailing newline stripped (64 hex characters). */
  token: string;
  clientId: string;
  clientKind?: "ui" | "agent" | "cli" | "test";
  /** Called for every `event` notification, with the subscription it arrived on. */
  onEvent?: (event: AnyEvent, subscription: Subscription | undefined) => void;
  /** Called when a subscription could not resume where it was (the host restarted, or no longer holds the missed
   * events): reload what you show (`session.get`, `session.list` …), then go on with the events that follow. */
  onResync?: (subscription: Subscription, reason: string) => void;
  /** Called when the connection state changes (also the retry chain's every attempt). */
  onState?: (state: ConnectionState) => void;
  /** Called once, when the client stops for good (`close()`, a refusal, or reconnect disabled). */
  onClose?: (code: number, reason: string) => void;
  /** Called with what `onEvent`, `onResync`, `onState` or `onClose` threw (default: `console.error`). Such an
   * exception never ends the connection or the client: the next events and answers are delivered as usual. */
  onCallbackError?: (error: unknown, callback: CallbackName) => void;
  /** A WebSocket constructor (defaults to the global one; Node 20 has none: pass the `ws` package's). */
  WebSocketImpl?: WebSocketConstructor;
  /** Reconnect after a lost connection (default true). */
  reconnect?: boolean;
  backoff?: Backoff;
  /** When no host answers the first attempt: keep trying (until `connectTimeoutMs`) instead of failing at once
   * with `HostNotRunning`. A refusal (`HostRefused`) fails at once all the same, and a busy host (503, a retriable
   * answer to `host.hello`) is tried again either way (README, "The first connection"). Default false. */
  waitForHost?: boolean;
  /** Bound on the first connection, retries included (ms). Default 30000. */
  connectTimeoutMs?: number;
  /** Bound on the opening WebSocket handshake of each connection attempt (ms), the first and every reconnect: a
   * host that accepts the connection and answers nothing (stopped, frozen) fails that attempt, which the retry
   * chain follows with its backoff, instead of holding it until the host runs again. Default 30000 (the Python
   * client's bound); `Infinity`: none. */
  handshakeTimeoutMs?: number;
  /** Bound on `host.hello` once the socket is open (ms). Default 10000. */
  helloTimeoutMs?: number;
  /** Calls that may wait for a reconnect at once; more are refused with `ConnectionLost`. Default 256. */
  maxWaitingCalls?: number;
  /** How long a call waits for the client to reconnect (ms), made while the connection is down or sent on one that
   * dropped before the answer; then it fails with `HostUnavailable` while the client goes on reconnecting.
   * Default 30000; `Infinity`: as long as it takes. (The first connection is bounded by `connectTimeoutMs`.) */
  reconnectTimeoutMs?: number;
  /** How many times a call is sent (a lost connection or a retriable error). Default 8. */
  maxCallAttempts?: number;
  /** Bound on every call (ms), from its start to its answer, waiting for a connection and retries included, unless
   * the call passes its own `timeoutMs`; then it rejects with {@link CallTimeout}. Default: none (`Infinity`): a call
   * may rightly take minutes (`import.sessions`); a host that is gone or frozen is found by the keepalive. */
  callTimeoutMs?: number;
  /** A WebSocket ping on each connection every so often (ms), when the WebSocket implementation can send one (the
   * `ws` package; a browser's cannot). Default 20000; `Infinity`: none. */
  keepaliveIntervalMs?: number;
  /** Nothing heard that long (ms) after a ping (no pong, no frame): the connection is closed as dead, and its calls
   * are retried on the next one (waiting at most `reconnectTimeoutMs`). Default 20000. */
  keepaliveTimeoutMs?: number;
}

/** One `events.subscribe`, kept across reconnects: `cursor` is the last numbered event delivered. */
export class Subscription {
  cursor: number | null;
  bootId: string | null = null;
  wireId: string | null = null;
  closed = false;
  constructor(
    readonly topics: readonly Topic[],
    readonly sessionId: string | undefined,
    cursor: number | undefined,
  ) {
    this.cursor = cursor ?? null;
  }
}

type Pending = { resolve: (value: unknown) => void; reject: (error: unknown) => void };
type Waiter = { resolve: (conn: Connection) => void; reject: (error: unknown) => void };

/** The longest delay `setTimeout` takes (a longer one fires at once). */
const MAX_TIMER_MS = 2 ** 31 - 1;

function newSubmissionId(): string {
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

const OPEN = 1;

/** A call's params as JSON text: encoded once, before the call waits for a connection, and sent as is by every try. */
class EncodedParams {
  constructor(readonly text: string) {}
}

/** What JSON cannot carry in a call's params, found by {@link unsendable}: `what` it is ("NaN", "a Map", "undefined")
 * and where (`loc`: the keys and indexes from params, when asked for), or `tooDeep`. */
type Unsendable = { what: string; loc: (string | number)[]; tooDeep: boolean };

/** Objects `JSON.stringify` writes as `{}` or as an object of indexes, whatever they hold: "a Map"... */
function opaqueName(value: object): string | null {
  if (value instanceof Map || value instanceof Set || value instanceof WeakMap || value instanceof WeakSet
    || value instanceof ArrayBuffer || ArrayBuffer.isView(value) || value instanceof Promise) {
    const name = value.constructor.name;
    return `${/^[AEIO]/.test(name) ? "an" : "a"} ${name}`; // an ArrayBuffer, a Uint8Array
  }
  return null;
}

/** A UTF-16 surrogate that is not half of a pair: `JSON.stringify` writes it as an escape (`"\\ud800"`), which the
 * host refuses as `PARSE_ERROR` with `id: null` (no answer to the call), as the Python client refuses it. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** What in `JSON.stringify`'s text may be a lone surrogate's escape, or an integer outside the signed 64-bit range
 * (19 digits or more): then the params are looked into. */
const SUSPECT = /\\ud[89a-f]|[0-9]{19}/;

/** Why one value that is no object cannot be written as it is (null: it can). `inArray`: `JSON.stringify` writes
 * `undefined`, a function or a symbol in an array as `null`, and leaves such a member out of an object, as an absent
 * key (accepted). */
function unsendableLeaf(item: unknown, inArray: boolean): string | null {
  switch (typeof item) {
    case "string":
      return LONE_SURROGATE.test(item) ? "a lone surrogate" : null; // written as an escape the host refuses
    case "boolean":
    case "object": // null
      return null;
    case "number":
      if (!Number.isFinite(item)) return String(item); // NaN, Infinity, -Infinity: written null
      // written as an integer literal the host refuses (PARSE_ERROR) from 2**63 on, up to 1e21 (then in e-notation)
      return Math.abs(item) >= 2 ** 63 && Math.abs(item) < 1e21 ? "an integer outside the signed 64-bit range" : null;
    case "bigint":
      return "a bigint"; // JSON.stringify throws
    case "undefined":
      return inArray ? "undefined" : null;
    default: // function, symbol
      return inArray ? `a ${typeof item}` : null;
  }
}

/** A value of `params` that JSON cannot carry as it is: a number that is not finite (NaN, ±Infinity:
 * `JSON.stringify` writes `null`) or an integer outside the signed 64-bit range (the host refuses it), a string or a
 * key holding a lone surrogate (written as an escape the host refuses), a bigint (it throws), `undefined`, a function or a symbol in an array (`null`; as
 * a member it is left out, like an absent key, and accepted), a Map, Set, ArrayBuffer or typed array (written `{}`
 * or as an object of indexes); or a container nested deeper than `maxLevel` (the request object being level 1).
 * Null when there is none. An object with a `toJSON` (a Date) is written as that returns, and not looked into. Only a call whose params
 * may hold one looks ({@link encodeParams}): first quickly (`where` false: the first found, no path), then, when one
 * was found, for the first in the order `JSON.stringify` writes, with its path (`where` true). */
function unsendable(params: object, where: boolean, maxLevel: number): Unsendable | null {
  type Entry = { value: unknown; level: number; loc: (string | number)[]; inArray: boolean };
  const values: unknown[] = [params];
  const levels: number[] = [2]; // the request object is level 1, its params level 2
  const traced: Entry[] = where ? [{ value: params, level: 2, loc: [], inArray: false }] : [];
  while (where ? traced.length > 0 : values.length > 0) {
    let value: unknown;
    let level: number;
    let loc: (string | number)[] = [];
    if (where) {
      const entry = traced.pop() as Entry;
      ({ value, level, loc } = entry);
      if (typeof value !== "object" || value === null) {
        const what = unsendableLeaf(value, entry.inArray);
        if (what !== null) return { what, loc, tooDeep: false };
        continue;
      }
    } else {
      value = values.pop();
      level = levels.pop() as number;
    }
    const container = value as { [key: string | number]: unknown };
    if (typeof container.toJSON === "function") continue;
    if (level > maxLevel) return { what: "", loc, tooDeep: true };
    const isArray = Array.isArray(container);
    const opaque = isArray ? null : opaqueName(container);
    if (opaque !== null) return { what: opaque, loc, tooDeep: false };
    const keys: (string | number)[] | null = isArray ? null : Object.keys(container);
    const count = keys === null ? (container as unknown as unknown[]).length : keys.length;
    for (let i = count - 1; i >= 0; i--) { // pushed last to first: the first is looked at first
      const key = keys === null ? i : (keys[i] as string);
      if (typeof key === "string" && LONE_SURROGATE.test(key)) {
        return { what: "a lone surrogate in a key", loc, tooDeep: false };
      }
      const item = container[key];
      if (where) traced.push({ value: item, level: level + 1, loc: [...loc, key], inArray: isArray });
      else if (typeof item === "object" && item !== null) {
        values.push(item);
        levels.push(level + 1);
      } else {
        const what = unsendableLeaf(item, isArray);
        if (what !== null) return { what, loc, tooDeep: false };
      }
    }
  }
  return null;
}

/** Whether the JSON `text` of a request's params (level 2, the request object being level 1) holds a container
 * past {@link MAX_JSON_DEPTH}, which the host refuses. Only a text with that many `[` and `{` (in strings or not)
 * is read through; strings are skipped whole. */
function nestsTooDeep(text: string): boolean {
  const need = MAX_JSON_DEPTH - 1; // the params object is level 2: level MAX_JSON_DEPTH + 1 is this deep in text
  let openings = 0;
  for (const bracket of ["[", "{"]) {
    for (let i = text.indexOf(bracket); i !== -1 && openings <= need; i = text.indexOf(bracket, i + 1)) openings++;
  }
  if (openings <= need) return false;
  let depth = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22) { // a string: on to its closing quote (one with an even run of backslashes before it)
      let end = text.indexOf('"', i + 1);
      for (;;) {
        if (end === -1) return false; // no closing quote: not JSON.stringify's text
        let slashes = 0;
        while (text.charCodeAt(end - 1 - slashes) === 0x5c) slashes++;
        if (slashes % 2 === 0) break;
        end = text.indexOf('"', end + 1);
      }
      i = end;
    } else if (c === 0x5b || c === 0x7b) {
      if (++depth > need) return true;
    } else if (c === 0x5d || c === 0x7d) {
      depth--;
    }
  }
  return false;
}

function tooDeepError(method: string): RpcError {
  return new RpcError(-32700, "PARSE_ERROR",
    `${method}: params nest deeper than ${MAX_JSON_DEPTH} containers (the request object being level 1), which ` +
    "the host refuses; nothing was sent",
    { code: "PARSE_ERROR", retriable: false, maxDepth: MAX_JSON_DEPTH, sent: false });
}

/** `params` as JSON text, or an {@link RpcError} saying why they cannot be sent (`data.sent` false), as the Python
 * client does: `PARSE_ERROR` (`data.maxDepth`) for params nested deeper than the host reads ({@link MAX_JSON_DEPTH}
 * containers, the request object being level 1: {@link nestsTooDeep}), or so deep that `JSON.stringify` cannot
 * write them (a cycle too), and `INVALID_PARAMS` (`data.errors`: where) for what JSON cannot carry
 * ({@link unsendable}). Nothing is sent; the connection, and a mutating call's `submissionId` (never sent), stay
 * as they were. A call whose params encode pays the one `JSON.stringify` every try used to repeat, a look for what
 * it writes without a word (`null`, `{}`, `{"0":`) in the text (only a text holding one has its params looked
 * into), and a count of its brackets (only a text with more than the host's depth of them is read through). */
function encodeParams(method: string, params: object): EncodedParams {
  let text: string | undefined;
  let failure: unknown = null;
  try {
    text = JSON.stringify(params);
  } catch (err) {
    failure = err; // a bigint, a cycle, too deep for the stack; a toJSON or a getter that throws
  }
  if (text !== undefined && nestsTooDeep(text)) throw tooDeepError(method); // written, but the host refuses it
  if (text !== undefined && ((!text.includes("null") && !text.includes("{}") && !text.includes('{"0":')
      && !SUSPECT.test(text))
    || unsendable(params, false, Infinity) === null)) { // written: no cycle, the walk ends
    return new EncodedParams(text);
  }
  // the failure path: what and where; past the host's depth only when JSON.stringify could not write them (a
  // cycle: without a bound the walk would not end)
  const found = unsendable(params, true, text === undefined ? MAX_JSON_DEPTH : Infinity);
  if (found?.tooDeep) throw tooDeepError(method);
  const what = found?.what
    ?? `a value JSON.stringify ${failure === null ? "could not write" : `refused (${String(failure)})`}`;
  const loc = found?.loc ?? [];
  const at = "params" + loc.map((part) => typeof part === "number" ? `[${part}]`
    : /^[A-Za-z_$][A-Za-z0-9_$]*$/.test(part) ? `.${part}` : `[${JSON.stringify(part)}]`).join("");
  throw new RpcError(-32602, "INVALID_PARAMS",
    `${method}: params hold ${what} at ${at}, which JSON cannot carry; nothing was sent`,
    { code: "INVALID_PARAMS", retriable: false, sent: false,
      errors: [{ loc: loc.join("."), msg: `${what}, which JSON cannot carry`, type: "json_invalid" }] });
}

/** The params of `sub`'s `events.subscribe`: its topics, its session's id, the cursor it resumes after. */
function subscribeParams(sub: Subscription): { [key: string]: unknown } {
  const params: { [key: string]: unknown } = { topics: sub.topics };
  if (sub.sessionId !== undefined) params.sessionId = sub.sessionId;
  if (sub.cursor !== null) params.cursor = sub.cursor;
  return params;
}

/** One WebSocket and its requests; it never reconnects itself (the client's one loop does). */
class Connection {
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  hello: HelloResult | null = null;
  readonly done: Promise<{ code: number; reason: string }>;
  private finish!: (how: { code: number; reason: string }) => void;
  isDone = false;
  /** Frames (and pongs) received so far: the keepalive's proof of life. */
  private heard = 0;
  private keepaliveTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(
    readonly ws: WebSocketLike,
    private readonly onNotification: (params: unknown) => void,
  ) {
    this.done = new Promise((resolve) => {
      this.finish = resolve;
    });
  }

  /** Resolves once the socket is open; rejects (once) when it fails first, or when the opening handshake is not
   * done within `timeoutMs` (a host that accepts the TCP connection and answers nothing: stopped, frozen; no
   * WebSocket implementation bounds it by default): the socket is then dropped. */
  open(timeoutMs: number = Infinity): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      let settled = false;
      let detail = "";
      let timer: ReturnType<typeof setTimeout> | undefined;
      if (timeoutMs < Infinity) {
        timer = setTimeout(() => {
          if (settled) return;
          settled = true;
          reject(new OpenFailed(`no WebSocket handshake within ${timeoutMs} ms`, undefined));
          this.close(1006, "opening handshake timed out", true);
        }, Math.min(timeoutMs, MAX_TIMER_MS));
      }
      this.ws.onopen = () => {
        clearTimeout(timer);
        if (!settled) {
          settled = true;
          resolve();
        }
      };
      this.ws.onerror = (ev: { message?: unknown } | null) => {
        // a failed handshake is followed by close; an error after open also ends in close. Keep what went wrong
        // (the ws package says e.g. "connect ECONNREFUSED 127.0.0.1:8470"; browsers say nothing)
        if (typeof ev?.message === "string" && ev.message !== "") detail = ev.message;
      };
      this.ws.onclose = (ev: { code?: number; reason?: string }) => {
        clearTimeout(timer);
        const code = ev?.code ?? 1006;
        const reason = ev?.reason ?? "";
        this.close(code, reason);
        if (!settled) {
          settled = true;
          const why = `${code}${reason ? ` ${reason}` : ""}${detail ? `: ${detail}` : ""}`;
          // what the server answered instead of 101, in the words of the ws package (browsers say nothing)
          const status = /Unexpected server response: (\d+)/.exec(detail);
          const refusal = status ? Number(status[1]) : /^Parse Error/.test(detail) ? null : undefined;
          reject(new OpenFailed(`the connection failed (${why})`, refusal));
        }
      };
      this.ws.onmessage = (ev: { data: unknown }) => {
        this.heard += 1;
        this.route(String(ev.data));
      };
    });
  }

  /** Ping every `intervalMs`; when nothing comes back within `timeoutMs` of a ping (no pong, no frame), the host is
   * gone or frozen with the connection left open: close it, so the calls on it fail over to the reconnect. Only
   * with a WebSocket that can ping (the `ws` package). */
  keepalive(intervalMs: number, timeoutMs: number): void {
    const ws = this.ws;
    if (typeof ws.ping !== "function" || !(intervalMs < Infinity) || this.isDone) return;
    ws.on?.("pong", () => void (this.heard += 1));
    const ping = (): void => {
      if (this.isDone) return;
      const before = this.heard;
      try {
        ws.ping?.();
      } catch {
        return; // closing: the close event ends the connection
      }
      this.keepaliveTimer = setTimeout(() => {
        if (this.isDone) return;
        if (this.heard > before) {
          this.keepaliveTimer = setTimeout(ping, Math.min(intervalMs, MAX_TIMER_MS));
          return;
        }
        this.close(1011, `no answer to a keepalive ping within ${timeoutMs} ms`, true);
      }, Math.min(timeoutMs, MAX_TIMER_MS));
    };
    this.keepaliveTimer = setTimeout(ping, Math.min(intervalMs, MAX_TIMER_MS));
  }

  /** Send one request; `signal` ends the wait for its answer (rejecting with the signal's reason; an answer that
   * comes later is dropped). */
  request<T>(method: string, params: object | EncodedParams, signal?: AbortSignal,
    progress?: { sent: boolean }): Promise<T> {
    if (this.isDone || this.ws.readyState !== OPEN) {
      return Promise.reject(new ConnectionLost("not connected"));
    }
    if (signal?.aborted) return Promise.reject(abortReason(signal));
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      const onAbort = (): void => {
        if (this.pending.delete(id)) reject(abortReason(signal));
      };
      const settled = (): void => signal?.removeEventListener("abort", onAbort);
      this.pending.set(id, {
        resolve: (v) => {
          settled();
          resolve(v as T);
        },
        reject: (err) => {
          settled();
          reject(err);
        },
      });
      signal?.addEventListener("abort", onAbort, { once: true });
      try {
        const frame = params instanceof EncodedParams
          ? `{"jsonrpc":"2.0","id":${id},"method":${JSON.stringify(method)},"params":${params.text}}`
          : JSON.stringify({ jsonrpc: "2.0", id, method, params });
        if (progress !== undefined) progress.sent = true; // from here on, the host may have it
        this.ws.send(frame);
      } catch (err) {
        this.pending.delete(id);
        settled();
        reject(new ConnectionLost(`send failed: ${String(err)}`));
      }
    });
  }

  /** Requests sent and not answered yet (for tests and diagnostics). */
  get inFlight(): number {
    return this.pending.size;
  }

  /** Ends the connection: fails every request in flight (they are retried by `HostClient.call`). `dead`: the peer
   * no longer answers, so drop the socket without waiting for a closing handshake (when the WebSocket can). */
  close(code: number, reason: string, dead = false): void {
    if (this.isDone) return;
    this.isDone = true;
    clearTimeout(this.keepaliveTimer);
    const lost = new ConnectionLost(`connection closed (${code}${reason ? ` ${reason}` : ""})`);
    for (const slot of this.pending.values()) slot.reject(lost);
    this.pending.clear();
    this.finish({ code, reason });
    try {
      if (dead && typeof this.ws.terminate === "function") this.ws.terminate();
      else this.ws.close(1000, "bye");
    } catch {
      // already closing
    }
  }

  private route(frame: string): void {
    let message: unknown;
    try {
      message = JSON.parse(frame);
    } catch {
      return;
    }
    for (const item of Array.isArray(message) ? message : [message]) {
      if (typeof item !== "object" || item === null) continue;
      const obj = item as { [key: string]: unknown };
      if (obj.method === "event" && !("id" in obj)) {
        this.onNotification(obj.params);
        continue;
      }
      const slot = typeof obj.id === "number" ? this.pending.get(obj.id) : undefined;
      if (slot === undefined) continue;
      this.pending.delete(obj.id as number);
      if (obj.error !== undefined) {
        const err = obj.error as { code: number; message: string; data?: { [key: string]: unknown } };
        const data = err.data ?? {};
        slot.reject(new RpcError(err.code, String(data.code ?? "UNKNOWN"), err.message, data));
      } else {
        slot.resolve(obj.result);
      }
    }
  }
}

/** The WebSocket did not open. `refusal`: what the server answered instead of 101, when the implementation says
 * (the `ws` package): an HTTP status, or null for an answer that is not HTTP; undefined when unknown. */
class OpenFailed extends ConnectionLost {
  constructor(
    message: string,
    readonly refusal: number | null | undefined,
  ) {
    super(message);
  }
}

/** Why `signal` aborted: its `reason` (an `AbortError` `DOMException` unless the caller gave one). */
function abortReason(signal: AbortSignal | undefined): unknown {
  return signal?.reason ?? new DOMException("This operation was aborted", "AbortError");
}

/** Options of one call. */
export interface CallOptions {
  /** Ends the call's wait (for a connection, for its answer, between retries): it rejects with the signal's
   * `reason` (an `AbortError` by default) and is not sent again; an answer that comes later is dropped. A mutating
   * call that was already sent may have taken effect: send it again with the same `submissionId` to know. */
  signal?: AbortSignal;
  /** Bound on this call (ms), from its start to its answer, waiting for a connection and retries included (default:
   * the client's `callTimeoutMs`; `Infinity`: none for this call): past it the call rejects with
   * {@link CallTimeout}, which says whether the request was sent and so may have taken effect. */
  timeoutMs?: number;
}

function sleep(ms: number, wake: { cancel: (() => void) | null }): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      wake.cancel = null;
      resolve();
    }, ms);
    wake.cancel = () => {
      clearTimeout(timer);
      wake.cancel = null;
      resolve();
    };
  });
}

export class HostClient {
  private conn: Connection | null = null;
  private readonly subscriptions = new Set<Subscription>();
  private readonly byWireId = new Map<string, Subscription>();
  private readonly attachedOn = new WeakMap<Subscription, Connection>();
  private readonly waiters = new Set<Waiter>();
  private readonly wake: { cancel: (() => void) | null } = { cancel: null };
  private readonly Impl: WebSocketConstructor;
  private closing = false;
  private lastBootId: string | null = null;
  /** Why the client stopped for good, once it has. */
  fatal: ConnectionLost | null = null;
  /** Why the last connection attempt failed, or why the last connection was lost (null: neither happened yet). */
  lastError: Error | null = null;
  /** Connection attempts made so far (one retry chain: they are sequential, spaced by the backoff). */
  attempts = 0;
  /** Successful connections so far. */
  connects = 0;
  hello: HelloResult | null = null;

  private constructor(private readonly options: ConnectOptions) {
    const global = (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    const Impl = options.WebSocketImpl ?? global;
    if (Impl === undefined) {
      throw new TypeError(
        "this runtime has no global WebSocket (Node 20): pass one as WebSocketImpl, e.g. the ws package's",
      );
    }
    this.Impl = Impl;
    const handshake = options.handshakeTimeoutMs;
    if (handshake !== undefined && !(handshake > 0)) {
      throw new RangeError(`handshakeTimeoutMs must be a number of ms > 0 (or Infinity), not ${handshake}`);
    }
    const patience = options.reconnectTimeoutMs;
    if (patience !== undefined && !(patience >= 0)) {
      throw new RangeError(`reconnectTimeoutMs must be a number of ms ≥ 0 (or Infinity), not ${patience}`);
    }
  }

  /** Connect and authenticate with `host.hello`; the client then keeps itself connected until `close()`.
   * Rejects at once with `HostRefused` for a refusal (a bad token or protocol, another error `host.hello` answers
   * that is not retriable, a handshake answered with an HTTP status other than 101 and 503 or not in HTTP), with
   * `HostNotRunning` for any other failure (at once, or after `connectTimeoutMs` with `waitForHost`); a busy host
   * (503, a retriable `host.hello` error) is tried again until `connectTimeoutMs`. The Python client's rule. */
  static connect(options: ConnectOptions): Promise<HostClient> {
    let client: HostClient;
    try {
      client = new HostClient(options);
    } catch (err) {
      return Promise.reject(err);
    }
    const first = client.connection(Infinity); // bounded by connectTimeoutMs below
    void client.run();
    const timeoutMs = options.connectTimeoutMs ?? 30000;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        const error = new HostNotRunning(`no host answered on ${options.url} within ${timeoutMs} ms`);
        client.stop(error);
        reject(error);
      }, timeoutMs);
    });
    return Promise.race([first, timeout]).then(
      () => {
        clearTimeout(timer);
        return client;
      },
      (err: unknown) => {
        clearTimeout(timer);
        throw err;
      },
    );
  }

  get connected(): boolean {
    return this.conn !== null && !this.conn.isDone;
  }

  // -- the one retry chain -------------------------------------------------------------------------------------
  private async run(): Promise<void> {
    const initial = this.options.backoff?.initialMs ?? 250;
    const cap = this.options.backoff?.maxMs ?? 10000;
    const jitter = Math.min(1, Math.max(0, this.options.backoff?.jitter ?? 0.5));
    const reconnect = this.options.reconnect ?? true;
    let delay = initial;
    let attempt = 0; // attempts since the last successful connection
    while (!this.closing) {
      attempt += 1;
      this.attempts += 1;
      let reason: string;
      try {
        this.tell({ state: "connecting", attempt, message: `connecting to ${this.options.url} (attempt ${attempt})` });
        const conn = await this.open();
        delay = initial;
        attempt = 0;
        const how = await conn.done;
        if (this.conn === conn) this.conn = null;
        reason = `the connection closed (${how.code}${how.reason ? ` ${how.reason}` : ""})`;
        this.lastError = new ConnectionLost(reason);
      } catch (err) {
        if (err instanceof HostRefused) {
          this.stop(err);
          return;
        }
        reason = err instanceof Error ? err.message : String(err);
        this.lastError = err instanceof Error ? err : new ConnectionLost(reason);
        // before the first connection, any failure but a busy host's ends the client unless it waits for a host
        const busy = (err instanceof RpcError && err.retriable) || (err instanceof OpenFailed && err.refusal === 503);
        if (this.connects === 0 && !(this.options.waitForHost ?? false) && !busy && !this.closing) {
          this.stop(new HostNotRunning(`no host answers on ${this.options.url}: ${reason}`));
          return;
        }
      }
      if (this.closing) return;
      if (!reconnect) {
        this.stop(new ConnectionLost(reason));
        return;
      }
      const wait = Math.round(delay * (1 - jitter * Math.random()));
      const why = attempt === 0 ? reason : `attempt ${attempt} failed: ${reason}`;
      this.tell({
        state: "waiting",
        attempt,
        delayMs: wait,
        reason,
        message: `waiting for a host on ${this.options.url}: ${why}; next try in ${wait} ms`,
      });
      await sleep(wait, this.wake);
      delay = Math.min(cap, delay * 2);
    }
  }

  /** One attempt: socket, hello, resubscriptions. Throws `HostRefused` for a refusal, `ConnectionLost` else. */
  private async open(): Promise<Connection> {
    const conn = new Connection(new this.Impl(this.options.url), (params) => this.deliver(params));
    try {
      await conn.open(this.options.handshakeTimeoutMs ?? 30000);
    } catch (err) {
      if (this.connects === 0 && err instanceof OpenFailed && err.refusal !== undefined && err.refusal !== 503) {
        const said = err.refusal === null ? "no HTTP answer" : `HTTP ${err.refusal}`;
        throw new HostRefused("HANDSHAKE_REFUSED", `${this.options.url} answered the WebSocket handshake with ${said}`,
          err.refusal);
      }
      throw err;
    }
    conn.keepalive(this.options.keepaliveIntervalMs ?? 20000, this.options.keepaliveTimeoutMs ?? 20000);
    const helloMs = this.options.helloTimeoutMs ?? 10000;
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      const hello = await Promise.race([
        conn.request<HelloResult>("host.hello", {
          token: this.options.token,
          clientId: this.options.clientId,
          clientKind: this.options.clientKind ?? "ui",
          protocol: PROTOCOL_VERSION,
        }),
        new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(new ConnectionLost(`no answer to host.hello within ${helloMs} ms`)), helloMs);
        }),
      ]);
      conn.hello = hello;
      const restarted = this.lastBootId !== null && this.lastBootId !== hello.bootId;
      const resumed: { subscription: Subscription; cursor: number | null }[] = [];
      for (const sub of [...this.subscriptions]) {
        try {
          resumed.push({ subscription: sub, cursor: await this.attach(conn, sub) });
        } catch (err) {
          if (!(err instanceof RpcError)) throw err;
          // the host refuses this one subscription now (e.g. LIMIT_EXCEEDED): drop it, keep the connection
          this.subscriptions.delete(sub);
          sub.closed = true;
          const reason = `the host refused to resubscribe: ${err.message}`;
          this.notify("onResync", () => this.options.onResync?.(sub, reason));
        }
      }
      if (this.closing) throw new ConnectionLost("the client is closed");
      this.lastBootId = hello.bootId;
      this.conn = conn;
      this.hello = hello;
      this.connects += 1;
      if (this.connects === 1) {
        this.tell({ state: "connected", attempt: this.attempts, hello, message: `connected to ${this.options.url}` });
      } else {
        const cursors = resumed.map((r) => r.cursor).filter((c): c is number => c !== null);
        const where = restarted
          ? "the host restarted; subscriptions resynced"
          : cursors.length > 0
            ? `resumed at cursor ${Math.min(...cursors)}`
            : "resubscribed";
        this.tell({
          state: "reconnected",
          attempt: this.attempts,
          hello,
          restarted,
          resumed,
          message: `reconnected; ${where}`,
        });
      }
      for (const waiter of this.waiters) waiter.resolve(conn);
      this.waiters.clear();
      return conn;
    } catch (err) {
      conn.close(1000, "hello failed");
      // refused for good; on the first connection, so is any error retrying cannot fix
      if (err instanceof RpcError &&
          ((REFUSED_HELLO_CODES as readonly string[]).includes(err.dataCode) || (this.connects === 0 && !err.retriable))) {
        throw new HostRefused(err.dataCode, err.message);
      }
      if (err instanceof RpcError) throw err; // retriable (SHUTTING_DOWN): a busy host, tried again
      throw err instanceof ConnectionLost ? err : new ConnectionLost(String(err));
    } finally {
      clearTimeout(timer);
    }
  }

  /** (Re)subscribe `sub` on `conn`; the cursor it resumed at, or null when it started afresh. */
  private async attach(conn: Connection, sub: Subscription): Promise<number | null> {
    const bootId = conn.hello?.bootId ?? "";
    const sameBoot = sub.bootId === null || sub.bootId === bootId;
    let resumeAt: number | null = null;
    if (sub.cursor !== null && sameBoot) {
      resumeAt = sub.cursor;
    } else if (sub.bootId !== null) {
      sub.cursor = null;
      this.notify("onResync", () => this.options.onResync?.(sub, "the host restarted"));
    }
    let result: SubscribeResult;
    try {
      result = await conn.request<SubscribeResult>("events.subscribe",
        encodeParams("events.subscribe", subscribeParams(sub)));
    } catch (err) {
      if (!(err instanceof RpcError && err.dataCode === "CURSOR_EXPIRED")) throw err;
      sub.cursor = null;
      resumeAt = null;
      this.notify("onResync", () => this.options.onResync?.(sub, "the host no longer holds the missed events"));
      result = await conn.request<SubscribeResult>("events.subscribe",
        encodeParams("events.subscribe", subscribeParams(sub)));
    }
    if (sub.wireId !== null) this.byWireId.delete(sub.wireId);
    sub.wireId = result.subscriptionId;
    sub.bootId = bootId;
    this.byWireId.set(result.subscriptionId, sub);
    this.attachedOn.set(sub, conn);
    if (sub.cursor === null) sub.cursor = result.cursor;
    return resumeAt;
  }

  private deliver(params: unknown): void {
    const event = params as AnyEvent;
    const sub = typeof event.subscriptionId === "string" ? this.byWireId.get(event.subscriptionId) : undefined;
    if (sub !== undefined && event.transient !== true) {
      if (sub.cursor !== null && event.cursor <= sub.cursor) return; // already delivered before a reconnect
      sub.cursor = event.cursor;
    }
    this.notify("onEvent", () => this.options.onEvent?.(event, sub));
  }

  private tell(state: ConnectionState): void {
    this.notify("onState", () => this.options.onState?.(state));
  }

  /** Run one of the app's callbacks: what it throws goes to `onCallbackError` (else `console.error`) and never
   * reaches the socket's handler (where it would stop the connection's reading, or end a Node process). */
  private notify(name: CallbackName, callback: () => void): void {
    try {
      callback();
    } catch (err) {
      try {
        if (this.options.onCallbackError) this.options.onCallbackError(err, name);
        else console.error(`pi-host client: ${name} threw`, err);
      } catch {
        // the error reporter itself failed: nothing is left to tell
      }
    }
  }

  /** Stop for good: no more attempts, every waiting call fails with `error`. */
  private stop(error: ConnectionLost | null): void {
    if (this.closing) return;
    this.closing = true;
    if (error !== null) this.fatal = error;
    this.wake.cancel?.();
    const reason = error ?? new ConnectionLost("the client is closed");
    for (const waiter of this.waiters) waiter.reject(reason);
    this.waiters.clear();
    const conn = this.conn;
    this.conn = null;
    conn?.close(1000, "bye");
    this.tell({ state: "closed", error, message: error === null ? "closed" : `stopped: ${error.message}` });
    this.notify("onClose", () => this.options.onClose?.(1000, error === null ? "closed" : error.message));
  }

  /** The live connection, waiting for the retry chain to make one: at most `patienceMs` (default
   * `reconnectTimeoutMs`), then `HostUnavailable`; at most `maxWaitingCalls` callers at once. */
  private connection(patienceMs: number = this.options.reconnectTimeoutMs ?? 30000,
    signal?: AbortSignal): Promise<Connection> {
    if (signal?.aborted) return Promise.reject(abortReason(signal));
    const conn = this.conn;
    if (conn !== null && !conn.isDone) return Promise.resolve(conn);
    if (this.closing) return Promise.reject(this.fatal ?? new ConnectionLost("the client is closed"));
    if (this.waiters.size >= (this.options.maxWaitingCalls ?? 256)) {
      return Promise.reject(new ConnectionLost("not connected, and too many calls are already waiting for the host"));
    }
    return new Promise<Connection>((resolve, reject) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const onAbort = (): void => {
        if (this.waiters.delete(waiter)) waiter.reject(abortReason(signal));
      };
      const waiter: Waiter = {
        resolve: (conn) => {
          clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
          resolve(conn);
        },
        reject: (error) => {
          clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
          reject(error);
        },
      };
      if (patienceMs < Infinity) {
        timer = setTimeout(() => {
          // settled once: a connection made in this same turn has not resolved this waiter yet
          if (!this.waiters.delete(waiter)) return;
          waiter.reject(new HostUnavailable(patienceMs, this.lastError));
        }, Math.min(patienceMs, MAX_TIMER_MS));
      }
      signal?.addEventListener("abort", onAbort, { once: true });
      this.waiters.add(waiter);
    });
  }

  /** Calls waiting for a connection, and requests in flight on the current one (for tests and diagnostics). */
  get pendingCalls(): { waiting: number; inFlight: number } {
    return { waiting: this.waiters.size, inFlight: this.conn?.inFlight ?? 0 };
  }

  // -- calls -----------------------------------------------------------------------------------------------------
  /** Call a routed method; a mutating call gets a fresh submissionId unless one is given, so it is sent again
   * after a lost connection or a retriable error (the host answers the repeat from its receipt). Waiting for a
   * lost connection to come back takes at most `reconnectTimeoutMs`, then the call rejects with `HostUnavailable`.
   * A request in flight ends with its answer, with its connection (the keepalive closes one whose host no longer
   * answers), or with its bound (`options.timeoutMs`, else `callTimeoutMs`; none by default): then it rejects with
   * {@link CallTimeout}. `options.signal` ends the call whenever the caller chooses (see {@link CallOptions}).
   * Params JSON cannot carry as they are (NaN, a bigint, a Map...) reject at once with an {@link RpcError}
   * `INVALID_PARAMS` (`data.sent` false), before anything is sent ({@link encodeParams}). */
  async call<M extends MethodName>(method: M, params: ParamsOf<M>, options: CallOptions = {}): Promise<ResultOf<M>> {
    let sent: object = params;
    const mutating = (MUTATING_METHODS as readonly string[]).includes(method);
    if (mutating && !("submissionId" in params && params.submissionId)) {
      sent = { ...params, submissionId: newSubmissionId() };
    }
    const timeoutMs = options.timeoutMs ?? this.options.callTimeoutMs ?? Infinity;
    if (!(timeoutMs > 0)) throw new RangeError(`timeoutMs must be a number of ms > 0 (or Infinity), not ${timeoutMs}`);
    const encoded = encodeParams(method, sent); // refused here, before any try, when JSON cannot carry them
    const progress = { sent: false };
    if (timeoutMs === Infinity) return this.send(method, encoded, options.signal, progress);
    // one signal for both ends: the caller's abort (its reason) and the bound (a CallTimeout saying how far it got)
    const bounded = new AbortController();
    const outer = options.signal;
    const forward = (): void => bounded.abort(abortReason(outer));
    if (outer?.aborted) forward();
    else outer?.addEventListener("abort", forward, { once: true });
    const timer = setTimeout(() => {
      const key = (sent as { submissionId?: unknown }).submissionId;
      bounded.abort(new CallTimeout(method, timeoutMs, progress.sent, mutating, typeof key === "string" ? key : null));
    }, Math.min(timeoutMs, MAX_TIMER_MS));
    try {
      return await this.send(method, encoded, bounded.signal, progress);
    } finally {
      clearTimeout(timer);
      outer?.removeEventListener("abort", forward);
    }
  }

  /** Send `sent` until it is answered, retrying after a lost connection or a retriable error. */
  private async send<M extends MethodName>(method: M, sent: EncodedParams, signal: AbortSignal | undefined,
    progress: { sent: boolean }): Promise<ResultOf<M>> {
    const maxAttempts = this.options.maxCallAttempts ?? 8;
    let delay = this.options.backoff?.initialMs ?? 250;
    const cap = this.options.backoff?.maxMs ?? 10000;
    for (let attempt = 1; ; attempt++) {
      const conn = await this.connection(undefined, signal);
      try {
        return await conn.request<ResultOf<M>>(method, sent, signal, progress);
      } catch (err) {
        const again =
          attempt < maxAttempts &&
          !this.closing &&
          !signal?.aborted &&
          (err instanceof ConnectionLost || (err instanceof RpcError && err.retriable));
        if (!again) throw err;
        if (err instanceof RpcError) {
          await new Promise<void>((resolve) => {
            const onAbort = (): void => {
              clearTimeout(timer);
              resolve();
            };
            const timer = setTimeout(() => {
              signal?.removeEventListener("abort", onAbort);
              resolve();
            }, delay);
            signal?.addEventListener("abort", onAbort, { once: true });
          });
          delay = Math.min(cap, delay * 2);
        }
      }
    }
  }

  /** Subscribe to topics (optionally one session's, optionally resuming after `cursor`); events arrive through
   * `onEvent`. The subscription is re-established after every reconnect. Topics, a session id or a cursor JSON
   * cannot carry reject at once, before anything is sent or kept, as a call's params do ({@link encodeParams}). */
  async subscribe(topics: Topic[], sessionId?: string, cursor?: number): Promise<Subscription> {
    const sub = new Subscription(topics, sessionId, cursor);
    encodeParams("events.subscribe", subscribeParams(sub));
    this.subscriptions.add(sub);
    for (;;) {
      const conn = await this.connection().catch((err: unknown) => {
        this.subscriptions.delete(sub);
        throw err;
      });
      if (this.attachedOn.get(sub) === conn) return sub; // the reconnect attached it already
      try {
        await this.attach(conn, sub);
        return sub;
      } catch (err) {
        if (!(err instanceof ConnectionLost)) {
          this.subscriptions.delete(sub);
          throw err;
        }
        // lost mid-subscribe: the next connection attaches it
      }
    }
  }

  /** Stop receiving a subscription's events. */
  async unsubscribe(sub: Subscription): Promise<void> {
    sub.closed = true;
    this.subscriptions.delete(sub);
    const wireId = sub.wireId;
    if (wireId === null) return;
    this.byWireId.delete(wireId);
    const conn = this.conn;
    if (conn === null || conn.isDone) return;
    try {
      await conn.request("events.unsubscribe", { subscriptionId: wireId });
    } catch {
      // the connection went away: the subscription went with it
    }
  }

  /** Close the connection and stop reconnecting. */
  close(): void {
    this.stop(null);
  }
}
