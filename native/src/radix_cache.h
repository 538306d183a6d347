// Radix-tree prefix cache over token ids for the inference engine's KV cache: each cached token owns
// one KV slot id; longest-prefix match, insert with a token budget, LRU eviction of unlocked leaves
// (token-granular: a leaf is trimmed from its tail), lock counts on paths, and hit accounting.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace ooze {

/**
 * A radix tree mapping token-id prefixes to the KV slot ids that hold their keys/values.
 *
 * Ownership of slots: the cache owns the slot of every token it holds. `insert(tokens, slots, n)`
 * returns m, the number of leading tokens that were already cached: the caller keeps (and frees)
 * its own slots[0..m). Slots[m..n) pass to the cache; those it cannot hold within the budget are
 * handed back at once through `on_evict`, the rest later when they are evicted or flushed. Every
 * slot handed to `insert` thus comes back exactly once: to the caller (prefix) or via `on_evict`.
 *
 * Budget: `size() <= budget()` always. Insert first evicts unlocked LRU leaves (never the path it
 * inserts on); if it still cannot fit, it caches only the leading tokens that fit.
 *
 * Eviction order: the least recently used unlocked leaf loses its last token, repeatedly (a whole
 * node goes when all its tokens go, and its parent may then become a leaf). "Used" means touched
 * by `match` or `insert` (each call is one tick of a logical clock; every node on its path gets
 * that tick). Locked nodes (lock count > 0) are never evicted.
 *
 * NodeIds: `match` ends on a node boundary (it splits a node if needed) and returns that node;
 * lock it right away if it must stay (an unlocked node may be trimmed or freed by a later insert or
 * evict, and freed ids are reused). A split keeps a node's id on its lower part, so a locked id
 * always names the same path. Not thread-safe: one engine thread owns a cache.
 */
class RadixCache {
 public:
  using NodeId = int32_t;  // 0 = root
  using EvictFn = std::function<void(const int32_t* slots, size_t n)>;  // gives back KV slot ids

  RadixCache(size_t budget_tokens, EvictFn on_evict);

  struct Match {
    size_t length;               // cached prefix length
    std::vector<int32_t> slots;  // its slot ids, one per token
    NodeId node;                 // the node the prefix ends on (0 = root when length is 0)
  };

  /** Longest cached prefix of tokens[0..n); touches its path (LRU); may split a node. */
  Match match(const int32_t* tokens, size_t n);

  /**
   * Caches tokens[0..n) with their slots. Returns how many leading tokens were already cached
   * (the caller frees its own slots for those). Evicts to stay within the budget; caches only
   * what fits. If `node_out` is given, it receives the node the cached part of the sequence ends
   * on (lock it to pin the sequence).
   */
  size_t insert(const int32_t* tokens, const int32_t* slots, size_t n, NodeId* node_out = nullptr);

  /** Adds one lock on every node of the path root..node. Throws std::invalid_argument on a bad id. */
  void lock(NodeId node);
  /** Removes one lock from the path root..node. Throws std::logic_error if it was not locked. */
  void unlock(NodeId node);

  /** Evicts up to n_tokens tokens, LRU unlocked leaves first; returns tokens evicted. */
  size_t evict(size_t n_tokens);
  /** Evicts everything. Returns false (and flushes nothing) if any lock is held. */
  bool flush();

  /** Tokens cached. */
  size_t size() const { return size_; }
  /** The token budget. */
  size_t budget() const { return budget_; }
  /** Tokens on nodes with a lock count > 0. */
  size_t locked_tokens() const { return locked_tokens_; }
  /** Sum over match() calls of the matched length. */
  uint64_t hit_tokens() const { return hit_tokens_; }
  /** Sum over match() calls of the query length. */
  uint64_t queried_tokens() const { return queried_tokens_; }
  /** Live nodes, the root included. */
  size_t node_count() const { return nodes_.size() - free_.size(); }

  /** Checks every structural invariant; returns "" when sound, else what is wrong (for tests). */
  std::string validate() const;

 private:
  struct Node {
    NodeId parent = -1;
    std::vector<int32_t> key;    // tokens on the edge into this node
    std::vector<int32_t> slots;  // one per key token
    std::unordered_map<int32_t, NodeId> children;  // first token of child key -> child
    int32_t lock = 0;
    uint64_t stamp = 0;  // last tick that touched this node
    bool live = false;
  };

  NodeId new_node();
  void free_node(NodeId id);
  NodeId split(NodeId id, size_t at);  // keeps id on the lower part; returns the new upper part
  // Walks the longest prefix, splitting at a partial edge; touches the path; returns the end node
  // and sets *matched.
  NodeId walk(const int32_t* tokens, size_t n, size_t* matched, std::vector<int32_t>* slots_out);
  void check_id(NodeId id, const char* what) const;
  void give_back(const int32_t* slots, size_t n);

  size_t budget_;
  EvictFn on_evict_;
  std::vector<Node> nodes_;
  std::vector<NodeId> free_;
  size_t size_ = 0;
  size_t locked_tokens_ = 0;
  uint64_t clock_ = 0;
  uint64_t hit_tokens_ = 0;
  uint64_t queried_tokens_ = 0;
};

}  // namespace ooze
