// The gateway's view of a tokenizer: text → ids with special tokens recognised in the text (the chat
// template writes them as text), ids → text for responses, and the ids that end a turn. Two kinds:
// the embedded model's byte-level tokenizer (src/engine/tokenizer.ts) and a Hugging Face tokenizer
// (tokenizer.json + tokenizer_config.json through @huggingface/tokenizers). Sampled ids are only ever
// decoded for display — token-in/token-out never re-encodes them.
import { readFileSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";
import { OozeError } from "../errors.ts";
import { BOS_ID, decodeBytes, encodeBytes, EOS_ID, PAD_ID } from "../engine/tokenizer.ts";

/** What the gateway needs of a tokenizer. */
export interface ChatTokenizer {
  /** Text → ids; special tokens written in the text (e.g. "<|im_end|>") become their ids; no BOS added. */
  encode(text: string): number[];
  /** Ids → text for the response (special tokens skipped unless `skipSpecial` is false). */
  decode(ids: ArrayLike<number>, skipSpecial?: boolean): string;
  /** Ids that end an assistant turn (EOS and the template's end-of-turn token). */
  readonly stopIds: readonly number[];
  /** The text of each special token id (what the chat template writes for it). */
  readonly specialText: ReadonlyMap<number, string>;
  /** Template variables: bos_token, eos_token (text). */
  readonly bosToken: string;
  readonly eosToken: string;
}

/** The embedded default's byte tokenizer; "<bos>", "<eos>", "<pad>" in text are its special ids. */
export function byteChatTokenizer(): ChatTokenizer {
  const specials: [string, number][] = [
    ["<bos>", BOS_ID],
    ["<eos>", EOS_ID],
    ["<pad>", PAD_ID],
  ];
  const re = /<bos>|<eos>|<pad>/g;
  return {
    encode(text: string): number[] {
      const out: number[] = [];
      let at = 0;
      for (const m of text.matchAll(re)) {
        for (const b of encodeBytes(text.slice(at, m.index))) out.push(b);
        out.push(specials.find(([t]) => t === m[0])![1]);
        at = m.index + m[0].length;
      }
      for (const b of encodeBytes(text.slice(at))) out.push(b);
      return out;
    },
    decode: (ids, skipSpecial = true) => decodeBytes(ids, skipSpecial),
    stopIds: [EOS_ID],
    specialText: new Map(specials.map(([t, id]) => [id, t])),
    bosToken: "<bos>",
    eosToken: "<eos>",
  };
}

/** A token written in tokenizer_config.json: a string or an AddedToken object `{content}`. */
function tokenString(v: unknown): string | null {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof (v as { content?: unknown }).content === "string") return (v as { content: string }).content;
  return null;
}

/** A Hugging Face tokenizer from the parsed tokenizer.json and tokenizer_config.json. */
export function hfChatTokenizer(tokenizerJson: object, tokenizerConfig: Record<string, unknown>, extraStopIds: readonly number[] = []): ChatTokenizer {
  const tok = new Tokenizer(tokenizerJson, tokenizerConfig);
  const specialText = new Map<number, string>();
  for (const [id, t] of tok.get_added_tokens_decoder()) if (t.special) specialText.set(id, t.content);
  const bosToken = tokenString(tokenizerConfig.bos_token) ?? "";
  const eosToken = tokenString(tokenizerConfig.eos_token) ?? "";
  const stop = new Set<number>(extraStopIds);
  const eosId = eosToken ? tok.token_to_id(eosToken) : undefined;
  if (eosId !== undefined) stop.add(eosId);
  return {
    encode: (text) => tok.encode(text, { add_special_tokens: false }).ids,
    // The library refuses an empty list; nothing decodes to nothing.
    decode: (ids, skipSpecial = true) => (ids.length === 0 ? "" : tok.decode(Array.from(ids), { skip_special_tokens: skipSpecial })),
    stopIds: [...stop],
    specialText,
    bosToken,
    eosToken,
  };
}

/** A model directory's tokenizer and chat template (tokenizer.json, tokenizer_config.json, config.json, generation_config.json). */
export interface HfChatModel {
  tokenizer: ChatTokenizer;
  /** The Jinja source of `chat_template`. */
  chatTemplate: string;
}

const MODEL_FILES = ["tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"];
const loaded = new Map<string, { stamp: string; model: HfChatModel }>();

/**
 * Reads a Hugging Face model directory's tokenizer and chat template. The eos_token_id(s) of
 * config.json and generation_config.json also end turns. Errors name the file and the field.
 * Loading a 150k-entry tokenizer.json takes about half a second (Qwen3's 11 MB: 0.07 s to read,
 * 0.19 s to parse, 0.26 s to build the tokenizer), so a directory loaded again with its files
 * unchanged (same sizes and modification times) is served from memory.
 */
export function loadHfChatModel(dir: string): HfChatModel {
  const key = resolve(dir);
  const stamp = MODEL_FILES.map((name) => {
    try {
      const st = statSync(join(dir, name));
      return `${st.size}:${st.mtimeMs}`;
    } catch {
      return "-";
    }
  }).join("|");
  const hit = loaded.get(key);
  if (hit?.stamp === stamp) return { ...hit.model };
  const model = readHfChatModel(dir);
  loaded.set(key, { stamp, model });
  return { ...model };
}

function readHfChatModel(dir: string): HfChatModel {
  const read = (name: string): Record<string, unknown> => {
    const path = join(dir, name);
    let text: string;
    try {
      text = readFileSync(path, "utf8");
    } catch (e) {
      throw new OozeError("CHECKPOINT_INVALID", `${path}: cannot read it (${(e as Error).message}); the gateway needs tokenizer.json and tokenizer_config.json of the model`, { cause: e });
    }
    try {
      return JSON.parse(text) as Record<string, unknown>;
    } catch (e) {
      throw new OozeError("CHECKPOINT_INVALID", `${path}: not valid JSON (${(e as Error).message})`, { cause: e });
    }
  };
  const config = read("tokenizer_config.json");
  let template = config.chat_template;
  if (Array.isArray(template)) template = (template as { name?: string; template?: string }[]).find((t) => t.name === "default")?.template;
  if (typeof template !== "string") {
    throw new OozeError("CHECKPOINT_INVALID", `${join(dir, "tokenizer_config.json")}: field 'chat_template' is missing or not a string; give the gateway a chatTemplate`);
  }
  const extra: number[] = [];
  for (const name of ["config.json", "generation_config.json"]) {
    try {
      const eos = (JSON.parse(readFileSync(join(dir, name), "utf8")) as { eos_token_id?: unknown }).eos_token_id;
      extra.push(...(Array.isArray(eos) ? eos : [eos]).filter((x): x is number => Number.isInteger(x)));
    } catch {
      // optional for the tokenizer
    }
  }
  return { tokenizer: hfChatTokenizer(read("tokenizer.json"), config, extra), chatTemplate: template };
}
