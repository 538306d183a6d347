{
  "targets": [
    {
      "target_name": "ooze_native",
      "sources": ["<!@(node -e \"const fs=require('fs');console.log(fs.readdirSync('src').filter(f=>f.endsWith('.cc')).map(f=>'src/'+f).join(' '))\")"],
      "include_dirs": ["<!@(node -p \"require('node-addon-api').include\")"],
      "defines": ["NAPI_VERSION=8", "NAPI_CPP_EXCEPTIONS", "NODE_ADDON_API_DISABLE_DEPRECATED"],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions", "-fno-rtti"],
      "cflags_cc": ["-std=c++17", "-O3", "-march=x86-64-v3", "-mtune=native", "-fopenmp", "-ffp-contract=fast", "-fno-math-errno"],
      "ldflags": ["-fopenmp"],
      "libraries": ["-lpthread"]
    }
  ]
}
