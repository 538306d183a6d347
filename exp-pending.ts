// Experiment (not committed): a nak with delay around a nats-server SIGKILL + restart
import { startNatsServer } from "./src/transport/nats-server.ts";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager, AckPolicy, RetentionPolicy, type JsMsg } from "@nats-io/jetstream";
const variant = process.argv[2] ?? "A";
const s = await startNatsServer({} as never);
const nc = await connect({ servers: s.url, token: s.token, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
const jsm = await jetstreamManager(nc);
await jsm.streams.add({ name: "T", subjects: ["t"], retention: RetentionPolicy.Workqueue });
await jsm.consumers.add("T", { durable_name: "d", ack_policy: AckPolicy.Explicit, ack_wait: 1_000_000_000, max_deliver: -1 });
const js = jetstream(nc);
const c = await js.consumers.get("T", "d");
const got: string[] = [];
let held: JsMsg | null = null;
const iter = await c.consume({ max_messages: 16, idle_heartbeat: 1000, expires: 4000 } as never);
void (async () => { for await (const m of iter) { got.push(`${m.seq}/${m.info.deliveryCount}`); if (m.info.deliveryCount === 1) held = m; } })();
await js.publish("t", new Uint8Array([1]));
await new Promise((r) => setTimeout(r, 300));
if (variant === "A") { held!.nak(100); s.kill("SIGKILL"); await s.waitExit(); }
if (variant === "B") { s.kill("SIGKILL"); await s.waitExit(); held!.nak(100); }
if (variant === "C") { held!.nak(100); await new Promise((r) => setTimeout(r, 50)); s.kill("SIGKILL"); await s.waitExit(); }
await new Promise((r) => setTimeout(r, 400));
await s.restart();
await new Promise((r) => setTimeout(r, 6000));
console.log(variant, "deliveries:", got.join(" "));
const info = await jsm.consumers.info("T", "d");
console.log("ackPending", info.num_ack_pending, "pending", info.num_pending, "waiting", info.num_waiting, "delivered", info.delivered.consumer_seq, "floor", info.ack_floor.consumer_seq, "redelivered", info.num_redelivered);
await nc.close(); await s.stop(); process.exit(0);
