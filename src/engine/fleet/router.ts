// Routing of generation requests over a changing set of engines: round-robin, least-load (power of
// two choices over in-flight counts) and cache-aware (SGLang's router: one approximate radix tree over
// token ids shared by all engines, built from routing decisions, with load-balance thresholds and
// per-engine LRU eviction), plus session affinity by routing key.
import { OozeError } from "../../errors.ts";

/** Routing policy. */
export type RoutingPolicy = "round_robin" | "least_load" | "cache_aware";

/** Options of a Router; defaults are SGLang's launcher defaults. */
export interface RouterOptions {
  policy: RoutingPolicy;
  /** Matched-prefix fraction above which cache_aware routes to the best-matching engine (0.3). */
  cacheThreshold?: number;
  /** Imbalance when max − min > abs (64) and max > rel (1.5) × min. */
  balanceAbsThreshold?: number;
  balanceRelThreshold?: number;
  /** Tokens each engine may hold in the approximate tree before LRU eviction (1 << 20). */
  maxTreeTokens?: number;
  /** Sessions remembered for affinity; the least recently used is forgotten beyond this (100 000). */
  maxSessions?: number;
  /** Random source of least_load's two choices (tests). */
  random?: () => number;
}

/** One routing question. */
export interface RouteRequest {
  inputIds: ArrayLike<number>;
  /** Session id (X-SMG-Routing-Key): the session stays on its engine while that engine is in the set. */
  routingKey?: string;
  /** An engine not to pick while another is in the set (a retry after a failure there). */
  avoid?: string;
}

interface TreeNode {
  /** Token ids on the edge from the parent to this node. */
  edge: Int32Array;
  parent: TreeNode | null;
  children: Map<number, TreeNode>;
  /** Engines that hold this node's prefix → last use (a logical clock). */
  engines: Map<string, number>;
}

const newNode = (edge: Int32Array, parent: TreeNode | null): TreeNode => ({ edge, parent, children: new Map(), engines: new Map() });

/**
 * The approximate prefix tree of the cache-aware policy: one tree over token ids shared by all
 * engines; each node remembers which engines hold it and when they last used it. Invariant: an
 * engine that holds a node holds all its ancestors.
 */
export class ApproxPrefixTree {
  private root = newNode(new Int32Array(0), null);
  private readonly sizes = new SizeIndex();
  private clock = 0;

  /** Tokens attributed to an engine. */
  size(engine: string): number {
    return this.sizes.get(engine);
  }

  /** Counts an engine that holds nothing yet (size 0), so that `smallest` can name it. */
  track(engine: string): void {
    this.sizes.add(engine);
  }

  /**
   * The engine other than `avoid` with the fewest tokens, among those tracked or inserted (the first
   * tracked among equals), or null when there is none; without visiting every engine.
   */
  smallest(avoid?: string): string | null {
    return this.sizes.least(avoid);
  }

  /** For each engine, how many leading tokens of `ids` it holds. */
  match(ids: ArrayLike<number>): Map<string, number> {
    const out = new Map<string, number>();
    const { nodes, depths } = this.path(ids);
    nodes.forEach((n, i) => {
      for (const e of n.engines.keys()) out.set(e, depths[i]!);
    });
    return out;
  }

  /**
   * The engines that hold the longest prefix of `ids` that any engine other than `avoid` holds, and
   * that prefix's length (what `match` gives its best engines), or null when none holds a token.
   * Costs the length of the path, not the number of engines: an engine that holds a node holds its
   * ancestors, so the deepest node held by an engine besides `avoid` answers.
   */
  deepestHeld(ids: ArrayLike<number>, avoid?: string): { engines: ReadonlyMap<string, number>; depth: number } | null {
    const { nodes, depths } = this.path(ids);
    for (let i = nodes.length - 1; i >= 0; i--) {
      const held = nodes[i]!.engines;
      if (held.size > (avoid !== undefined && held.has(avoid) ? 1 : 0)) return { engines: held, depth: depths[i]! };
    }
    return null;
  }

  /** The nodes `ids` runs through (the last one possibly matched in part) and the tokens matched at each. */
  private path(ids: ArrayLike<number>): { nodes: TreeNode[]; depths: number[] } {
    const nodes: TreeNode[] = [];
    const depths: number[] = [];
    let node = this.root;
    let depth = 0;
    while (depth < ids.length) {
      const child = node.children.get(ids[depth]!);
      if (!child) break;
      let k = 0;
      while (k < child.edge.length && depth + k < ids.length && child.edge[k] === ids[depth + k]) k++;
      depth += k;
      nodes.push(child);
      depths.push(depth);
      if (k < child.edge.length) break;
      node = child;
    }
    return { nodes, depths };
  }

  /** Records that `engine` now holds the prefix `ids`. */
  insert(ids: ArrayLike<number>, engine: string): void {
    const now = ++this.clock;
    let node = this.root;
    let depth = 0;
    let added = 0;
    while (depth < ids.length) {
      let child = node.children.get(ids[depth]!);
      if (!child) {
        child = newNode(Int32Array.from(Array.prototype.slice.call(ids, depth) as number[]), node);
        node.children.set(ids[depth]!, child);
      } else {
        let k = 0;
        while (k < child.edge.length && depth + k < ids.length && child.edge[k] === ids[depth + k]) k++;
        if (k < child.edge.length) child = this.split(child, k);
      }
      if (!child.engines.has(engine)) added += child.edge.length;
      child.engines.set(engine, now);
      depth += child.edge.length;
      node = child;
    }
    this.sizes.add(engine);
    if (added > 0) this.sizes.shift(engine, added);
  }

  /** Splits `node`'s edge after k tokens; returns the new upper node. */
  private split(node: TreeNode, k: number): TreeNode {
    const parent = node.parent!;
    const upper = newNode(node.edge.slice(0, k), parent);
    upper.engines = new Map(node.engines);
    parent.children.set(upper.edge[0]!, upper);
    node.edge = node.edge.slice(k);
    node.parent = upper;
    upper.children.set(node.edge[0]!, node);
    return upper;
  }

  /** Evicts `engine`'s least recently used leaves until it holds at most `target` tokens. */
  evict(engine: string, target: number): void {
    if (this.size(engine) <= target) return;
    // Leaves of this engine: nodes it holds where no child is held by it.
    const leaves: TreeNode[] = [];
    const walk = (n: TreeNode) => {
      let childHeld = false;
      for (const c of n.children.values()) {
        if (c.engines.has(engine)) {
          childHeld = true;
          walk(c);
        }
      }
      if (!childHeld && n !== this.root && n.engines.has(engine)) leaves.push(n);
    };
    walk(this.root);
    const heap = new MinHeap<TreeNode>((a, b) => a.engines.get(engine)! - b.engines.get(engine)!);
    for (const l of leaves) heap.push(l);
    while (this.size(engine) > target && heap.size > 0) {
      const n = heap.pop()!;
      this.drop(n, engine);
      const p = n.parent;
      if (p && p !== this.root && p.engines.has(engine) && ![...p.children.values()].some((c) => c.engines.has(engine))) heap.push(p);
    }
  }

  /** Forgets everything `engine` holds. */
  removeEngine(engine: string): void {
    const walk = (n: TreeNode) => {
      for (const c of [...n.children.values()]) if (c.engines.has(engine)) walk(c);
      if (n !== this.root && n.engines.has(engine)) this.drop(n, engine);
    };
    walk(this.root);
    this.sizes.remove(engine);
  }

  private drop(n: TreeNode, engine: string): void {
    n.engines.delete(engine);
    this.sizes.shift(engine, -n.edge.length);
    if (n.engines.size === 0 && n.children.size === 0 && n.parent) n.parent.children.delete(n.edge[0]!);
  }
}

class MinHeap<T> {
  private a: T[] = [];
  constructor(private less: (x: T, y: T) => number) {}
  get size(): number {
    return this.a.length;
  }
  push(x: T): void {
    const a = this.a;
    a.push(x);
    let i = a.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (this.less(a[i]!, a[p]!) >= 0) break;
      [a[i], a[p]] = [a[p]!, a[i]!];
      i = p;
    }
  }
  pop(): T | undefined {
    const a = this.a;
    const top = a[0];
    const last = a.pop();
    if (a.length > 0 && last !== undefined) {
      a[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < a.length && this.less(a[l]!, a[m]!) < 0) m = l;
        if (r < a.length && this.less(a[r]!, a[m]!) < 0) m = r;
        if (m === i) break;
        [a[i], a[m]] = [a[m]!, a[i]!];
        i = m;
      }
    }
    return top;
  }
}

/** An engine's entry in the SizeIndex heap. */
interface SizeEntry {
  readonly engine: string;
  size: number;
  /** When it was added: the order among equal sizes. */
  readonly seq: number;
  /** Its index in the heap. */
  at: number;
}

/**
 * Tokens the prefix tree attributes to each engine, in a binary min-heap by (size, order added), so
 * that the cache-aware policy's "smallest tree" (a new episode's first turn) is found without
 * visiting every engine: at 256 engines an instance that visit was most of a route's cost
 * (docs/experiments/scale.md, Dec 2). A change of size costs log(engines).
 */
class SizeIndex {
  private readonly of = new Map<string, SizeEntry>();
  private readonly heap: SizeEntry[] = [];
  private seq = 0;

  get(e: string): number {
    return this.of.get(e)?.size ?? 0;
  }
  /** Adds an engine at size 0 (no-op if present). */
  add(e: string): void {
    if (this.of.has(e)) return;
    const entry: SizeEntry = { engine: e, size: 0, seq: this.seq++, at: this.heap.length };
    this.of.set(e, entry);
    this.heap.push(entry);
    this.up(entry.at);
  }
  remove(e: string): void {
    const entry = this.of.get(e);
    if (entry === undefined) return;
    this.of.delete(e);
    const last = this.heap.pop()!;
    if (last === entry) return;
    this.heap[entry.at] = last;
    last.at = entry.at;
    this.down(this.up(last.at));
  }
  shift(e: string, delta: number): void {
    const entry = this.of.get(e);
    if (entry === undefined) return;
    entry.size += delta;
    this.down(this.up(entry.at));
  }
  /** The least entry other than `avoid`'s: the root, or else the lesser of its children. */
  least(avoid?: string): string | null {
    const h = this.heap;
    if (h.length === 0) return null;
    if (h[0]!.engine !== avoid) return h[0]!.engine;
    if (h.length === 1) return null;
    if (h.length === 2 || this.less(h[1]!, h[2]!)) return h[1]!.engine;
    return h[2]!.engine;
  }
  private less(a: SizeEntry, b: SizeEntry): boolean {
    return a.size < b.size || (a.size === b.size && a.seq < b.seq);
  }
  private swap(i: number, j: number): void {
    const h = this.heap;
    const a = h[i]!;
    h[i] = h[j]!;
    h[j] = a;
    h[i]!.at = i;
    a.at = j;
  }
  /** Moves the entry at i up while it is less than its parent; returns where it ends. */
  private up(i: number): number {
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!this.less(this.heap[i]!, this.heap[p]!)) break;
      this.swap(i, p);
      i = p;
    }
    return i;
  }
  private down(i: number): void {
    const h = this.heap;
    for (;;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let m = i;
      if (l < h.length && this.less(h[l]!, h[m]!)) m = l;
      if (r < h.length && this.less(h[r]!, h[m]!)) m = r;
      if (m === i) return;
      this.swap(i, m);
      i = m;
    }
  }
}

/**
 * In-flight requests by engine, indexed by count, so that a routing decision finds the least and
 * most loaded engines without visiting every engine: a rollout instance's router holds its share of
 * the fleet (256 engines at 1,024 and four instances), and decisions that visited them all cost
 * 2.9–3.6 times the CPU a route at 1,024 engines that they cost at 32, with the same episodes in
 * flight (`npm run bench -- router --episodes 4096`; 0.9–1.1 times now).
 */
class LoadIndex {
  private readonly of = new Map<string, number>();
  /** Engines with each count (index), in the order they reached it. */
  private readonly at: Set<string>[] = [];
  /** The lowest count with an engine (0 when there is none). */
  private lo = 0;

  get size(): number {
    return this.of.size;
  }
  has(e: string): boolean {
    return this.of.has(e);
  }
  get(e: string): number {
    return this.of.get(e) ?? 0;
  }
  add(e: string): void {
    this.of.set(e, 0);
    this.bucket(0).add(e);
    this.lo = 0;
  }
  remove(e: string): void {
    const n = this.of.get(e);
    if (n === undefined) return;
    this.of.delete(e);
    this.move(e, n, null);
  }
  /** Adds `delta` (±1) to an engine's count, never below 0. */
  shift(e: string, delta: 1 | -1): void {
    const n = this.of.get(e);
    if (n === undefined || n + delta < 0) return;
    this.of.set(e, n + delta);
    this.move(e, n, n + delta);
  }
  /** The least loaded engine other than `avoid` (the first to reach that count among equals). */
  least(avoid?: string): string | undefined {
    for (let n = this.lo; n < this.at.length; n++) for (const e of this.at[n]!) if (e !== avoid) return e;
    return undefined;
  }
  /** The highest count of an engine other than `avoid` (0 when there is none). */
  max(avoid?: string): number {
    for (let n = this.at.length - 1; n >= 0; n--) {
      const b = this.at[n]!;
      if (b.size > (avoid !== undefined && b.has(avoid) ? 1 : 0)) return n;
    }
    return 0;
  }
  private bucket(n: number): Set<string> {
    while (this.at.length <= n) this.at.push(new Set());
    return this.at[n]!;
  }
  private move(e: string, from: number, to: number | null): void {
    this.at[from]!.delete(e);
    if (to !== null) this.bucket(to).add(e);
    while (this.at.length > 1 && this.at[this.at.length - 1]!.size === 0) this.at.pop();
    if (to !== null && to < this.lo) this.lo = to;
    while (this.lo < this.at.length - 1 && this.at[this.lo]!.size === 0) this.lo++;
    if (this.lo >= this.at.length) this.lo = this.at.length - 1;
  }
}

/** Routes requests over a set of engine ids that may change at any time. */
export class Router {
  readonly policy: RoutingPolicy;
  private readonly cacheThreshold: number;
  private readonly absThreshold: number;
  private readonly relThreshold: number;
  private readonly maxTreeTokens: number;
  private readonly maxSessions: number;
  private readonly random: () => number;
  private readonly ids: string[] = [];
  private readonly inflight = new LoadIndex();
  /** Insertion order = recency (re-set on use). */
  private readonly sessions = new Map<string, string>();
  private readonly tree = new ApproxPrefixTree();
  private rr = 0;

  constructor(opts: RouterOptions) {
    this.policy = opts.policy;
    this.cacheThreshold = opts.cacheThreshold ?? 0.3;
    this.absThreshold = opts.balanceAbsThreshold ?? 64;
    this.relThreshold = opts.balanceRelThreshold ?? 1.5;
    this.maxTreeTokens = opts.maxTreeTokens ?? 1 << 20;
    this.maxSessions = opts.maxSessions ?? 100_000;
    this.random = opts.random ?? Math.random;
  }

  /** Engines in the set, in the order they were added (a copy). */
  engines(): string[] {
    return [...this.ids];
  }

  /** How many engines are in the set (without the copy engines() makes: asked once per dispatch). */
  get size(): number {
    return this.ids.length;
  }

  /** Whether engine `id` is in the set. */
  has(id: string): boolean {
    return this.inflight.has(id);
  }

  /** Adds an engine (no-op if present). */
  addEngine(id: string): void {
    if (this.inflight.has(id)) return;
    this.ids.push(id);
    this.inflight.add(id);
    this.tree.track(id);
  }

  /** Removes an engine: its tree entries and the sessions pinned to it are dropped. */
  removeEngine(id: string): void {
    if (!this.inflight.has(id)) return;
    this.ids.splice(this.ids.indexOf(id), 1);
    this.inflight.remove(id);
    this.tree.removeEngine(id);
    for (const [k, v] of this.sessions) if (v === id) this.sessions.delete(k);
  }

  /** In-flight requests the router counts on an engine (0 for unknown engines). */
  load(id: string): number {
    return this.inflight.get(id);
  }

  /** Tokens the approximate tree attributes to an engine. */
  treeSize(id: string): number {
    return this.tree.size(id);
  }

  /**
   * Picks an engine and counts one request in flight on it; call `release(id)` when the request
   * ends. Throws ENGINE_UNAVAILABLE when the set is empty.
   */
  route(req: RouteRequest): string {
    if (this.ids.length === 0) {
      throw new OozeError("ENGINE_UNAVAILABLE", "router: no engines in the set; attach an engine or wait for one to recover", { retryable: true });
    }
    let id: string | undefined;
    // `avoid` counts only while another engine is in the set
    const avoid = req.avoid !== undefined && this.ids.length > 1 && this.inflight.has(req.avoid) ? req.avoid : undefined;
    if (req.routingKey !== undefined) {
      const pinned = this.sessions.get(req.routingKey);
      if (pinned !== undefined && this.inflight.has(pinned) && pinned !== avoid) id = pinned;
    }
    id ??= this.pick(req.inputIds, avoid);
    if (this.policy === "cache_aware") {
      this.tree.insert(req.inputIds, id);
      if (this.tree.size(id) > this.maxTreeTokens) this.tree.evict(id, Math.floor(this.maxTreeTokens * 0.9));
    }
    if (req.routingKey !== undefined) {
      this.sessions.delete(req.routingKey);
      this.sessions.set(req.routingKey, id);
      if (this.sessions.size > this.maxSessions) this.sessions.delete(this.sessions.keys().next().value!);
    }
    this.inflight.shift(id, 1);
    return id;
  }

  /** Ends one in-flight request on an engine. */
  release(id: string): void {
    this.inflight.shift(id, -1);
  }

  /** Forgets a session's affinity. */
  endSession(routingKey: string): void {
    this.sessions.delete(routingKey);
  }

  /** The engines other than `avoid`, in the order they were added (round_robin and least_load index them). */
  private candidates(avoid: string | undefined): readonly string[] {
    return avoid === undefined ? this.ids : this.ids.filter((e) => e !== avoid);
  }

  private pick(ids: ArrayLike<number>, avoid: string | undefined): string {
    switch (this.policy) {
      case "round_robin": {
        const set = this.candidates(avoid);
        return set[this.rr++ % set.length]!;
      }
      case "least_load": {
        const set = this.candidates(avoid);
        if (set.length === 1) return set[0]!;
        const a = Math.floor(this.random() * set.length);
        let b = Math.floor(this.random() * (set.length - 1));
        if (b >= a) b++;
        return this.load(set[b]!) < this.load(set[a]!) ? set[b]! : set[a]!;
      }
      case "cache_aware": {
        // SGLang's rules: imbalance → the least loaded; else the longest matched prefix above the
        // threshold (the least loaded of the engines holding it); else the smallest tree.
        const least = this.inflight.least(avoid)!;
        const max = this.inflight.max(avoid);
        const min = this.load(least);
        if (max - min > this.absThreshold && max > this.relThreshold * min) return least;
        const hit = this.tree.deepestHeld(ids, avoid);
        if (hit !== null && ids.length > 0 && hit.depth / ids.length > this.cacheThreshold) {
          // held by every engine (a shared system prompt): the least loaded of all, without a visit each
          if (hit.engines.size === this.inflight.size) return least;
          let best: string | null = null;
          for (const e of hit.engines.keys()) if (e !== avoid && (best === null || this.load(e) < this.load(best))) best = e;
          return best!;
        }
        return this.tree.smallest(avoid)!;
      }
    }
  }
}
