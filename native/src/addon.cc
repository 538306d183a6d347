// Entry point of the ooze native addon: calls every module registered with OOZE_REGISTER and
// exports `modules` (their names) so the loader can tell what this build contains.
#include <napi.h>
#include "registry.h"

static Napi::Object Init(Napi::Env env, Napi::Object exports) {
  Napi::Array names = Napi::Array::New(env);
  uint32_t i = 0;
  for (auto& [name, fn] : ooze::registry()) {
    fn(env, exports);
    names.Set(i++, Napi::String::New(env, name));
  }
  exports.Set("modules", names);
  return exports;
}

NODE_API_MODULE(ooze_native, Init)
