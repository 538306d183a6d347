// The TypeScript reference of native/src/loss.cc is the public one in src/algorithms/losses.ts
// (exported as ooze/algorithms); re-exported here beside the other kernel references.
export * from "../../src/algorithms/losses.ts";
