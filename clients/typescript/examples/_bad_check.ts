import type { ResultOf, UiMessage } from "../src/protocol.js";
export function f(r: ResultOf<"session.get">, m: UiMessage): number {
  return r.messages.length + m.positionThatDoesNotExist;
}
