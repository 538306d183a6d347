// The agent gateway's public entry: OpenAI- and Anthropic-compatible endpoints per episode over the
// fleet, token-in/token-out with trajectory merging and splitting.
export { Gateway, WEIGHT_VERSION_HEADER, type GatewayOptions, type OpenedSession } from "./server.ts";
export type { Generator, SessionReport, SessionSettings } from "./session.ts";
export { GatewayError, type GatewayErrorKind } from "./errors.ts";
export { BuiltinChatTemplate, JinjaChatTemplate, type ChatTemplate } from "./template.ts";
export { detectReplyFormat, parseReply, parseToolCalls, ReplyFormat, type ParsedReply, type ReplyFormatSpec, type ReplyPlan, type ToolCallSyntax } from "./reply-format.ts";
export { byteChatTokenizer, hfChatTokenizer, loadHfChatModel, type ChatTokenizer, type HfChatModel } from "./tokenizer.ts";
export { assistantKey, parseAnthropicRequest, parseOpenAIRequest, type ChatMessage, type ChatRequest, type ToolChoice, type ToolSpec } from "./messages.ts";
