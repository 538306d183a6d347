// The `ooze` command imports only the module of the command it runs (app/cli/command-table.ts): each
// module there must register exactly the command names the table lists for it, or a command would be
// missing when named (or its name would load the wrong module).
import { Command } from "commander";
import { describe, expect, it } from "vitest";
import { COMMANDS } from "../../app/cli/command-table.ts";

describe("the command table", () => {
  it.each(COMMANDS.map(([names, load]) => [names.join(", "), names, load] as const))("%s: registered by its module, and nothing else", async (_, names, load) => {
    const program = new Command();
    (await load()).register(program);
    expect(program.commands.map((c) => c.name())).toEqual(names);
  });

  it("names each command once", () => {
    const all = COMMANDS.flatMap(([names]) => names);
    expect(new Set(all).size).toBe(all.length);
  });
});
