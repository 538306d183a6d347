// Radix-tree prefix cache (see radix_cache.h): nodes in one vector with a free list, children keyed
// by their first token, a logical clock for LRU, and a min-heap of unlocked leaves for eviction.
#include "radix_cache.h"

#include <algorithm>
#include <queue>
#include <stdexcept>
#include <utility>

namespace ooze {

RadixCache::RadixCache(size_t budget_tokens, EvictFn on_evict)
    : budget_(budget_tokens), on_evict_(std::move(on_evict)) {
  nodes_.emplace_back();
  nodes_[0].live = true;
}

RadixCache::NodeId RadixCache::new_node() {
  NodeId id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
    nodes_[id] = Node();
  } else {
    id = static_cast<NodeId>(nodes_.size());
    nodes_.emplace_back();
  }
  nodes_[id].live = true;
  return id;
}

void RadixCache::free_node(NodeId id) {
  nodes_[id] = Node();
  free_.push_back(id);
}

void RadixCache::give_back(const int32_t* slots, size_t n) {
  if (n > 0 && on_evict_) on_evict_(slots, n);
}

void RadixCache::check_id(NodeId id, const char* what) const {
  if (id < 0 || static_cast<size_t>(id) >= nodes_.size() || !nodes_[id].live) {
    throw std::invalid_argument(std::string("RadixCache::") + what + ": node " +
                                std::to_string(id) + " does not exist (evicted or never returned)");
  }
}

RadixCache::NodeId RadixCache::split(NodeId id, size_t at) {
  NodeId up = new_node();  // may reallocate nodes_: take references only after this
  Node& x = nodes_[id];
  Node& p = nodes_[up];
  p.parent = x.parent;
  p.key.assign(x.key.begin(), x.key.begin() + at);
  p.slots.assign(x.slots.begin(), x.slots.begin() + at);
  p.lock = x.lock;
  p.stamp = x.stamp;
  x.key.erase(x.key.begin(), x.key.begin() + at);
  x.slots.erase(x.slots.begin(), x.slots.begin() + at);
  x.parent = up;
  p.children.emplace(x.key[0], id);
  nodes_[p.parent].children[p.key[0]] = up;
  return up;
}

RadixCache::NodeId RadixCache::walk(const int32_t* tokens, size_t n, size_t* matched,
                                    std::vector<int32_t>* slots_out) {
  const uint64_t tick = ++clock_;
  NodeId cur = 0;
  size_t pos = 0;
  while (pos < n) {
    auto it = nodes_[cur].children.find(tokens[pos]);
    if (it == nodes_[cur].children.end()) break;
    NodeId c = it->second;
    const std::vector<int32_t>& key = nodes_[c].key;
    const size_t lim = std::min(key.size(), n - pos);
    size_t k = 1;
    while (k < lim && key[k] == tokens[pos + k]) ++k;
    if (k < key.size()) c = split(c, k);
    Node& node = nodes_[c];
    if (slots_out) slots_out->insert(slots_out->end(), node.slots.begin(), node.slots.end());
    node.stamp = tick;
    pos += k;
    cur = c;
    if (k < lim || pos == n) break;
  }
  *matched = pos;
  return cur;
}

RadixCache::Match RadixCache::match(const int32_t* tokens, size_t n) {
  Match m{0, {}, 0};
  m.node = walk(tokens, n, &m.length, &m.slots);
  queried_tokens_ += n;
  hit_tokens_ += m.length;
  return m;
}

size_t RadixCache::insert(const int32_t* tokens, const int32_t* slots, size_t n, NodeId* node_out) {
  size_t m = 0;
  NodeId at = walk(tokens, n, &m, nullptr);
  const size_t rest = n - m;
  size_t fit = rest;
  if (rest > 0 && size_ + rest > budget_) {
    // Keep the path we attach to: lock it while evicting.
    lock(at);
    evict(size_ + rest - budget_);
    unlock(at);
    fit = std::min(rest, budget_ - std::min(budget_, size_));
  }
  if (fit > 0) {
    NodeId leaf = new_node();
    Node& l = nodes_[leaf];
    l.parent = at;
    l.key.assign(tokens + m, tokens + m + fit);
    l.slots.assign(slots + m, slots + m + fit);
    l.stamp = clock_;
    nodes_[at].children.emplace(tokens[m], leaf);
    size_ += fit;
    at = leaf;
  }
  give_back(slots + m + fit, rest - fit);
  if (node_out) *node_out = at;
  return m;
}

void RadixCache::lock(NodeId node) {
  check_id(node, "lock");
  for (NodeId id = node; id != 0; id = nodes_[id].parent) {
    Node& x = nodes_[id];
    if (x.lock++ == 0) locked_tokens_ += x.key.size();
  }
}

void RadixCache::unlock(NodeId node) {
  check_id(node, "unlock");
  for (NodeId id = node; id != 0; id = nodes_[id].parent) {
    if (nodes_[id].lock <= 0) {
      throw std::logic_error("RadixCache::unlock: node " + std::to_string(node) +
                             " is not locked (unlock without a matching lock)");
    }
  }
  for (NodeId id = node; id != 0; id = nodes_[id].parent) {
    Node& x = nodes_[id];
    if (--x.lock == 0) locked_tokens_ -= x.key.size();
  }
}

size_t RadixCache::evict(size_t n_tokens) {
  if (n_tokens == 0 || size_ == locked_tokens_) return 0;
  using Entry = std::pair<uint64_t, NodeId>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (size_t i = 1; i < nodes_.size(); ++i) {
    const Node& x = nodes_[i];
    if (x.live && x.lock == 0 && x.children.empty()) heap.emplace(x.stamp, static_cast<NodeId>(i));
  }
  size_t done = 0;
  while (done < n_tokens && !heap.empty()) {
    NodeId id = heap.top().second;
    heap.pop();
    Node& x = nodes_[id];
    const size_t take = std::min(n_tokens - done, x.key.size());
    const size_t keep = x.key.size() - take;
    give_back(x.slots.data() + keep, take);
    done += take;
    size_ -= take;
    if (keep > 0) {
      x.key.resize(keep);
      x.slots.resize(keep);
      break;  // only the last leaf taken can be partial: the request is met
    }
    NodeId parent = x.parent;
    nodes_[parent].children.erase(x.key[0]);
    free_node(id);
    const Node& p = nodes_[parent];
    if (parent != 0 && p.lock == 0 && p.children.empty()) heap.emplace(p.stamp, parent);
  }
  return done;
}

bool RadixCache::flush() {
  if (locked_tokens_ > 0) return false;
  std::vector<int32_t> all;
  all.reserve(size_);
  for (size_t i = 1; i < nodes_.size(); ++i) {
    if (nodes_[i].live) all.insert(all.end(), nodes_[i].slots.begin(), nodes_[i].slots.end());
  }
  nodes_.resize(1);
  nodes_[0].children.clear();
  free_.clear();
  size_ = 0;
  give_back(all.data(), all.size());
  return true;
}

std::string RadixCache::validate() const {
  size_t total = 0, locked = 0;
  if (!nodes_[0].live || !nodes_[0].key.empty()) return "root is not live or has a key";
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& x = nodes_[i];
    const std::string at = "node " + std::to_string(i) + ": ";
    if (!x.live) {
      if (std::find(free_.begin(), free_.end(), static_cast<NodeId>(i)) == free_.end())
        return at + "dead but not on the free list";
      continue;
    }
    if (x.key.size() != x.slots.size()) return at + "key and slots differ in length";
    int64_t child_locks = 0;
    for (auto& [tok, c] : x.children) {
      if (c <= 0 || static_cast<size_t>(c) >= nodes_.size() || !nodes_[c].live)
        return at + "child " + std::to_string(c) + " is not live";
      const Node& y = nodes_[c];
      if (y.parent != static_cast<NodeId>(i)) return at + "child's parent link is wrong";
      if (y.key.empty() || y.key[0] != tok) return at + "child keyed by the wrong token";
      if (y.stamp > x.stamp && i != 0) return at + "child touched later than its parent";
      child_locks += y.lock;
    }
    if (i == 0) continue;
    if (x.key.empty()) return at + "empty key";
    if (x.lock < 0 || (x.lock < child_locks)) return at + "lock count below its children's";
    const Node& p = nodes_[x.parent];
    auto it = p.children.find(x.key[0]);
    if (it == p.children.end() || it->second != static_cast<NodeId>(i))
      return at + "not reachable from its parent";
    total += x.key.size();
    if (x.lock > 0) locked += x.key.size();
  }
  if (total != size_) return "size " + std::to_string(size_) + " != tokens in nodes " +
                             std::to_string(total);
  if (locked != locked_tokens_) return "locked_tokens is off";
  if (size_ > budget_) return "over budget";
  return "";
}

}  // namespace ooze
