// Unit: the reason recorded for a failed agent episode is the line of its stderr that says why: an
// error's line, else the last line with a message, never a bare program prefix left by processes killed
// mid-write (the fork bomb of sandbox-hostile.test.ts once recorded only "sh: 1:", and once "sh: 1: sh: 1: sh: 1:").
import { describe, expect, it } from "vitest";
import { errorLine } from "../../actors/environment/agent/episode.ts";

describe("errorLine", () => {
  it("takes the first line naming an error, else the last line with a message", () => {
    expect(errorLine("at foo\nTypeError: x is not a function\n    at bar\n")).toBe("TypeError: x is not a function");
    expect(errorLine("starting\ncat: /tmp/x: No such file or directory\n")).toBe("cat: /tmp/x: No such file or directory");
    expect(errorLine("")).toBe("");
  });

  it("passes over fragments that are only a program's prefix, as interleaved shells leave them", () => {
    const stderr = "sh: 1: sh: 1: Cannot fork\nCannot fork\nsh: 1: Cannot fork\nsh: 1: \nsh: 1:";
    expect(errorLine(stderr)).toBe("sh: 1: Cannot fork");
    expect(errorLine("sh: 1: kill: No such process\n")).toBe("sh: 1: kill: No such process");
    expect(errorLine("Killed\n")).toBe("Killed");
    expect(errorLine("sh: 1:\n")).toBe("");
    // a fresh-clone run's fork bomb (Nov 30): several shells' prefixes run together on the last line
    expect(errorLine("sh: 1: Cannot fork\nsh: 1: sh: 1: sh: 1:\n")).toBe("sh: 1: Cannot fork");
    expect(errorLine("sh: 1: sh: 1: sh: 1:")).toBe("");
  });

  it("keeps a long line to 300 characters", () => {
    expect(errorLine(`Error: ${"x".repeat(1000)}`)).toHaveLength(300);
  });
});
