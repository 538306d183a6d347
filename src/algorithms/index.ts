// ooze/algorithms: TypeScript references of the advantage estimators and policy losses.
// (Reserved; filled by the RL loop.)
export {};
