// Type-level check that the topology's actor specs can be passed to startActors as they are.
import { expect, it } from "vitest";
import type { ActorSpecInput } from "../../src/actor/index.ts";
import type { ActorSpec, Topology } from "../../src/topology/schema.ts";

it("topology actor specs are ActorSpecInputs", () => {
  const spec: ActorSpec = { name: "a", kind: "k", count: 2, config: {}, durable: true };
  const asInput: ActorSpecInput = spec;
  const all: readonly ActorSpecInput[] = [] as Topology["actors"];
  expect(asInput.count).toBe(2);
  expect(all).toEqual([]);
});
