// Reference model of the native RadixCache: a plain trie with one node per token (no path
// compression), same budget, LRU and lock semantics, written for clarity rather than speed.

interface TokNode {
  token: number;
  slot: number;
  parent: TokNode | null;
  children: Map<number, TokNode>;
  lock: number;
  stamp: number;
}

/**
 * Semantics mirrored from native/src/radix_cache.h: each match/insert is one clock tick stamped
 * on every node of its path; eviction repeatedly removes the unlocked leaf token with the oldest
 * stamp; insert locks its path while evicting and caches only the leading tokens that fit.
 */
export class RadixCacheRef {
  private readonly root: TokNode = newNode(-1, -1, null);
  private clock = 0;
  private count = 0;
  /** Slots given back (evicted, flushed, or not fitting) since the last takeEvicted(). */
  private evicted: number[] = [];
  hitTokens = 0;
  queriedTokens = 0;

  constructor(readonly budget: number) {}

  /** Longest cached prefix: its length and slots. Touches the path. */
  match(tokens: ArrayLike<number>): { length: number; slots: number[] } {
    const path = this.walk(tokens);
    this.queriedTokens += tokens.length;
    this.hitTokens += path.length;
    return { length: path.length, slots: path.map((n) => n.slot) };
  }

  /**
   * Inserts tokens with slots. `cached`: tokens already there; `held`: length of the cached path
   * afterwards (cached + what fitted).
   */
  insert(tokens: ArrayLike<number>, slots: ArrayLike<number>): { cached: number; held: number } {
    const path = this.walk(tokens);
    const m = path.length;
    const rest = tokens.length - m;
    if (rest > 0 && this.count + rest > this.budget) {
      for (const n of path) n.lock++;
      this.evict(this.count + rest - this.budget);
      for (const n of path) n.lock--;
    }
    const fit = Math.min(rest, Math.max(0, this.budget - this.count));
    let at = path.length > 0 ? path[path.length - 1]! : this.root;
    for (let i = m; i < m + fit; i++) {
      const n = newNode(tokens[i]!, slots[i]!, at);
      n.stamp = this.clock;
      at.children.set(n.token, n);
      at = n;
    }
    this.count += fit;
    for (let i = m + fit; i < tokens.length; i++) this.evicted.push(slots[i]!);
    return { cached: m, held: m + fit };
  }

  /** Adds a lock to every node of the cached path tokens[0..length). */
  lock(tokens: ArrayLike<number>, length: number): void {
    for (const n of this.path(tokens, length)) n.lock++;
  }

  /** Removes a lock from every node of the cached path tokens[0..length). */
  unlock(tokens: ArrayLike<number>, length: number): void {
    const p = this.path(tokens, length);
    if (p.some((n) => n.lock <= 0)) throw new Error("reference: unlock of an unlocked path");
    for (const n of p) n.lock--;
  }

  /** Evicts up to n tokens, oldest unlocked leaf token first. */
  evict(n: number): number {
    let done = 0;
    while (done < n) {
      let best: TokNode | null = null;
      for (const leaf of this.nodes()) {
        if (leaf.children.size === 0 && leaf.lock === 0 && (best === null || leaf.stamp < best.stamp)) {
          best = leaf;
        }
      }
      if (best === null) break;
      best.parent!.children.delete(best.token);
      this.evicted.push(best.slot);
      this.count--;
      done++;
    }
    return done;
  }

  /** Evicts everything unless a lock is held. */
  flush(): boolean {
    const all = this.nodes();
    if (all.some((n) => n.lock > 0)) return false;
    for (const n of all) this.evicted.push(n.slot);
    this.root.children.clear();
    this.count = 0;
    return true;
  }

  size(): number {
    return this.count;
  }

  lockedTokens(): number {
    return this.nodes().filter((n) => n.lock > 0).length;
  }

  /** Drains the given-back slots. */
  takeEvicted(): number[] {
    const e = this.evicted;
    this.evicted = [];
    return e;
  }

  private walk(tokens: ArrayLike<number>): TokNode[] {
    const tick = ++this.clock;
    const path: TokNode[] = [];
    let at = this.root;
    for (let i = 0; i < tokens.length; i++) {
      const next = at.children.get(tokens[i]!);
      if (!next) break;
      next.stamp = tick;
      path.push(next);
      at = next;
    }
    return path;
  }

  private path(tokens: ArrayLike<number>, length: number): TokNode[] {
    const p: TokNode[] = [];
    let at = this.root;
    for (let i = 0; i < length; i++) {
      const next = at.children.get(tokens[i]!);
      if (!next) throw new Error(`reference: path of length ${length} is not cached (stops at ${i})`);
      p.push(next);
      at = next;
    }
    return p;
  }

  private nodes(): TokNode[] {
    const out: TokNode[] = [];
    const stack = [...this.root.children.values()];
    while (stack.length > 0) {
      const n = stack.pop()!;
      out.push(n);
      stack.push(...n.children.values());
    }
    return out;
  }
}

function newNode(token: number, slot: number, parent: TokNode | null): TokNode {
  return { token, slot, parent, children: new Map(), lock: 0, stamp: 0 };
}
