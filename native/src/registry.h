// Self-registration of addon modules: each module's .cc defines one static OOZE_REGISTER(name, fn)
// and addon.cc calls every registered init function, so adding a module never edits a shared file.
#pragma once
#include <napi.h>
#include <vector>

namespace ooze {

using InitFn = void (*)(Napi::Env env, Napi::Object exports);

inline std::vector<std::pair<const char*, InitFn>>& registry() {
  static std::vector<std::pair<const char*, InitFn>> r;
  return r;
}

struct Registrar {
  Registrar(const char* name, InitFn fn) { registry().emplace_back(name, fn); }
};

}  // namespace ooze

#define OOZE_REGISTER(name, fn) static ::ooze::Registrar ooze_registrar_##name(#name, fn)
