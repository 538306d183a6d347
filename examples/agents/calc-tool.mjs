// The calculator tool the example agents offer the model, and their stdin reader. The tool
// evaluates +, -, * over integers (no eval) and replies `result=938`, or "error" for anything else.

/** The tool's name, description and JSON-schema parameters (kept short: the byte-level model reads them in every prompt). */
export const TOOL = {
  name: "calc",
  description: "arithmetic",
  parameters: { type: "object", properties: { expression: { type: "string" } }, required: ["expression"] },
};

/** Evaluates an integer expression of + - * (left to right with * first); "error" when it is not one. */
export function calc(expr) {
  if (typeof expr !== "string" || !/^\s*\d+(\s*[-+*]\s*\d+)*\s*$/.test(expr)) return "error";
  const terms = expr.replace(/\s+/g, "").match(/[-+]?[^-+]+/g) ?? [];
  let sum = 0;
  for (const t of terms) sum += t.split("*").reduce((p, f) => p * Number(f), 1);
  return String(sum);
}

/**
 * The tool's reply to a call: `result=938` ("error" when the expression is not one). The answer the
 * model is taught to give has the same form, so a byte-level model finds the number to repeat by
 * the bytes before it (`t=`), the way it finds the expression it copies into the call.
 */
export function calcTool(expr) {
  const v = calc(expr);
  return v === "error" ? v : `result=${v}`;
}

/** All of stdin as text. */
export async function readStdin() {
  let s = "";
  for await (const chunk of process.stdin) s += chunk;
  return s;
}
