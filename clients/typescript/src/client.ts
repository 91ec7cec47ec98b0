// A small typed JSON-RPC client for pi-host over a WebSocket (browser or any runtime with a
// WHATWG WebSocket). Hand-written; the types come from the generated ./protocol.ts.
import {
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
  }
  get retriable(): boolean {
    return (RETRIABLE_CODES as readonly string[]).includes(this.dataCode);
  }
}

export interface ConnectOptions {
  url: string;
  /** The contents of host.token with the trailing newline stripped (64 hex characters). */
  token: string;
  clientId: string;
  clientKind?: "ui" | "agent" | "cli" | "test";
  /** Called for every `event` notification. */
  onEvent?: (event: AnyEvent) => void;
  /** Called once when the connection closes. */
  onClose?: (code: number, reason: string) => void;
  /** A WebSocket constructor (defaults to the global one). */
  WebSocketImpl?: typeof WebSocket;
}

type Pending = { resolve: (value: unknown) => void; reject: (error: unknown) => void };

function newSubmissionId(): string {
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export class HostClient {
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  hello: HelloResult | null = null;

  private constructor(
    private readonly ws: WebSocket,
    private readonly options: ConnectOptions,
  ) {}

  /** Open the WebSocket and authenticate with `host.hello`. */
  static connect(options: ConnectOptions): Promise<HostClient> {
    const Impl = options.WebSocketImpl ?? WebSocket;
    const ws = new Impl(options.url);
    const client = new HostClient(ws, options);
    return new Promise((resolve, reject) => {
      ws.onerror = () => reject(new Error(`cannot connect to ${options.url}`));
      ws.onclose = (ev) => {
        client.failAll(new Error(`connection closed (${ev.code} ${ev.reason})`));
        options.onClose?.(ev.code, ev.reason);
      };
      ws.onmessage = (ev) => client.route(String(ev.data));
      ws.onopen = () => {
        client
          .request<HelloResult>("host.hello", {
            token: options.token,
            clientId: options.clientId,
            clientKind: options.clientKind ?? "ui",
            protocol: PROTOCOL_VERSION,
          })
          .then((hello) => {
            client.hello = hello;
            resolve(client);
          }, reject);
      };
    });
  }

  /** Call a routed method; a mutating call gets a fresh submissionId unless one is given. */
  call<M extends MethodName>(method: M, params: ParamsOf<M>): Promise<ResultOf<M>> {
    let sent: object = params;
    if ((MUTATING_METHODS as readonly string[]).includes(method) && !("submissionId" in params && params.submissionId)) {
      sent = { ...params, submissionId: newSubmissionId() };
    }
    return this.request<ResultOf<M>>(method, sent);
  }

  /** Subscribe to topics (optionally one session's); events arrive through `onEvent`. */
  subscribe(topics: Topic[], sessionId?: string, cursor?: number): Promise<SubscribeResult> {
    const params: { [key: string]: unknown } = { topics };
    if (sessionId !== undefined) params.sessionId = sessionId;
    if (cursor !== undefined) params.cursor = cursor;
    return this.request<SubscribeResult>("events.subscribe", params);
  }

  close(): void {
    this.ws.close(1000, "bye");
  }

  private request<T>(method: string, params: object): Promise<T> {
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve: (v) => resolve(v as T), reject });
      this.ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    });
  }

  private route(frame: string): void {
    const message: unknown = JSON.parse(frame);
    for (const item of Array.isArray(message) ? message : [message]) {
      if (typeof item !== "object" || item === null) continue;
      const obj = item as { [key: string]: unknown };
      if (obj.method === "event" && !("id" in obj)) {
        this.options.onEvent?.(obj.params as AnyEvent);
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

  private failAll(error: Error): void {
    for (const slot of this.pending.values()) slot.reject(error);
    this.pending.clear();
  }
}
