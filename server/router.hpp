// Router mode: llm-server started without -m serves several models behind one port, each in a child
// process of its own (this binary, on loopback, with the router's arguments plus the model's preset),
// as llama-server's router does. Models come from --models-dir (every *.gguf, named by its stem) and
// --models-preset FILE.ini (a section per model, keys are long flag names, `model = PATH`; `[*]` holds
// defaults for every section). Requests are routed by the body's "model" (POST) or ?model= (GET) and
// proxied, streaming included; a model not running is started first (--models-autoload, on by
// default; ?autoload= per request), and with --models-max N loaded the least recently used one is
// stopped first. A child that dies (crash, out of memory, SIGKILL) leaves the model `failed` with the
// reason; the router and the other models go on, and the next request for it starts it again.
// /models and /v1/models list every model with its status; POST /models/load and /models/unload.
#pragma once
#include "args.hpp"

namespace srv {

bool wants_router(const Options& o);  // no -m, and --models-dir or --models-preset
int run_router(const Options& o, int argc, char** argv);

}  // namespace srv
