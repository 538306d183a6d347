// defineActor: checks an actor definition once and returns it typed; the one way actors are declared.
import { OozeError } from "../errors.ts";
import { NAME_SEGMENT } from "../transport/names.ts";
import { resolvePolicy } from "../supervisor/policy.ts";
import type { ActorDefinition } from "./types.ts";

/** Declares an actor: `defineActor<State, Msg>({ name, init, handle, onStop?, messages?, supervision? })`. */
export function defineActor<State, Msg>(def: ActorDefinition<State, Msg>): ActorDefinition<State, Msg> {
  if (!NAME_SEGMENT.test(def.name)) {
    throw new OozeError("CONFIG_INVALID", `actor name '${def.name}' must match ${NAME_SEGMENT} (it becomes a NATS subject token)`);
  }
  if (typeof def.init !== "function" || typeof def.handle !== "function") {
    throw new OozeError("CONFIG_INVALID", `actor '${def.name}' needs init(ctx) and handle(state, msg, ctx) functions`);
  }
  if (def.supervision) resolvePolicy(def.supervision);
  return def;
}
