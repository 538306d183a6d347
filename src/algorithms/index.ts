// ooze/algorithms: TypeScript references of the advantage estimators and policy losses. The native
// trainer is tested against these.
export * from "./advantages.ts";
export * from "./losses.ts";
export * from "./value-loss.ts";
export * from "./gae.ts";
