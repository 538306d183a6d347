// Public API of ooze. Everything not exported here is internal.
export * from "./errors.ts";
export { jobNames } from "./transport/names.ts";
