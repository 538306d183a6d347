#!/usr/bin/env node
// The `ooze` command: registers the TypeScript loader, then runs the CLI.
import { register } from "tsx/esm/api";
register();
await import("../app/cli/main.ts");
