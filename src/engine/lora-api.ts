// SGLang's LoRA API on the engine server: POST /load_lora_adapter {lora_name, lora_path} and
// POST /unload_lora_adapter {lora_name} answering {success, error_message, loaded_adapters} (400 when
// success is false), the check of /generate's `lora_path` names, and the adapters for /server_info.
import { z } from "zod";
import type { BackendLoraAdapter, InferenceBackend } from "./backend.ts";
import { badRequestBody } from "./protocol.ts";

/** The body of /load_lora_adapter and /unload_lora_adapter answers. */
export interface WireLoraUpdateResult {
  success: boolean;
  error_message: string;
  /** Adapter name → the path it was loaded from, after the update. */
  loaded_adapters: Record<string, string>;
}

const loadSchema = z.looseObject({
  lora_name: z.string("lora_name is required (the name requests give as lora_path)").min(1, "lora_name must not be empty"),
  lora_path: z.string("lora_path is required (a PEFT adapter directory, or a model directory of the base's architecture)").min(1, "lora_path must not be empty"),
  pinned: z.boolean().nullable().optional(),
  /** ooze: swap a loaded adapter of this name in place (SGLang refuses a loaded name). */
  replace: z.boolean().nullable().optional(),
});
const unloadSchema = z.looseObject({
  lora_name: z.string("lora_name is required").min(1, "lora_name must not be empty"),
});

const NOT_ENABLED = "LoRA is not enabled: this engine serves the base model only and cannot load or serve adapters";

function issue(err: z.ZodError): string {
  const i = err.issues[0];
  return i ? `${i.path.join(".") || "body"}: ${i.message}` : "invalid request";
}

function loadedNames(adapters: BackendLoraAdapter[]): string {
  return adapters.length === 0 ? "no adapters are loaded" : `loaded: ${adapters.map((a) => a.name).join(", ")}`;
}

/** The handlers of SGLang's LoRA endpoints over one backend; updates run one at a time. */
export function loraApi(backend: InferenceBackend) {
  let chain: Promise<unknown> = Promise.resolve();
  const serial = <T>(fn: () => Promise<T>): Promise<T> => {
    const run = chain.then(fn, fn);
    chain = run.catch(() => undefined);
    return run;
  };
  const loaded = (): Record<string, string> => Object.fromEntries((backend.lora?.list() ?? []).map((a) => [a.name, a.path]));
  const result = (error: string | null): [number, WireLoraUpdateResult] => [
    error === null ? 200 : 400,
    { success: error === null, error_message: error ?? "", loaded_adapters: loaded() },
  ];

  return {
    /** POST /load_lora_adapter. */
    load(body: unknown): Promise<[number, unknown]> {
      const p = loadSchema.safeParse(body);
      if (!p.success) return Promise.resolve([400, badRequestBody(issue(p.error))]);
      const { lora_name: name, lora_path: path, replace } = p.data;
      return serial(async () => {
        const lora = backend.lora;
        if (!lora) return result(NOT_ENABLED);
        const existing = lora.list().find((a) => a.name === name);
        if (existing && !replace)
          return result(`LoRA adapter '${name}' is already loaded (from ${existing.path}); unload it first, or send "replace": true to swap it in (running requests keep the old one)`);
        try {
          await lora.load(name, path);
          return result(null);
        } catch (e) {
          return result(e instanceof Error ? e.message : String(e));
        }
      });
    },

    /** POST /unload_lora_adapter. Requests running under the adapter finish with it. */
    unload(body: unknown): Promise<[number, unknown]> {
      const p = unloadSchema.safeParse(body);
      if (!p.success) return Promise.resolve([400, badRequestBody(issue(p.error))]);
      const name = p.data.lora_name;
      return serial(async () => {
        const lora = backend.lora;
        if (!lora) return result(NOT_ENABLED);
        const before = lora.list();
        if (!lora.unload(name)) return result(`LoRA adapter '${name}' is not loaded (${loadedNames(before)})`);
        return result(null);
      });
    },

    /** Why /generate cannot serve these `lora_path` names (the first that fails), or null. */
    refusal(names: readonly (string | null)[]): string | null {
      const wanted = names.filter((n): n is string => n !== null);
      if (wanted.length === 0) return null;
      const lora = backend.lora;
      if (!lora) return `lora_path: ${NOT_ENABLED} (asked for '${wanted[0]}')`;
      const adapters = lora.list();
      const missing = [...new Set(wanted.filter((n) => !adapters.some((a) => a.name === n)))];
      if (missing.length === 0) return null;
      return `lora_path: LoRA adapter${missing.length > 1 ? "s" : ""} ${missing.map((n) => `'${n}'`).join(", ")} not loaded (${loadedNames(adapters)}); load with POST /load_lora_adapter`;
    },

    /** The /server_info fields: whether adapters can be served, and those loaded. */
    info(): { enable_lora: boolean; lora_adapters: BackendLoraAdapter[] } {
      return { enable_lora: backend.lora != null, lora_adapters: backend.lora?.list() ?? [] };
    },
  };
}
