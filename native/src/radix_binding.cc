// JS binding of RadixCache (for tests and benchmarks): an ObjectWrap class `RadixCache` whose
// evicted slots collect in a buffer the caller drains with takeEvicted().
#include <napi.h>

#include <memory>
#include <stdexcept>
#include <vector>

#include "radix_cache.h"
#include "registry.h"

namespace {

class RadixCacheWrap : public Napi::ObjectWrap<RadixCacheWrap> {
 public:
  static void Init(Napi::Env env, Napi::Object exports) {
    Napi::Function cls = DefineClass(
        env, "RadixCache",
        {
            InstanceMethod<&RadixCacheWrap::Match>("match"),
            InstanceMethod<&RadixCacheWrap::Insert>("insert"),
            InstanceMethod<&RadixCacheWrap::Lock>("lock"),
            InstanceMethod<&RadixCacheWrap::Unlock>("unlock"),
            InstanceMethod<&RadixCacheWrap::Evict>("evict"),
            InstanceMethod<&RadixCacheWrap::Flush>("flush"),
            InstanceMethod<&RadixCacheWrap::Size>("size"),
            InstanceMethod<&RadixCacheWrap::Budget>("budget"),
            InstanceMethod<&RadixCacheWrap::LockedTokens>("lockedTokens"),
            InstanceMethod<&RadixCacheWrap::HitTokens>("hitTokens"),
            InstanceMethod<&RadixCacheWrap::QueriedTokens>("queriedTokens"),
            InstanceMethod<&RadixCacheWrap::NodeCount>("nodeCount"),
            InstanceMethod<&RadixCacheWrap::Validate>("validate"),
            InstanceMethod<&RadixCacheWrap::TakeEvicted>("takeEvicted"),
        });
    exports.Set("RadixCache", cls);
  }

  explicit RadixCacheWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<RadixCacheWrap>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 1 || !info[0].IsNumber() || info[0].As<Napi::Number>().DoubleValue() < 0) {
      throw Napi::TypeError::New(env, "RadixCache(budgetTokens): budgetTokens must be a number >= 0");
    }
    const size_t budget = static_cast<size_t>(info[0].As<Napi::Number>().DoubleValue());
    cache_ = std::make_unique<ooze::RadixCache>(budget, [this](const int32_t* s, size_t n) {
      evicted_.insert(evicted_.end(), s, s + n);
    });
  }

 private:
  static Napi::Int32Array Tokens(const Napi::CallbackInfo& info, size_t i, const char* what) {
    if (info.Length() <= i || !info[i].IsTypedArray() ||
        info[i].As<Napi::TypedArray>().TypedArrayType() != napi_int32_array) {
      throw Napi::TypeError::New(info.Env(), std::string("RadixCache: ") + what +
                                                 " must be an Int32Array");
    }
    return info[i].As<Napi::Int32Array>();
  }

  static int32_t NodeArg(const Napi::CallbackInfo& info, const char* what) {
    if (info.Length() < 1 || !info[0].IsNumber()) {
      throw Napi::TypeError::New(info.Env(), std::string("RadixCache.") + what +
                                                 "(node): node must be a number");
    }
    return info[0].As<Napi::Number>().Int32Value();
  }

  static Napi::Int32Array ToArray(Napi::Env env, const std::vector<int32_t>& v) {
    Napi::Int32Array a = Napi::Int32Array::New(env, v.size());
    std::copy(v.begin(), v.end(), a.Data());
    return a;
  }

  Napi::Value Match(const Napi::CallbackInfo& info) {
    Napi::Int32Array t = Tokens(info, 0, "tokens");
    ooze::RadixCache::Match m = cache_->match(t.Data(), t.ElementLength());
    Napi::Object o = Napi::Object::New(info.Env());
    o.Set("length", Napi::Number::New(info.Env(), static_cast<double>(m.length)));
    o.Set("slots", ToArray(info.Env(), m.slots));
    o.Set("node", Napi::Number::New(info.Env(), m.node));
    return o;
  }

  Napi::Value Insert(const Napi::CallbackInfo& info) {
    Napi::Int32Array t = Tokens(info, 0, "tokens");
    Napi::Int32Array s = Tokens(info, 1, "slots");
    if (t.ElementLength() != s.ElementLength()) {
      throw Napi::RangeError::New(info.Env(), "RadixCache.insert: tokens and slots differ in length");
    }
    ooze::RadixCache::NodeId node = 0;
    size_t cached = cache_->insert(t.Data(), s.Data(), t.ElementLength(), &node);
    Napi::Object o = Napi::Object::New(info.Env());
    o.Set("cached", Napi::Number::New(info.Env(), static_cast<double>(cached)));
    o.Set("node", Napi::Number::New(info.Env(), node));
    return o;
  }

  Napi::Value Lock(const Napi::CallbackInfo& info) {
    try {
      cache_->lock(NodeArg(info, "lock"));
    } catch (const std::exception& e) {
      throw Napi::Error::New(info.Env(), e.what());
    }
    return info.Env().Undefined();
  }

  Napi::Value Unlock(const Napi::CallbackInfo& info) {
    try {
      cache_->unlock(NodeArg(info, "unlock"));
    } catch (const std::exception& e) {
      throw Napi::Error::New(info.Env(), e.what());
    }
    return info.Env().Undefined();
  }

  Napi::Value Evict(const Napi::CallbackInfo& info) {
    if (info.Length() < 1 || !info[0].IsNumber()) {
      throw Napi::TypeError::New(info.Env(), "RadixCache.evict(nTokens): nTokens must be a number");
    }
    double n = info[0].As<Napi::Number>().DoubleValue();
    return Napi::Number::New(info.Env(),
                             static_cast<double>(cache_->evict(n <= 0 ? 0 : static_cast<size_t>(n))));
  }

  Napi::Value Flush(const Napi::CallbackInfo& info) {
    return Napi::Boolean::New(info.Env(), cache_->flush());
  }
  Napi::Value Size(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), static_cast<double>(cache_->size()));
  }
  Napi::Value Budget(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), static_cast<double>(cache_->budget()));
  }
  Napi::Value LockedTokens(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), static_cast<double>(cache_->locked_tokens()));
  }
  Napi::Value HitTokens(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), static_cast<double>(cache_->hit_tokens()));
  }
  Napi::Value QueriedTokens(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), static_cast<double>(cache_->queried_tokens()));
  }
  Napi::Value NodeCount(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), static_cast<double>(cache_->node_count()));
  }
  Napi::Value Validate(const Napi::CallbackInfo& info) {
    return Napi::String::New(info.Env(), cache_->validate());
  }
  Napi::Value TakeEvicted(const Napi::CallbackInfo& info) {
    Napi::Int32Array a = ToArray(info.Env(), evicted_);
    evicted_.clear();
    return a;
  }

  std::vector<int32_t> evicted_;
  std::unique_ptr<ooze::RadixCache> cache_;
};

void init_radix(Napi::Env env, Napi::Object exports) { RadixCacheWrap::Init(env, exports); }

}  // namespace

OOZE_REGISTER(radix_cache, init_radix);
