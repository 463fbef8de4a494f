// llm-server's HTTP mode: its lifecycle. Threads: http::Server runs an accept loop and one thread per
// connection; one scheduler thread owns the llm::Context (which is not thread-safe). A handler (api.cpp)
// validates its request, tokenizes it (the Vocab is immutable, so any thread may use it) and submits a
// Task; the scheduler answers through the task's Channel, which the handler drains into one JSON body
// or a server-sent-event stream. A client that goes away cancels its task.
#pragma once
#include "args.hpp"

namespace srv {

// Listens (the port is up before the model loads: /health answers 503 meanwhile), loads the model,
// serves until SIGINT/SIGTERM (the first drains in-flight requests within --shutdown-grace, a second
// exits at once). Returns the exit status.
int run_server(const Options& o);

}  // namespace srv
