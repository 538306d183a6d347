// `ooze check FILE`: validates a topology file and prints a summary (actors by host).
import type { Command } from "commander";
import { hostOf, loadTopology } from "../../../src/topology/load.ts";

export function register(program: Command) {
  program
    .command("check")
    .description("validate a topology file and show where each actor runs")
    .argument("<file>", "topology YAML file")
    .action((file: string) => {
      const topo = loadTopology(file);
      console.log(`${file}: topology '${topo.name}' is valid`);
      for (const host of topo.hosts) {
        const actors = topo.actors.filter((a) => hostOf(topo, a) === host.name);
        console.log(`  host ${host.name} (${host.start}): ${actors.map((a) => `${a.name}×${a.count} [${a.kind}]`).join(", ") || "(no actors)"}`);
      }
    });
}
