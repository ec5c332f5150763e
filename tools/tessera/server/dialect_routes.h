// The routes of the API dialects (dialect.h) on the HTTP server: Anthropic's POST
// /v1/messages and /v1/messages/count_tokens, OpenAI's POST /v1/responses. One
// generation loop serves them with the server's guarantees: 503 while loading,
// draining or when the queue is full, cancellation when the client goes away, the
// metrics' counters.
#pragma once

namespace httplib {
class Server;
}

namespace tessera::server {

class HttpApi;
void install_dialect_routes(httplib::Server& server, const HttpApi& api);

}  // namespace tessera::server
